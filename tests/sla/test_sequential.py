"""Phases that run until decided: the alpha spending, the looks, and why the spent interval is needed.

Pure: synthetic observations and a seeded simulation, no run (one look runs on asyncio, about 1 s)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import numpy as np
import pytest

from chaos.execution.sequential import (
    counted_entries,
    look,
    look_offsets,
    sequential_evidence,
    sequential_spec,
    snapshot,
)
from chaos.execution.verify import judge_entry
from chaos.experiment import experiment_from_dict
from chaos.model.observations import NS, Observations, PhaseWindow, StreamRecord
from sla.base import REGISTRY
from sla.recovery import Recovery
from sla.stats import scaled_ranks, sequential_confidence, spent_alpha
from sla.ttft import Ttft

MS = 1_000_000


@pytest.mark.parametrize("alpha", [0.05, 0.01, 0.2])
def test_the_spent_alphas_sum_below_alpha_over_any_number_of_looks(alpha: float) -> None:
    spent = np.cumsum([spent_alpha(alpha, k) for k in range(1, 10_001)])
    assert spent[-1] < alpha and np.all(np.diff(spent) > 0)
    assert spent_alpha(alpha, 1) == pytest.approx(alpha / 2) and spent_alpha(alpha, 3) == pytest.approx(alpha / 12)
    assert sequential_confidence(0.95, 1) == pytest.approx(0.975)
    with pytest.raises(ValueError):
        spent_alpha(alpha, 0)


def test_looks_come_at_min_then_every_25_percent_and_last_at_max() -> None:
    offsets = look_offsets(4.0, 60.0)
    assert offsets[0] == 4.0 and offsets[-1] == 60.0
    ratios = np.diff(offsets[:-1]) / np.asarray(offsets[:-2])
    assert np.allclose(ratios, 0.25)
    # a look just short of max (58.2 s) would only spend confidence: max takes its place
    assert offsets[-2] * 1.25 < 60.0 <= offsets[-2] * 1.25 * 1.1
    assert len(offsets) == 13  # 4 s to 60 s: 12 growths of 25%, the last one moved to max
    assert look_offsets(10.0, 40.0)[-2:] == [pytest.approx(30.517578125), 40.0]  # 38.1 s merged into 40 s
    assert look_offsets(10.0, 13.0) == [10.0, 13.0]  # 12.5 s: merged
    assert look_offsets(10.0, 20.0)[-2:] == [pytest.approx(15.625), 20.0]  # 19.5 s: merged
    assert look_offsets(2.0, 2.0) == [2.0]


def _window(looks: int, stopped_by: str | None = "decided") -> Observations:
    obs = Observations()
    obs.add(PhaseWindow("steady", 0, 10, 0, looks=looks, stopped_by=stopped_by))
    return obs


def _decisions(confidences: list[float], looks_n: list[int], runs: int, seed: int) -> float:
    """How often a p50 verdict whose budget sits exactly on the true median (no decision is warranted)
    decides at some look: looks at n = looks_n samples, look k judged at confidences[k]; the rule the
    runner applies, stop at the first decided look. Vectorised over runs of i.i.d. uniform samples."""
    rng = np.random.default_rng(seed)
    samples = rng.random((runs, looks_n[-1]))
    decided = np.zeros(runs, dtype=bool)
    for n, confidence in zip(looks_n, confidences, strict=True):
        lo, hi = scaled_ranks(n, 0.5, (1 - confidence) / 2)
        ordered = np.sort(samples[:, :n], axis=1)
        passes = ordered[:, hi - 1] <= 0.5 if hi is not None else np.zeros(runs, dtype=bool)
        fails = ordered[:, lo - 1] > 0.5 if lo is not None else np.zeros(runs, dtype=bool)
        decided |= passes | fails
    return float(decided.mean())


def test_a_fixed_interval_rechecked_until_decided_errs_above_alpha_and_the_spent_one_does_not() -> None:
    """The 95% interval at each look of a phase from 4 s to 60 s (14 looks, 12 samples a second) decides
    a budget that sits on the true median in far more than 5% of runs; judged as ``sequential_spec``
    makes the verdict of a phase that made K looks (1 - α_K), at most 5%."""
    spec = Ttft(quantile=0.5, budget=0.5, confidence=0.95)
    looks_n = [round(12 * t) for t in look_offsets(4.0, 60.0)]
    fixed = [spec.confidence] * len(looks_n)
    spent = [sequential_spec(spec, _window(k), "steady").confidence for k in range(1, len(looks_n) + 1)]
    runs = 1500
    rechecked = _decisions(fixed, looks_n, runs, seed=7)
    sequential = _decisions(spent, looks_n, runs, seed=7)
    margin = 3 * np.sqrt(0.05 * 0.95 / runs)
    assert rechecked > 0.05 + margin, rechecked  # ~0.2: re-checking is not valid
    assert sequential <= 0.05 + margin, sequential


def test_sequential_spec_spends_only_where_the_phase_made_looks() -> None:
    spec = Ttft(quantile=0.99, budget=1.0, confidence=0.95)
    assert sequential_spec(spec, _window(0, None), "steady") is spec  # a fixed phase
    assert sequential_spec(spec, _window(3), "other") is spec  # a phase with no window
    assert sequential_spec(spec, _window(3), "steady").confidence == pytest.approx(1 - 0.05 / 12)
    assert sequential_spec(spec, _window(3), None).confidence == pytest.approx(1 - 0.05 / 12)  # whole run: most looks
    recovery = Recovery(baseline=None, alpha=0.05, max_ratio=1.5, slack=0.01)
    assert sequential_spec(recovery, _window(2), "steady").alpha == pytest.approx(0.05 / 6)  # a rank test's alpha
    errors = REGISTRY["errors"].from_params({"budget": 0.0})
    assert sequential_spec(errors, _window(2), "steady") is errors  # a share against a budget: no interval


def test_kinds_that_need_data_after_the_phase_never_hold_it_open() -> None:
    assert {k for k, cls in REGISTRY.items() if not cls.decides_in_phase} == {
        "kv_cleanup", "abort_propagation", "abort_path", "capacity", "throughput"}


def _streams(phase: str, ttfts_ms: list[float]) -> list[StreamRecord]:
    out = []
    for i, ttft in enumerate(ttfts_ms):
        sent = i * 10 * MS
        first = sent + int(ttft * MS)
        out.append(StreamRecord(id=f"{phase}-{i}", phase=phase, t_sent=sent, t_first_byte=first, t_first_event=first,
                                t_first_content=first, t_content=[first, first + MS], t_end=first + 2 * MS, status=200,
                                finish_reason="length", done_seen=True, events=2, text="ab"))
    return out


EXPERIMENT = {
    "name": "seq", "phases": [{"name": "a", "duration": {"min": "2s", "max": "30s"}},
                              {"name": "b", "duration": "2s", "until": "decided"}],
    "sla": [{"kind": "ttft", "phases": ["a"], "quantile": "p99", "budget": "1s"},
            {"kind": "ttft", "name": "ttft_b", "phases": ["b"], "quantile": "p50", "budget": "1s"},
            {"kind": "errors", "budget": "0%"}, {"kind": "kv_cleanup", "within": "2s"}],
}


def test_a_look_judges_the_entries_of_its_phase_and_says_what_each_needs() -> None:
    """A 3% tail of 1.5 s first tokens fails a p99 budget of 1 s once enough streams ended; before, the
    look says how many samples it has and about how many would decide."""
    exp = experiment_from_dict(EXPERIMENT)
    assert [(e.name, p) for e, p in counted_entries(exp, exp.phase("a"))] == [("ttft", "a")]
    # whole-run entries count at the last phase; kv_cleanup never does
    assert [(e.name, p) for e, p in counted_entries(exp, exp.phase("b"))] == [("ttft_b", "b"), ("errors", None)]
    obs = Observations()
    obs.add(PhaseWindow("a", 0, None, 0))
    for stream in _streams("a", [40.0] * 30):
        obs.add(stream)
    early = look(counted_entries(exp, exp.phase("a")), snapshot(obs, "a", 1), judge_entry)
    assert not early.decided and "ttft 30 samples (needs ~" in early.summary
    tail = [1500.0 if i % 33 == 0 else 40.0 + i % 7 for i in range(600)]  # 3%, spread out
    obs = Observations()
    obs.add(PhaseWindow("a", 0, None, 0))
    for stream in _streams("a", tail):
        obs.add(stream)
    later = look(counted_entries(exp, exp.phase("a")), snapshot(obs, "a", 2), judge_entry)
    assert later.decided and later.summary == "ttft decided fail"
    assert obs.phase("a") is not None and obs.phase("a").looks == 0  # the snapshot is a copy


def test_the_verdict_of_a_phase_that_looked_says_so() -> None:
    exp = experiment_from_dict(EXPERIMENT)
    obs = _window(4)
    for stream in _streams("steady", [40.0] * 50):
        obs.add(stream)
    entry = exp.sla[1]
    verdict = judge_entry(entry, obs, "steady")
    assert verdict.evidence["sequential"]["looks"] == 4
    assert verdict.evidence["sequential"]["stopped_by"] == "decided"
    assert verdict.evidence["sequential"]["confidence_per_look"] == pytest.approx(1 - 0.05 / 20)
    fixed = _window(0, None)
    for stream in _streams("steady", [40.0] * 50):
        fixed.add(stream)
    assert "sequential" not in sequential_evidence(judge_entry(entry, fixed, "steady"), fixed, "steady").evidence


def test_the_run_s_verdict_is_the_deciding_look_s_own_data_and_spending() -> None:
    """The run judges a phase that looked on the streams that had ended by the look that stopped it, so
    its verdict is the look's (a stream that ended after it, slow or not, cannot turn a decided verdict
    undecided or flip it); those are counted in the evidence and stay in the journal."""
    exp = experiment_from_dict(EXPERIMENT)
    entry = next(e for e in exp.sla if e.name == "ttft_b")  # p50 within 1 s
    fast = _streams("b", [40.0] * 60)
    slow = [replace(s, id=f"late-{i}", t_sent=s.t_sent + 700 * MS, t_first_content=s.t_sent + 3700 * MS,
                    t_content=[s.t_sent + 3700 * MS], t_end=s.t_sent + 3800 * MS) for i, s in enumerate(fast)]
    t_look = max(s.t_end or 0 for s in fast)  # every fast stream had ended, no slow one had
    obs = Observations()
    for stream in fast + slow:
        obs.add(stream)
    looked = look([(entry, "b")], snapshot(obs, "b", 2, t_look), judge_entry)
    assert looked.statuses == ("pass",)
    obs.add(PhaseWindow("b", 0, t_look + 5 * NS, 0, looks=2, stopped_by="decided", t_decided=t_look))
    verdict = judge_entry(entry, obs, "b")
    assert (verdict.status, verdict.samples) == ("pass", 60)  # the look's data: the 60 slow ones came later
    assert verdict.evidence["sequential"]["ended_after_the_deciding_look"] == 60
    kv = next(e for e in exp.sla if e.kind == "kv_cleanup")
    from chaos.execution.sequential import sequential_view

    assert sequential_view(kv.spec, obs, "b") is obs  # a kind that needs what follows the phase sees it all
    unlimited = replace(obs, phases=[replace(obs.phases[0], t_decided=None)])
    assert judge_entry(entry, unlimited, "b").samples == 120  # without the cut: both halves


# A planted buffering server's run (beside two busy processes) whose only look decided its whole-run TTFT
# fail while the run's verdict came out inconclusive: (sent ms, TTFT ms, ended ms), in send order; the look
# was taken at 7382 ms, and the last four streams, in flight then, ended while the load drained.
BUFFERED = [(1382, 1300, 2682), (1382, 982, 2364), (1382, 1396, 2780), (1382, 1127, 2509), (2366, 886, 3253),
            (2516, 872, 3388), (2684, 841, 3526), (2781, 1055, 3836), (3254, 1172, 4427), (3390, 998, 4388),
            (3532, 1130, 4662), (3838, 1430, 5268), (4390, 1162, 5552), (4429, 1569, 5998), (4664, 1450, 6114),
            (5270, 1322, 6592), (5554, 2029, 7583), (6001, 1524, 7524), (6117, 1879, 7996), (6594, 1450, 8044)]


def test_a_whole_run_entry_the_last_phase_s_look_decided_keeps_that_decision() -> None:
    """An entry over the whole run is judged at the last phase's looks; the run's verdict judges the streams
    that had ended by the deciding look, as a phase-scoped one does. Over all 20 the four drained ones (all
    above the median) raise the autocorrelation, so the same p50 has no lower bound: inconclusive."""
    exp = experiment_from_dict({
        "name": "buffer", "phases": [{"name": "steady", "duration": {"min": "6s", "max": "30s"}}],
        "sla": [{"kind": "ttft", "quantile": "p50", "budget": "150ms"}]})
    streams = [StreamRecord(id=f"s{i}", phase="steady", t_sent=sent * MS, t_first_byte=(sent + ttft) * MS,
                            t_first_event=(sent + ttft) * MS, t_first_content=(sent + ttft) * MS,
                            t_content=[(sent + ttft) * MS], t_end=end * MS, status=200, finish_reason="length",
                            done_seen=True, events=1, text="a") for i, (sent, ttft, end) in enumerate(BUFFERED)]
    t_look = 7382 * MS
    obs = Observations()
    obs.add(PhaseWindow("steady", 0, None, 0))
    for stream in streams:
        if stream.t_end is not None and stream.t_end <= t_look:  # the journal at the look: the ended streams
            obs.add(stream)
    entries = counted_entries(exp, exp.phase("steady"))
    assert [(e.name, p) for e, p in entries] == [("ttft", None)]
    looked = look(entries, snapshot(obs, "steady", 1, t_look), judge_entry)
    assert looked.statuses == ("fail",)
    for stream in streams[16:]:  # drained after the phase stopped
        obs.add(stream)
    obs.add(PhaseWindow("steady", 0, t_look + 6 * MS, 0, looks=1, stopped_by="decided", t_decided=t_look))
    verdict = judge_entry(exp.sla[0], obs, None)
    assert (verdict.status, verdict.samples) == ("fail", 16), verdict.evidence
    assert verdict.evidence["sequential"]["ended_after_the_deciding_look"] == 4
    fixed = replace(obs, phases=[replace(obs.phases[-1], looks=0, stopped_by=None, t_decided=None)])
    assert judge_entry(exp.sla[0], fixed, None).samples == 20  # a phase of fixed length: every stream
    at_max = replace(obs, phases=[replace(obs.phases[-1], stopped_by="max")])  # no look stopped it: every stream
    assert judge_entry(exp.sla[0], at_max, None).samples == 20


def test_a_look_judges_every_stream_that_ended_by_it_even_one_whose_record_comes_later() -> None:
    """A load process sends its records every 0.5 s: a stream that ended 50 ms before the look reaches the
    journal 250 ms after it. The look judges it, as the run's verdict (every stream ended by the look) will;
    a stream that ended after the look is in the journal by then but judged by neither."""
    from chaos.execution.sequential import LookState, run_looks, sequential_view
    from chaos.model.verdict import Verdict

    exp = experiment_from_dict({"name": "late", "phases": [{"name": "p", "duration": {"min": "200ms", "max": "3s"}}],
                                "sla": [{"kind": "errors", "budget": "0%"}]})
    judged: list[set[str]] = []

    def judge(entry: object, obs: Observations, phase: str | None) -> Verdict:
        judged.append({s.id for s in sequential_view(exp.sla[0].spec, obs, phase).streams})
        return Verdict("errors", phase, "pass", 0.0, 0.0, "ratio", 0, {})

    async def scenario() -> LookState:
        t0 = time.monotonic_ns()
        obs = Observations()
        obs.add(PhaseWindow("p", t0, None, t0))
        before, after = (replace(_streams("p", [40.0])[0], id=name, t_end=t0 + ms * MS)
                         for name, ms in (("before", 150), ("after", 300)))

        async def deliver() -> None:  # both records in one later frame, as the uplink sends them
            await asyncio.sleep(0.45)
            obs.add(before)
            obs.add(after)

        state = LookState()
        delivery = asyncio.create_task(deliver())
        await run_looks(exp, exp.phase("p"), lambda: obs, t0, lambda line: None, state, judge)
        await delivery
        return state

    state = asyncio.run(scenario())
    assert judged == [{"before"}] and state.stopped_by == "decided" and state.looks == 1


def test_a_look_still_judging_at_the_phases_max_ends_the_phase_there() -> None:
    """On a starved box scipy's import and a look's judging took a 3 s phase to 7.7 s. A look never carries
    the phase past its max: the look that runs into it counts as the last, stopped by max."""
    from chaos.execution.sequential import LookState, run_looks
    from chaos.model.verdict import Verdict

    exp = experiment_from_dict({"name": "slow", "phases": [{"name": "p", "duration": {"min": "200ms", "max": "1s"}}],
                                "sla": [{"kind": "errors", "budget": "0%"}]})

    def judge(entry: object, obs: Observations, phase: str | None) -> Verdict:
        time.sleep(2.0)  # a look's judging on a starved box, in its thread
        return Verdict("errors", phase, "pass", 0.0, 0.0, "ratio", 0, {})

    async def scenario() -> tuple[LookState, float, list[str]]:
        t0 = time.monotonic_ns()
        obs = Observations()
        obs.add(PhaseWindow("p", t0, None, t0))
        state, lines = LookState(), []
        await run_looks(exp, exp.phase("p"), lambda: obs, t0, lines.append, state, judge)
        return state, (time.monotonic_ns() - t0) / 1e9, lines

    state, took_s, lines = asyncio.run(scenario())
    assert state.stopped_by == "max" and state.looks == 1, (state, lines)
    assert 0.95 <= took_s < 1.6, took_s  # its 1 s max, not the 2.2 s the look needed
    assert lines[-1].startswith("phase p: look 1 at 0.2s was still judging at its max (1s)"), lines
