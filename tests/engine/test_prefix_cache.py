"""Prefix caching in the engine: a hit skips the cached tokens' prefill and changes no output token;
the counters say how many prompt tokens were looked up and served from the cache."""

from __future__ import annotations

import random

from chaos.stack.engine import Engine, SamplingParams

GREEDY = SamplingParams(max_tokens=16, ignore_eos=True)


def _ids(eng: Engine, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(300, eng.vocab_size) for _ in range(n)]


def _idle_without_leak(eng: Engine) -> None:
    assert eng.wait_idle(10)
    s = eng.stats()
    assert s.kv_blocks_used == 0 and s.leaks_total == 0 and eng.invariant_violations == 0
    eng.bm.check(full=True)


def test_the_same_prompt_twice_hits_and_gives_the_same_tokens(engine_factory, run_all):
    eng = engine_factory(block_size=16)
    prompt = _ids(eng, 100, 1)  # 6 full blocks + 4 tokens
    first = run_all(eng, [("a", prompt, GREEDY)])
    second = run_all(eng, [("b", prompt, GREEDY)])
    assert second.tokens("b") == first.tokens("a")
    assert first.final("a").cached_tokens == 0 and second.final("b").cached_tokens == 96
    s = eng.stats()
    assert (s.prefix_cache_queries_total, s.prefix_cache_hits_total) == (200, 96)
    assert s.prompt_tokens_total == 200  # vllm:prompt_tokens still counts every prompt token
    # the freed blocks stay cached: free (not used), evictable
    assert s.kv_blocks_cached > 0 and s.kv_blocks_used == 0
    _idle_without_leak(eng)


def test_shared_prefix_with_different_suffixes_matches_an_engine_without_the_cache(engine_factory, run_all):
    cached = engine_factory(block_size=16)
    plain = engine_factory(block_size=16, prefix_caching=False)
    system = _ids(cached, 160, 2)  # 10 full blocks shared
    reqs = [(f"r{i}", system + _ids(cached, 20 + 7 * i, 100 + i), GREEDY) for i in range(6)]
    warm = run_all(cached, reqs[:1])
    rest = run_all(cached, reqs[1:])  # five at once, each hitting the first one's 10 blocks
    ref = run_all(plain, reqs)
    assert warm.tokens("r0") == ref.tokens("r0")
    for rid, _, _ in reqs[1:]:
        assert rest.final(rid).cached_tokens == 160
        assert rest.tokens(rid) == ref.tokens(rid), rid
    s = cached.stats()
    queried = sum(len(p) for _, p, _ in reqs)
    assert s.prefix_cache_queries_total == queried and s.prefix_cache_hits_total == 5 * 160
    assert plain.stats().prefix_cache_queries_total == 0 and plain.stats().kv_blocks_cached == 0
    _idle_without_leak(cached)
    _idle_without_leak(plain)


def test_sampled_outputs_are_the_same_with_and_without_a_hit(engine_factory, run_all):
    eng = engine_factory(block_size=16)
    prompt = _ids(eng, 70, 3)
    params = SamplingParams(max_tokens=24, temperature=0.9, seed=11, ignore_eos=True)
    a = run_all(eng, [("a", prompt, params)]).tokens("a")
    b = run_all(eng, [("b", prompt, params)])
    assert b.final("b").cached_tokens == 64 and b.tokens("b") == a


def test_a_long_prompt_is_prefilled_in_chunks_with_the_same_output(engine_factory, run_all):
    """max_num_batched_tokens 64: a 300-token prompt takes five steps of prefill before its first token."""
    chunked = engine_factory(max_num_batched_tokens=64, prefix_caching=False)
    whole = engine_factory(prefix_caching=False)
    prompt = _ids(chunked, 300, 4)
    a = run_all(chunked, [("a", prompt, GREEDY)])
    b = run_all(whole, [("b", prompt, GREEDY)])
    assert a.tokens("a") == b.tokens("b")
    assert chunked.stats().steps_total >= 5 + GREEDY.max_tokens - 1
    _idle_without_leak(chunked)


def test_preempted_requests_recompute_from_their_own_cached_blocks(engine_factory, run_all):
    """A small pool preempts; the preempted request's freed blocks are still cached when it comes back."""
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    big = engine_factory(kv_blocks=512, block_size=4, prefix_caching=False)
    small = engine_factory(kv_blocks=40, block_size=4)
    ps = [_ids(big, 30, 10 + i) for i in range(6)]
    alone = {i: run_all(big, [(f"a{i}", p, params)]).tokens(f"a{i}") for i, p in enumerate(ps)}
    col = run_all(small, [(f"r{i}", p, params) for i, p in enumerate(ps)])
    for i in range(6):
        assert col.tokens(f"r{i}") == alone[i], i
    assert small.stats().num_preemptions > 0
    _idle_without_leak(small)


def test_reset_prefix_cache_empties_it(engine_factory, run_all):
    eng = engine_factory(block_size=16)
    prompt = _ids(eng, 50, 5)
    run_all(eng, [("a", prompt, GREEDY)])
    assert eng.wait_idle(10)
    cached = eng.stats().kv_blocks_cached  # 50 + 16 tokens, 65 computed: 4 full blocks, generated ones too
    assert cached == 4 and eng.reset_prefix_cache() == (4, 0)
    assert eng.stats().kv_blocks_cached == 0
    assert run_all(eng, [("b", prompt, GREEDY)]).final("b").cached_tokens == 0


def test_queue_and_prefill_times_are_observed_per_first_token(engine_factory, run_all):
    eng = engine_factory()
    run_all(eng, [(f"r{i}", _ids(eng, 20, 20 + i), GREEDY) for i in range(3)])
    s = eng.stats()
    assert s.queue_time.count == 3 and s.prefill_time.count == 3
    assert 0 <= s.queue_time.sum < 30 and 0 < s.prefill_time.sum < 30


def test_the_target_key_reaches_the_stack_and_vllm() -> None:
    """``target.prefix_caching`` (default true, as vLLM): false starts the builtin stack with
    --no-prefix-caching and vLLM with --no-enable-prefix-caching."""
    from chaos.experiment import experiment_from_dict
    from chaos.targets.base import serve_args
    from chaos.targets.vllm import vllm_command

    def target(**keys: object) -> object:
        data = {"name": "t", "target": {"kind": "builtin", **keys}, "load": {"concurrency": 1},
                "phases": [{"name": "p", "duration": "1s"}], "sla": [{"kind": "errors", "budget": "0%"}]}
        return experiment_from_dict(data).target

    on, off = target(), target(prefix_caching=False)
    assert on.prefix_caching is True and off.prefix_caching is False  # type: ignore[attr-defined]
    assert "--no-prefix-caching" not in serve_args(on, 1, 0)  # type: ignore[arg-type]
    assert "--no-prefix-caching" in serve_args(off, 1, 0)  # type: ignore[arg-type]
    kw = {"python": "p", "model": "m", "served_name": "m", "port": 1, "device": "cuda", "seed": 0,
          "kv_bytes_token": None}
    assert "--no-enable-prefix-caching" not in vllm_command(on, **kw)  # type: ignore[arg-type]
    assert "--no-enable-prefix-caching" in vllm_command(off, **kw)  # type: ignore[arg-type]
