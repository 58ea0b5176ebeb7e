"""The workload kinds in the load generator, against a real loopback server (chaos.load.mock, which records
every request body): sessions resend their history with the text really received, a cut turn resumes or
ends its session, shared prefixes are shared exactly, a Mooncake trace goes out at its timestamps, and
what can be pure of the seed is."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from chaos.load.generator import LoadGenerator
from chaos.load.mock import ThreadedMockServer
from chaos.load.workload import LoadSettings, LoadTarget, PromptSettings, Workload
from chaos.load.workloads import WorkloadSettings
from chaos.load.workloads.sessions import MAX_RESENDS, SyntheticSessions
from chaos.model.client_rules import DisconnectRule
from chaos.model.context import ClientPolicy
from chaos.model.observations import StreamRecord
from chaos.model.request_ids import record_id_of

pytestmark = pytest.mark.timeout(30)  # asyncio_mode auto: the async tests run on a loop
S = 1_000_000_000
PROMPTS = PromptSettings(min_chars=8, max_chars=40, mix=(("ascii", 0.6), ("cjk", 0.4)))
BUILTIN = ("builtin", "tiny")


def sessions(**over: Any) -> WorkloadSettings:
    return WorkloadSettings(**{"kind": "sessions", "turns": (3, 3), **over})


async def drive(server: ThreadedMockServer, spec: LoadSettings, seconds: float = 1.0,
                policy: ClientPolicy | None = None) -> tuple[list[StreamRecord], LoadGenerator]:
    records: list[StreamRecord] = []
    gen = LoadGenerator(spec, LoadTarget(server.base_url, "m", 5), policy=policy or ClientPolicy(), sink=records.append)
    gen.phase = "p"
    await gen.run(time.monotonic_ns() + int(seconds * S))
    await gen.drain(10)
    await gen.aclose()
    return records, gen


def bodies(server: ThreadedMockServer) -> dict[str, dict[str, Any]]:
    """Each request's body by its record id (the mock records the UUID-shaped X-Request-Id it was sent with)."""
    return {record_id_of(r.id): r.body for r in server.requests}


def by_session(records: list[StreamRecord]) -> dict[str, list[StreamRecord]]:
    out: dict[str, list[StreamRecord]] = defaultdict(list)
    for r in sorted(records, key=lambda r: r.t_sent or 0):
        assert r.session is not None
        out[r.session].append(r)
    return out


async def test_each_turn_resends_the_history_with_the_text_received(mock_server: ThreadedMockServer) -> None:
    spec = LoadSettings(endpoint="chat", concurrency=2, max_tokens=(3, 6), prompts=PROMPTS, request_timeout=10,
                        workload=sessions(system_chars=30, think_time=(0.02, 0.02)))
    records, gen = await drive(mock_server, spec)
    sent = bodies(mock_server)
    assert gen.stats()["sessions"] >= 2
    full = [turns for turns in by_session(records).values() if len(turns) == 3]
    assert full, records
    for turns in full:
        assert [r.turn for r in turns] == [1, 2, 3] and {r.workload for r in turns} == {"sessions"}
        first = sent[turns[0].id]["messages"]
        assert first[0]["role"] == "system" and len(first[0]["content"]) == 30 and first[1]["role"] == "user"
        for before, after in zip(turns, turns[1:], strict=False):
            previous, now = sent[before.id]["messages"], sent[after.id]["messages"]
            # the whole history, then the assistant's text as the client received it, then a new user message
            assert now[:len(previous)] == previous
            assert now[len(previous)] == {"role": "assistant", "content": before.text} and before.text
            assert now[-1]["role"] == "user" and now[-1] != previous[-1] and len(now) == len(previous) + 2
            # the next turn is scheduled when the think time after the reply ended: its send is late by little
            assert after.t_scheduled == before.t_end + int(0.02 * S)  # type: ignore[operator]
            assert 0 <= after.t_sent - after.t_scheduled < S  # type: ignore[operator]
    assert all(r.t_scheduled is None for r in records if r.turn == 1)  # closed loop: a slot starts it at once


async def test_a_completions_session_sends_its_history_as_one_transcript(mock_server: ThreadedMockServer) -> None:
    spec = LoadSettings(endpoint="completions", concurrency=1, max_tokens=(2, 2), prompts=PROMPTS,
                        workload=sessions(turns=(2, 2)), max_requests=2)
    records, _ = await drive(mock_server, spec)
    sent = bodies(mock_server)
    one, two = sorted(records, key=lambda r: r.turn or 0)
    assert sent[one.id]["prompt"].startswith("User: ") and sent[one.id]["prompt"].endswith("\nAssistant:")
    assert sent[two.id]["prompt"].startswith(sent[one.id]["prompt"] + " " + one.text + "\nUser: ")


@pytest.mark.parametrize("on_cut", ["resume", "end"])
async def test_a_cut_turn_resumes_or_ends_its_session(mock_server: ThreadedMockServer, on_cut: str) -> None:
    """A client that hangs up after 2 tokens on half the requests (the disconnect fault's client rule)."""
    policy = ClientPolicy(rules={"cut": DisconnectRule("cut", 0.5, after_tokens=(2, 2))})
    spec = LoadSettings(endpoint="chat", concurrency=3, max_tokens=(6, 6), prompts=PROMPTS, request_timeout=10,
                        workload=sessions(on_cut=on_cut))
    records, _ = await drive(mock_server, spec, policy=policy)
    sent = bodies(mock_server)
    cut = [r for r in records if r.hangup is not None]
    assert cut and len(cut) < len(records)
    for turns in by_session(records).values():
        for i, r in enumerate(turns):
            if r.hangup is None or i + 1 == len(turns):
                continue
            after = turns[i + 1]
            if on_cut == "end":
                raise AssertionError(f"session {r.session} went on after its cut turn {r.id}: {after.id}")
            # resumed: the same turn again, the same messages (the lost reply is not in them)
            assert after.turn == r.turn and after.id.startswith(f"{r.session}-t{r.turn}-r")
            assert sent[after.id]["messages"] == sent[r.id]["messages"]
    resends = [r for r in records if "-r" in r.id.rsplit("-t", 1)[1]]
    if on_cut == "resume":
        assert resends and all(int(r.id.rsplit("-r", 1)[1]) <= MAX_RESENDS for r in resends)
    else:
        assert not resends


async def test_open_loop_sessions_arrive_at_the_rate(mock_server: ThreadedMockServer) -> None:
    spec = LoadSettings(endpoint="chat", concurrency=None, rate=20.0, max_tokens=(2, 2), prompts=PROMPTS,
                        workload=sessions(turns=(2, 2)))
    records, gen = await drive(mock_server, spec, seconds=1.0)
    firsts = [r for r in records if r.turn == 1]
    assert 5 <= gen.stats()["sessions"] <= 45  # 20 expected; a Poisson count, wide margins
    assert all(r.t_scheduled is not None for r in firsts)  # an arrival's first turn keeps its schedule
    assert any(r.turn == 2 for r in records)


def test_sessions_are_pure_of_the_seed() -> None:
    def scripts(seed: int) -> list[tuple[int, list[str], list[int], list[float]]]:
        source = SyntheticSessions(sessions(turns=(1, 9), think_time=(0.1, 3.0)), seed=seed, worker_index=1,
                                   chars=(5, 50), mix=(("ascii", 1.0),), max_tokens=(1, 99))
        out = []
        for k in range(20):
            s = source.session(k)
            out.append((s.turns, [s.user(t) for t in range(1, s.turns + 1)],
                        [s.max_tokens(t) for t in range(1, s.turns + 1)], [s.think_s(t, 0) for t in range(2, 5)]))
        return out

    assert scripts(3) == scripts(3)
    assert scripts(3) != scripts(4)
    assert len({n for n, *_ in scripts(3)}) > 3  # turns drawn per session
    users = [u for _, us, _, _ in scripts(3) for u in us]
    assert len(set(users)) == len(users)


def test_single_requests_are_bit_for_bit_what_they_were_before_workload_kinds() -> None:
    """The digest of 200 single-kind bodies as the generator made them before this change (same code as
    /tmp's check at the commit before): the default kind changed nothing a run sends."""
    digest = hashlib.sha256()
    for endpoint in ("completions", "chat"):
        spec = LoadSettings(endpoint=endpoint, max_tokens=(4, 64), prompts=PromptSettings(
            min_chars=8, max_chars=300, mix=(("ascii", 0.5), ("cjk", 0.3), ("emoji", 0.2))))
        for worker in (0, 3):
            workload = Workload(spec, model="m", seed=7, worker_index=worker)
            for n in range(50):
                digest.update(json.dumps(workload.request(n)[0], ensure_ascii=False).encode())
    assert digest.hexdigest() == "e508201c33804026cfbff30eae26e74098118ca7d585e942d1c92641db5a3b79"


def test_chat_bodies_carry_tools_tool_choice_and_the_reasoning_switch() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    spec = LoadSettings(endpoint="chat", tools=(tool,), tool_choice="required", reasoning=False)
    body, _ = Workload(spec, model="m", seed=1).request(0)
    assert body["tools"] == [tool] and body["tool_choice"] == "required"
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    plain, _ = Workload(LoadSettings(endpoint="chat"), model="m", seed=1).request(0)
    assert {k: v for k, v in body.items() if k not in ("tools", "tool_choice", "chat_template_kwargs")} == plain


def test_shared_prefix_requests_share_exactly_their_prefix_in_the_targets_tokens() -> None:
    from chaos.load.workloads import load_tokenizer

    settings = WorkloadSettings(kind="shared_prefix", prefixes=3, prefix_tokens=300, suffix_chars=(10, 30),
                                tokenizer=BUILTIN)
    spec = LoadSettings(endpoint="completions", workload=settings)
    tok = load_tokenizer(settings)
    assert tok is not None
    workers = [Workload(spec, model="m", seed=2, worker_index=w) for w in (0, 1)]
    made = [w.request(n) for w in workers for n in range(30)]
    again = [Workload(spec, model="m", seed=2, worker_index=1).request(n) for n in range(30)]
    assert made[30:] == again  # pure of (seed, worker, n), whatever was made before
    assert {prompt.group for _, prompt in made} == {0, 1, 2}
    texts = {g: workers[0].shared_prefix().prefix(g)[0] for g in range(3)}
    assert texts == {g: workers[1].shared_prefix().prefix(g)[0] for g in range(3)}  # every worker's the same
    assert all(len(tok.encode(t)) == 300 for t in texts.values())  # exactly L tokens, in the target's tokenizer
    suffixes = []
    for body, prompt in made:
        prefix = texts[prompt.group]  # type: ignore[index]
        assert body["prompt"].startswith(prefix)
        suffixes.append(body["prompt"][len(prefix):])
        assert prompt.tokens == len(tok.encode(body["prompt"]))  # its count is the target's count
    assert len(set(suffixes)) == len(suffixes)  # the rest is each request's own
    assert len(set(texts.values())) == 3


async def test_a_mooncake_trace_goes_out_at_its_timestamps(mock_server: ThreadedMockServer, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    lines = [{"timestamp": t, "input_length": 40 + t // 10, "output_length": 2 + i, "hash_ids": [0]}
             for i, t in enumerate((0, 100, 250, 400, 410, 600))]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    settings = WorkloadSettings(kind="trace", path=str(trace), speed=2.0, tokenizer=BUILTIN)
    spec = LoadSettings(endpoint="completions", concurrency=None, rate=None, workload=settings)
    records, gen = await drive(mock_server, spec, seconds=2.0)
    records.sort(key=lambda r: r.t_scheduled or 0)
    assert [r.max_tokens for r in records] == [line["output_length"] for line in lines]
    assert [r.prompt_tokens for r in records] == [line["input_length"] for line in lines]
    t0 = records[0].t_scheduled
    assert [r.t_scheduled - t0 for r in records] == [t * 1_000_000 // 2 for t in (0, 100, 250, 400, 410, 600)]  # type: ignore[operator]
    assert all(0 <= r.t_sent - r.t_scheduled < S // 2 for r in records)  # type: ignore[operator]
    assert {r.workload for r in records} == {"trace"} and gen.stats()["sent"] == 6
    # two processes replay it together: each its every other request, on the same clock
    shares = [Workload(LoadSettings(workload=settings, workers=2), model="m", seed=5, worker_index=i).replay()
              for i in (0, 1)]
    assert [len(s) for s in shares] == [3, 3]
    assert [shares[i % 2].offset_ns(i // 2) for i in range(6)] == [t * 500_000 for t in (0, 100, 250, 400, 410, 600)]


async def test_a_sharegpt_trace_replays_its_conversations_as_sessions(mock_server: ThreadedMockServer) -> None:
    path = Path(__file__).resolve().parents[2] / "experiments" / "traces" / "sample-sharegpt.json"
    settings = WorkloadSettings(kind="trace", layout="sharegpt", path=str(path), max_output_tokens=5,
                                tokenizer=BUILTIN)
    spec = LoadSettings(endpoint="chat", concurrency=2, max_tokens=(1, 1), workload=settings)
    records, _ = await drive(mock_server, spec, seconds=0.8)
    sent = bodies(mock_server)
    assert records and {r.workload for r in records} == {"trace"}
    assert all(1 <= r.max_tokens <= 5 for r in records)  # each answer's length in tokens, capped
    first = [r for r in records if r.id == "0-s0-t1"]
    assert first and sent["0-s0-t1"]["messages"][-1]["content"].startswith("How long should I rest bread dough")
    second = sent.get("0-s0-t2")
    if second is not None:  # the sample's first conversation has two user turns
        assert second["messages"][1] == {"role": "assistant", "content": first[0].text}


async def test_the_session_load_stops_at_max_requests(mock_server: ThreadedMockServer) -> None:
    spec = LoadSettings(endpoint="chat", concurrency=3, max_tokens=(2, 2), workload=sessions(turns=(4, 4)),
                        max_requests=7)
    records, _ = await drive(mock_server, spec, seconds=5.0)
    assert len(records) == 7


async def test_a_session_slot_backs_off_while_nothing_serves() -> None:
    """Connection refused: every slot waits its backoff before resending (never a tight loop)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    records: list[StreamRecord] = []
    spec = LoadSettings(endpoint="chat", concurrency=2, max_tokens=(2, 2), workload=sessions(),
                        connect_backoff=(0.2, 0.4, 2.0))
    gen = LoadGenerator(spec, LoadTarget(f"http://127.0.0.1:{port}/v1", "m", 1), policy=ClientPolicy(),
                        sink=records.append)
    await gen.run(time.monotonic_ns() + int(1.0 * S))
    await gen.drain(2)
    await gen.aclose()
    await asyncio.sleep(0)
    assert records and all(r.error is not None and r.error.kind == "connect" for r in records)
    assert len(records) <= 2 * 6 and gen.connect_backoffs >= 2


async def test_conversations_too_long_for_the_context_are_cut_short_never_spun_on(
        mock_server: ThreadedMockServer) -> None:
    path = Path(__file__).resolve().parents[2] / "experiments" / "traces" / "sample-sharegpt.json"
    settings = WorkloadSettings(kind="trace", layout="sharegpt", path=str(path), tokenizer=BUILTIN, context_tokens=12)
    spec = LoadSettings(endpoint="chat", concurrency=2, max_tokens=(1, 1), workload=settings)
    start = time.monotonic()
    records, gen = await drive(mock_server, spec, seconds=3.0)
    assert not records and gen.stats()["sessions_trimmed"] >= 256  # no turn fits 12 tokens: every one is skipped
    assert time.monotonic() - start < 2.5  # each slot stopped once nothing could be sent, before the deadline


async def test_a_think_time_past_the_deadline_starts_no_new_session(mock_server: ThreadedMockServer) -> None:
    """A session whose next turn is due after sending stops waits it out: its slot must not start another
    session, whose first turn has no think time (the bug: with 1,000 sessions the last think time filled
    with first turns, 100 a second became 1,900). Here 20 slots, 5 s think times, a 1.5 s run: each slot's
    first session sends turn 1, then thinks past the deadline; nothing else goes out."""
    spec = LoadSettings(endpoint="chat", concurrency=20, max_tokens=(3, 3), prompts=PROMPTS, request_timeout=10,
                        workload=sessions(turns=(4, 4), think_time=(5.0, 5.0)))
    records, gen = await drive(mock_server, spec, seconds=1.5)
    assert gen.stats()["sessions"] == 20, gen.stats()
    assert sorted(r.turn for r in records) == [1] * 20
