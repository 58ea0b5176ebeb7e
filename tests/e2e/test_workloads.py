"""The workload kinds against the real builtin stack (a process on loopback): sessions resend their history
and the server counts it, prompts made to a length in the target's tokens are that length as the server
counts them, and `context_kept` fails a server that drops a conversation's history
(tests/e2e/planted_history.py) while the healthy stack passes the same experiment."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.api import run
from chaos.experiment import experiment_from_dict
from chaos.load.generator import LoadGenerator
from chaos.load.workload import LoadSettings, LoadTarget, PromptSettings
from chaos.load.workloads import WorkloadSettings, load_tokenizer
from chaos.model.context import ClientPolicy
from chaos.model.observations import StreamRecord
from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).parent
S = 1_000_000_000
BUILTIN = ("builtin", "tiny")


@pytest.fixture(scope="module")
def stack() -> Iterator[StackProcess]:
    """One healthy builtin stack for the load-level tests."""
    process = StackProcess.start("--max-model-len", "2048", "--kv-blocks", "1024", timeout=60)
    yield process
    process.close()


class _Spy(LoadGenerator):
    """The generator, keeping each session turn's body as sent (what the server was asked)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bodies: dict[str, dict[str, Any]] = {}

    def send_turn(self, request_id: str, body: dict[str, Any], record_of: Callable[[StreamRecord], None],
                  chars: int, t_scheduled: int | None, t_ready: int | None) -> asyncio.Task[StreamRecord]:
        self.bodies[request_id] = body
        return super().send_turn(request_id, body, record_of, chars, t_scheduled, t_ready)


async def drive(url: str, spec: LoadSettings, seconds: float) -> tuple[list[StreamRecord], _Spy]:
    records: list[StreamRecord] = []
    gen = _Spy(spec, LoadTarget(url, "tiny", 11), policy=ClientPolicy(), sink=records.append)
    gen.phase = "load"
    await gen.run(time.monotonic_ns() + int(seconds * S))
    await gen.drain(60)  # a saturated CI box may take its time; the streams must end, not be cut
    await gen.aclose()
    return records, gen


async def test_sessions_resend_their_history_and_the_server_counts_it(stack: StackProcess) -> None:
    spec = LoadSettings(endpoint="chat", concurrency=3, max_tokens=(6, 12), request_timeout=30,
                        prompts=PromptSettings(min_chars=16, max_chars=48, mix=(("ascii", 1.0),)),
                        workload=WorkloadSettings(kind="sessions", turns=(3, 3), system_chars=80, tokenizer=BUILTIN))
    records, gen = await drive(stack.base_url, spec, 2.0)
    tok = load_tokenizer(spec.workload)
    assert tok is not None
    by_session: dict[str, dict[int, StreamRecord]] = {}
    for r in records:
        assert r.status == 200 and r.usage is not None, (r.id, r.error)
        by_session.setdefault(r.session or "", {})[r.turn or 0] = r
    full = [turns for turns in by_session.values() if {1, 2, 3} <= set(turns)]
    assert len(full) >= 2
    for turns in full:
        for k in (2, 3):
            before, now = turns[k - 1], turns[k]
            served_before, served = before.usage["prompt_tokens"], now.usage["prompt_tokens"]  # type: ignore[index]
            # the server read the reply the client received and the new user message, on top of the turn before
            assert served >= served_before + len(tok.encode(before.text)), (before.id, served_before, served)
            assert now.prompt_tokens is not None and served >= now.prompt_tokens  # a template only adds tokens
            sent = gen.bodies[now.id]["messages"]
            assert sent[-2] == {"role": "assistant", "content": before.text} and before.text


async def test_prompts_made_in_the_targets_tokens_are_that_long_as_it_counts(stack: StackProcess,
                                                                            tmp_path: Path) -> None:
    prefix = WorkloadSettings(kind="shared_prefix", prefixes=2, prefix_tokens=700, tokenizer=BUILTIN)
    records, _ = await drive(stack.base_url, LoadSettings(concurrency=2, max_tokens=(4, 4), workload=prefix), 1.0)
    assert records and all(r.usage and r.usage["prompt_tokens"] == r.prompt_tokens for r in records), \
        [(r.prompt_tokens, r.usage) for r in records[:5]]
    assert {r.prefix_group for r in records} == {0, 1}
    cached = [(r.usage or {}).get("prompt_tokens_details", {}).get("cached_tokens", 0) for r in records]
    if any(cached):  # an engine with prefix caching reuses the prefix's full 16-token blocks (700 // 16 of them)
        assert max(cached) >= 688, cached
    # a Mooncake trace: exact input lengths, max_tokens its output lengths, equal hash ids equal blocks
    lines = [{"timestamp": 40 * i, "input_length": 520 + 60 * i, "output_length": 4 + i, "hash_ids": [7, 100 + i]}
             for i in range(8)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    trace = WorkloadSettings(kind="trace", path=str(tmp_path / "t.jsonl"), tokenizer=BUILTIN)
    records, _ = await drive(stack.base_url, LoadSettings(concurrency=None, rate=None, workload=trace,
                                                          request_timeout=60), 1.0)
    assert len(records) == 8 and all(r.status == 200 and r.usage for r in records), [(r.id, r.error) for r in records]
    records.sort(key=lambda r: r.t_scheduled or 0)
    assert [r.usage["prompt_tokens"] for r in records] == [line["input_length"] for line in lines]  # type: ignore[index]
    assert [r.usage["completion_tokens"] for r in records] == [line["output_length"] for line in lines]  # type: ignore[index]
    cached = [(r.usage or {}).get("prompt_tokens_details", {}).get("cached_tokens", 0) for r in records[1:]]
    if any(cached):  # block 7 (512 tokens) is every request's first: a prefix cache serves it again
        assert max(cached) >= 512, cached


# ---- context_kept: a server that drops history fails, the healthy stack passes ----------------------------

def experiment(**target: Any) -> dict[str, Any]:
    return {
        "name": "conversations",
        "target": target or {"kind": "builtin"},
        "load": {"endpoint": "chat", "concurrency": 4, "max_tokens": 8,
                 "workload": {"kind": "sessions", "turns": [3, 4], "think_time": "50ms", "system_chars": 64}},
        "phases": [{"name": "baseline", "duration": "3s"}],
        "sla": [{"kind": "context_kept"}, {"kind": "errors", "budget": 0.0}],
    }


def verdicts(data: dict[str, Any], out: Path, url: str | None = None) -> dict[str, Any]:
    result = run(experiment_from_dict(data), target_url=url, out_dir=out, handle_signals=False)
    assert result.exit_code != 4, result.error
    return {v.name or v.sla: v for v in result.verdicts}


SHAREGPT = HERE.parents[1] / "experiments" / "traces" / "sample-sharegpt.json"


def sharegpt_replay(**target: Any) -> dict[str, Any]:
    """The shipped ShareGPT sample replayed as conversations (the trace kind): the same history to keep."""
    data = experiment(**target)
    data["load"] = {"endpoint": "chat", "concurrency": 4, "max_tokens": 8,
                    "workload": {"kind": "trace", "layout": "sharegpt", "path": str(SHAREGPT), "max_output_tokens": 8}}
    return data


def test_a_server_that_drops_history_fails_context_kept_and_the_healthy_stack_passes(tmp_path: Path) -> None:
    planted = StackProcess.start(command=[sys.executable, str(HERE / "planted_history.py"), "--defect",
                                          "drop_history", "--port", "0"], timeout=60)
    try:
        # an openai target: no tokenizer known, so only the turn-over-turn growth can catch it (and does)
        by = verdicts(experiment(kind="openai", model="tiny"), tmp_path / "planted", planted.base_url)
        replayed = verdicts(sharegpt_replay(kind="openai", model="tiny"), tmp_path / "planted-sharegpt",
                            planted.base_url)
    finally:
        planted.close()
    kept = by["context_kept"]
    assert kept.status == "fail", kept.evidence
    assert kept.evidence["not_grown"] >= 5, kept.evidence
    assert by["errors"].status == "pass"  # nothing else looks wrong: every turn streamed to its end
    # a trace replay of recorded conversations catches it the same way
    assert replayed["context_kept"].status == "fail", replayed["context_kept"].evidence
    assert replayed["errors"].status == "pass"
    healthy = verdicts(experiment(), tmp_path / "healthy")  # the builtin target: the client counts its tokens too
    kept = healthy["context_kept"]
    assert kept.status == "pass", kept.evidence
    assert kept.evidence["judged_turns"] >= 10 and kept.evidence["with_client_count"] == kept.evidence["session_turns"]
