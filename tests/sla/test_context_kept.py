"""`context_kept` on synthetic sessions (the e2e pair, a server that drops history against the healthy stack,
is tests/e2e/test_workloads.py), an SLA entry's `turns:` selecting the streams a verdict judges, and the
report's per-turn table."""

from __future__ import annotations

from typing import Any

import pytest

import sla
from chaos.execution.verify import judge_entry
from chaos.model.experiment import SlaEntry
from chaos.model.observations import StreamRecord
from chaos.model.turns import parse_turns
from chaos.output.turn_table import render_turn_table, turn_table

pytestmark = pytest.mark.timeout(30)


def turn(synth: Any, session: str, k: int, served: int | None, client: int | None, **kw: Any) -> StreamRecord:
    usage = None if served is None else {"prompt_tokens": served, "completion_tokens": 10}
    record: StreamRecord = synth.stream(f"{session}-t{k}", sent=k * 0.5 + int(session[-1]) * 0.01, session=session,
                                        turn=k, workload="sessions", prompt_tokens=client, usage=usage, **kw)
    return record


def conversation(synth: Any, session: str, served: list[int | None], client: list[int | None]) -> list[StreamRecord]:
    return [turn(synth, session, k, s, c) for k, (s, c) in enumerate(zip(served, client, strict=True), 1)]


def judge(obs: Any, **params: Any) -> Any:
    return sla.judge(obs, "context_kept", params)


def test_a_server_that_keeps_the_history_passes(synth: Any) -> None:
    streams = (conversation(synth, "0-s1", [40, 95, 150], [30, 80, 130])
               + conversation(synth, "0-s2", [35, 90], [None, None]))  # no tokenizer: growth only
    verdict = judge(synth.obs(streams))
    assert verdict.status == "pass", verdict.evidence
    assert verdict.evidence["judged_turns"] == 3 and verdict.evidence["with_client_count"] == 2


def test_a_prompt_below_the_share_the_client_sent_fails(synth: Any) -> None:
    # the last user message only: the server counts 31 where the client sent 130 of history
    verdict = judge(synth.obs(conversation(synth, "0-s1", [40, 95, 31], [30, 80, 130])))
    assert verdict.status == "fail" and verdict.figure == 1.0
    assert verdict.evidence["below_min_share"] == 1 and verdict.evidence["not_grown"] == 1
    assert verdict.evidence["offenders"][0]["id"] == "0-s1-t3"
    assert "lost its history" in verdict.evidence["reason"]


def test_without_a_client_count_a_prompt_that_does_not_grow_fails(synth: Any) -> None:
    verdict = judge(synth.obs(conversation(synth, "0-s1", [40, 38, 45], [None, None, None])))
    assert verdict.status == "fail" and verdict.evidence["not_grown"] == 1
    assert verdict.evidence["offenders"][0]["turn_before_prompt_tokens"] == 40


def test_min_share_is_the_users_to_set(synth: Any) -> None:
    obs = synth.obs(conversation(synth, "0-s1", [40, 70], [30, 80]))  # 70 of 80: 87.5%
    assert judge(obs).status == "fail"
    assert judge(obs, min_share="80%").status == "pass"


def test_no_usage_or_no_sessions_is_inconclusive_and_says_why(synth: Any) -> None:
    verdict = judge(synth.obs(conversation(synth, "0-s1", [None, None], [30, 80])))
    assert verdict.status == "inconclusive" and "carried usage.prompt_tokens" in verdict.evidence["reason"]
    verdict = judge(synth.obs([synth.stream("0-1"), synth.stream("0-2")]))
    assert verdict.status == "inconclusive" and "multi-turn load" in verdict.evidence["reason"]


def test_turns_select_the_streams_an_entry_judges(synth: Any) -> None:
    # turn 1 answered fast, later turns slow (a long history's prefill): a TTFT budget on turns 2+ sees only them
    streams = [turn(synth, f"0-s{i}", k, 10 * k, None, ttft=0.05 if k == 1 else 0.4) for i in range(30)
               for k in (1, 2, 3)]
    obs = synth.obs(streams)
    spec = sla.spec_for("ttft", {"budget": "200ms", "quantile": 0.5})
    first = judge_entry(SlaEntry(name="t1", spec=spec, turns=parse_turns([1])), obs, None)
    later = judge_entry(SlaEntry(name="t2", spec=spec, turns=parse_turns("2+")), obs, None)
    every = judge_entry(SlaEntry(name="all", spec=spec), obs, None)
    assert (first.samples, later.samples, every.samples) == (30, 60, 90)
    assert first.status == "pass" and later.status == "fail"
    assert later.evidence["turns"] == "2+" and "turns" not in every.evidence


def test_turns_from_2_on_still_hold_each_turn_against_its_turn_before(synth: Any) -> None:
    """`turns: 2+` judges turns 2 and later, but a turn's growth is measured against turn 1, which the entry
    does not judge: it must still be there to compare with (it was dropped with the judged streams once, and
    a turn 2 served 10 tokens after a turn 1 of 500 passed)."""
    obs = synth.obs(conversation(synth, "0-s1", [500, 10], [None, None]))
    spec = sla.spec_for("context_kept", {})
    every = judge_entry(SlaEntry(name="all", spec=spec), obs, None)
    later = judge_entry(SlaEntry(name="later", spec=spec, turns=parse_turns("2+")), obs, None)
    assert every.status == "fail" and later.status == "fail", (every.evidence, later.evidence)
    assert later.evidence["offenders"][0]["turn_before_prompt_tokens"] == 500


def test_a_turn_with_nothing_to_hold_it_against_is_not_judged(synth: Any) -> None:
    # no tokenizer (no client count) and a turn 1 that sent no usage: turn 2's 10 tokens cannot be judged
    verdict = judge(synth.obs(conversation(synth, "0-s1", [None, 10], [None, None])))
    assert verdict.status == "inconclusive" and verdict.samples == 0, verdict.evidence
    assert verdict.evidence["uncompared"] == 1 and "could be compared" in verdict.evidence["reason"]
    # beside a turn that could be: only that one is judged
    streams = conversation(synth, "0-s1", [None, 10], [None, None]) + conversation(synth, "0-s2", [40, 90],
                                                                                  [None, None])
    verdict = judge(synth.obs(streams))
    assert verdict.status == "pass" and verdict.samples == 1 and verdict.evidence["uncompared"] == 1


def test_the_per_turn_table(synth: Any) -> None:
    streams = [turn(synth, f"0-s{i}", k, 10 * k, None, ttft=0.1 * k) for i in range(4) for k in (1, 2)]
    streams.append(turn(synth, "0-s9", 2, None, None, ttft=None, error=None, status=500))
    rows = turn_table(synth.obs(streams, phases=[synth.phase("load", 0.0, 10.0)]))
    assert rows is not None
    assert [(r["phase"], r["turn"], r["streams"]) for r in rows] == [("load", 1, 4), ("load", 2, 5)]
    assert rows[0]["ttft_p50_s"] == pytest.approx(0.1) and rows[1]["ttft_p99_s"] == pytest.approx(0.2)
    assert rows[0]["completed_share"] == 1.0 and rows[1]["completed_share"] == 0.8
    assert "<td>2</td><td>5</td>" in render_turn_table(rows)
    assert turn_table(synth.obs([synth.stream("0-1")], phases=[synth.phase("load", 0.0, 1.0)])) is None
