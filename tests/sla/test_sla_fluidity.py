"""`fluidity` on synthetic observations: an early stall and a late one with the same gaps differ."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import sla
from chaos.model.observations import ErrorInfo, StreamRecord
from sla.fluidity import deadlines
from sla.stats import judge_share

pytestmark = pytest.mark.timeout(30)

PARAMS = {"pace": "50ms", "ttft": "500ms", "min_on_time": "95%", "max_missed_run": 5}


def stalled_streams(synth: Any, stall_at: int, n: int = 40, tokens: int = 60) -> list[StreamRecord]:
    """Streams of ``tokens`` content events 20 ms apart after a 100 ms TTFT, one 1.5 s gap at ``stall_at``."""
    gaps = [0.02] * (tokens - 1)
    gaps[stall_at] = 1.5
    return [synth.stream(f"s{i}", sent=i * 0.5, ttft=0.1, tokens=tokens, gaps=gaps) for i in range(n)]


def test_early_stall_fails_late_stall_passes_with_the_same_p90_gap(synth: Any) -> None:
    early = synth.obs(stalled_streams(synth, stall_at=2))
    late = synth.obs(stalled_streams(synth, stall_at=55))
    itl = {"quantile": "p90", "budget": "100ms"}
    # the gap distribution is identical: itl cannot tell them apart
    assert sla.judge(early, "itl", itl).figure == sla.judge(late, "itl", itl).figure == pytest.approx(0.02)
    assert sla.judge(early, "itl", itl).status == sla.judge(late, "itl", itl).status == "pass"
    e = sla.judge(early, "fluidity", PARAMS)
    ll = sla.judge(late, "fluidity", PARAMS)
    # early: slack 400 ms + 2 x 30 ms when the 1.5 s stall hits -> 20 deadlines missed in a row
    assert e.status == "fail"
    assert e.evidence["decided_by"] == "missed_run"
    assert e.figure == 20 and e.budget == 5 and e.unit == "deadlines"
    assert e.evidence["share"] == pytest.approx(59 / 79)
    # late: 400 ms + 55 x 30 ms of slack absorbs it
    assert ll.status == "pass"
    assert ll.figure == 1.0 and ll.evidence["missed"] == 0
    # without the run check the share alone decides the early one too
    share_only = sla.judge(early, "fluidity", {k: v for k, v in PARAMS.items() if k != "max_missed_run"})
    assert share_only.status == "fail" and share_only.evidence["decided_by"] == "share"


def test_deadlines_follow_etalon() -> None:
    ms = 1_000_000
    # TTFT 100 ms against 500 ms (400 ms slack), gaps 20, 20 (60 ms slack more), then 600 ms:
    # misses (600 - 460) // 50 = 2 deadlines, slack resets, then a 60 ms gap misses 1 more
    stamps = [100 * ms, 120 * ms, 140 * ms, 740 * ms, 800 * ms]
    st = StreamRecord(id="x", phase="p", t_sent=0, t_first_content=stamps[0], t_content=stamps, t_end=801 * ms,
                      finish_reason="stop", done_seen=True)
    d = deadlines(st, pace=0.05, ttft=0.5)
    assert d.outcomes == [1, 1, 1, 0, 0, 0]
    assert d.longest_run == 3
    # first token late: 1 + (700 - 500) // 50 = 5 missed
    late_first = StreamRecord(id="y", phase="p", t_sent=0, t_first_content=700 * ms, t_content=[700 * ms],
                              t_end=701 * ms)
    assert deadlines(late_first, pace=0.05, ttft=0.5).outcomes == [0] * 5
    # no ttft allowance: the first token is not judged
    assert deadlines(late_first, pace=0.05, ttft=None).outcomes == []


def test_a_stream_that_times_out_waiting_misses_the_deadlines_that_passed() -> None:
    ms = 1_000_000
    st = StreamRecord(id="t", phase="p", t_sent=0, t_first_content=100 * ms, t_content=[100 * ms], t_end=1100 * ms,
                      error=ErrorInfo("timeout", "no byte"))
    # 400 ms slack after the first token; waited 1000 ms: (1000 - 400) // 50 = 12 missed
    assert deadlines(st, pace=0.05, ttft=0.5).outcomes == [1] + [0] * 12
    never = StreamRecord(id="n", phase="p", t_sent=0, t_end=2000 * ms, error=ErrorInfo("timeout", "no byte"))
    assert deadlines(never, pace=0.05, ttft=0.5).outcomes == [0] * 31


def test_clustered_misses_are_judged_with_a_small_effective_size(synth: Any) -> None:
    # A fifth of the streams stall early for 450 ms: about 6 deadlines missed in a row each, 1.7%
    # of all deadlines. Spread out, that share would clear a 97.5% floor; in runs it is undecided.
    rng = np.random.default_rng(1)
    streams = []
    for i in range(50):
        gaps = [0.01] * 59
        if rng.random() < 0.2:
            gaps[int(rng.integers(1, 5))] = 0.45
        streams.append(synth.stream(f"s{i}", sent=i, ttft=0.05, tokens=60, gaps=gaps))
    params = {"pace": "50ms", "ttft": "100ms", "min_on_time": "97.5%"}
    verdict = sla.judge(synth.obs(streams), "fluidity", params)
    assert 0.975 < verdict.figure < 0.99
    assert verdict.status == "inconclusive"
    assert verdict.evidence["n_eff"] < verdict.evidence["n"] / 4
    series = [v for st in sorted(streams, key=lambda x: x.t_sent or 0) for v in deadlines(st, 0.05, 0.1).outcomes]
    shuffled = np.random.default_rng(2).permutation(np.asarray(series))
    assert judge_share(shuffled, 0.975)[0] == "pass"


def test_no_content_and_no_allowance_is_inconclusive(synth: Any) -> None:
    verdict = sla.judge(synth.obs([synth.stream("a", ttft=None)]), "fluidity", {"pace": "50ms"})
    assert verdict.status == "inconclusive" and verdict.samples == 0
