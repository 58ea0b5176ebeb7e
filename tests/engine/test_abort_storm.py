"""KV accounting under random abort storms (property-based)."""

from __future__ import annotations

import random
import threading
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaos.stack.engine import Engine, EngineConfig, SamplingParams

ENGINE = None


def _engine() -> Engine:
    global ENGINE
    if ENGINE is None:
        ENGINE = Engine(EngineConfig(device="cpu", kv_blocks=40, block_size=4, max_num_seqs=8,
                                     max_num_batched_tokens=64, max_model_len=128))
        ENGINE.start()
    return ENGINE


def teardown_module(module):
    if ENGINE is not None:
        ENGINE.shutdown()


action = st.tuples(
    st.sampled_from(["add", "abort", "fail", "sleep", "reserve", "release"]),
    st.integers(min_value=0, max_value=11),  # request slot
    st.integers(min_value=1, max_value=30),  # prompt length / max_tokens / ms
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=st.lists(action, min_size=5, max_size=40), seed=st.integers(0, 2**16))
def test_random_adds_and_aborts_leave_no_blocks(actions, seed):
    eng = _engine()
    rng = random.Random(seed)
    lock = threading.Lock()
    finished: dict[str, str] = {}
    invariant_ok = [True]

    def cb(out):
        if out.finished:
            with lock:
                finished[out.request_id] = out.finish_reason
        s = eng.bm
        if s.num_used + s.num_free != s.num_total:
            invariant_ok[0] = False

    added: list[str] = []
    tag = f"{seed}-{time.monotonic_ns()}"
    for kind, slot, n in actions:
        rid = f"{tag}-{slot}"
        if kind == "add" and rid not in added:
            prompt = [rng.randrange(10, 2000) for _ in range(n)]
            params = SamplingParams(max_tokens=rng.randint(1, 40), ignore_eos=True,
                                    temperature=rng.choice([0.0, 0.7]), seed=slot)
            eng.add_request(rid, prompt, params, cb)
            added.append(rid)
        elif kind == "abort":
            eng.abort(rid)
        elif kind == "fail":
            eng.fail(rid, "storm")
        elif kind == "reserve":
            eng.reserve_blocks(n)
        elif kind == "release":
            eng.release_reserved_blocks()
        else:
            time.sleep(n / 1000)
    eng.release_reserved_blocks()
    assert eng.wait_idle(20)
    with lock:
        assert set(finished) == set(added)
        assert set(finished.values()) <= {"stop", "length", "abort", "error"}
    s = eng.stats()
    assert s.kv_blocks_used == 0 and s.kv_blocks_reserved == 0
    assert s.num_running == 0 and s.num_waiting == 0
    assert s.leaks_total == 0, s.leaked_request_ids
    assert invariant_ok[0] and eng.invariant_violations == 0
    eng.bm.check()
