"""The `capacity:` section: defaults, every mistake located with what would be right, and the exit
codes a search's answers give."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.capacity.probes import WINDOW, Case, cases_of, judged_entries, probe_experiment
from chaos.capacity.run import CapacityResult, answer
from chaos.experiment.loader import parse_experiment
from chaos.model.capacity import CapacitySpec, Probe
from chaos.model.errors import ExperimentInvalid

pytestmark = pytest.mark.timeout(30)

BASE = """
name: cap
load: {max_tokens: 64}
phases:
  - {name: baseline, duration: 3s}
  - name: slow
    duration: 3s
    faults: [{kind: server.stall, where: event_loop, duration: 50ms, every: 200ms}]
  - {name: recovery, duration: 3s}
sla:
  - {kind: ttft, quantile: p50, budget: 100ms}
  - {kind: errors, budget: 0%}
  - {kind: recovery, phases: [recovery]}
  - {kind: ttft, name: must_fail, phases: [slow], budget: 1ms, expect: fail}
"""


def test_defaults_cases_and_judged_entries() -> None:
    exp = parse_experiment(BASE + "capacity: {max: 32}\n")
    spec = exp.capacity
    assert spec is not None and (spec.dimension, spec.low, spec.high, spec.resolution) == ("concurrency", 1, 32, 0.05)
    assert [c.name for c in cases_of(exp, spec)] == ["baseline", "slow"]
    # recovery compares two phases and an expect: fail entry is a regression check: neither judges a probe
    assert [e.name for e in judged_entries(exp, spec)] == ["ttft", "errors"]
    assert parse_experiment(BASE).capacity is None


def test_a_probe_is_a_warmup_and_one_window_with_the_case_faults_at_the_level() -> None:
    exp = parse_experiment(BASE + "capacity: {dimension: rate, min: 0.5, max: 40, warmup: 1s}\n")
    assert exp.capacity is not None
    (slow,) = [c for c in cases_of(exp, exp.capacity) if c.name == "slow"]
    probe = probe_experiment(exp, exp.capacity, slow, 12.5, 8.0)
    assert (probe.load.rate, probe.load.concurrency) == (12.5, None)
    assert [(p.name, p.duration, len(p.faults)) for p in probe.phases] == [("warmup", 1.0, 0), (WINDOW, 8.0, 1)]
    assert all(e.phases == (WINDOW,) for e in probe.sla) and probe.capacity is None
    # the probe run keeps no copy of the whole experiment: its own text only
    assert probe.source is None and probe.text is not None and "\ncapacity:" not in probe.text
    assert probe.safety.max_duration >= 1.0 + 1.0 + 8.0 + probe.safety.drain_timeout


@pytest.mark.parametrize(("section", "where", "says"), [
    ("{min: 8, max: 4}", "capacity.max", "must be above min (8)"),
    ("{min: 1.5}", "capacity.min", "whole number of streams"),
    ("{cases: [baseline, slwo]}", "capacity.cases", "unknown case 'slwo' (did you mean 'slow'?)"),
    ("{cases: [recovery]}", "capacity.cases", "a case is baseline or a phase with faults: baseline, slow"),
    ("{slas: [recovery]}", "capacity.slas", "recovery compares two phases"),
    ("{dimension: load}", "capacity.dimension", "concurrency"),
    ("{probe: 10s, max_probe: 5s}", "capacity.max_probe", "must be at least probe (10s)"),
    ("{resolution: 200%}", "capacity.resolution", ""),
    ("{budjet: 5m}", "capacity.budjet", "did you mean 'budget'?"),
    ("{start: 99}", "capacity.start", "must lie between min (1) and max (64)"),
])
def test_mistakes_are_located_and_say_what_would_be_right(section: str, where: str, says: str) -> None:
    with pytest.raises(ExperimentInvalid) as refused:
        parse_experiment(BASE + f"capacity: {section}\n", "cap.yaml")
    message = str(refused.value)
    assert f"cap.yaml:{BASE.count(chr(10)) + 1}:" in message and where in message and says in message, message


def test_a_search_needs_an_sla_a_probe_can_judge() -> None:
    only_recovery = BASE.split("sla:")[0] + "sla:\n  - {kind: recovery, phases: [recovery]}\ncapacity: {}\n"
    with pytest.raises(ExperimentInvalid, match="needs at least one SLA entry that judges one window"):
        parse_experiment(only_recovery)


def result(spec: CapacitySpec, probes: list[list[Probe]], whys: list[str], **kw: object) -> CapacityResult:
    answers = [answer(spec, Case(f"c{i}", ()), p, w) for i, (p, w) in enumerate(zip(probes, whys, strict=True))]
    return CapacityResult(experiment=parse_experiment(BASE), spec=spec, answers=answers, out_dir=Path("."),
                          started=0.0, ended=1.0, budget_s=60.0, budget_ran_out=bool(kw.get("ran_out")))


def test_exit_codes_say_met_not_met_and_out_of_budget() -> None:
    spec = CapacitySpec(low=1, high=16, min_capacity=4)
    met = [Probe("c0", 4, 6, "pass"), Probe("c0", 5, 6, "fail")]
    under = [Probe("c1", 2, 6, "pass"), Probe("c1", 3, 6, "fail")]
    assert result(spec, [met], ["resolved"]).exit_code == 0
    assert result(spec, [met, under], ["resolved", "resolved"]).exit_code == 1
    assert result(spec, [met[:1]], ["the budget ran out before the resolution was reached"],
                  ran_out=True).exit_code == 3
    never = [Probe("c1", 1, 6, "fail")]
    assert result(spec, [met, never], ["resolved", "even the lowest level (1 streams) did not meet the SLAs"]
                  ).exit_code == 1


def test_a_halted_probe_failed_to_hold_the_load_and_an_interrupted_one_could_not_run() -> None:
    from chaos.capacity.probes import outcome_of
    from chaos.execution.result import Result
    from chaos.model.observations import Observations

    def ended(status: str, error: str | None) -> Result:
        return Result(experiment=parse_experiment(BASE), verdicts=[], observations=Observations(), out_dir=Path("."),
                      status=status, exit_code=4, started=0.0, ended=1.0, error=error)

    assert outcome_of(ended("halted", "halted: ttft above 2s"))[:2] == ("fail", ("halt",))
    # a probe's own halt is named after its entry, which then bound the probe
    judged = ended("halted", "halted: ttft: TTFT p50 900ms over the 40 streams of the last 9s (> 300ms)")
    assert outcome_of(judged)[:2] == ("fail", ("ttft",))  # no verdicts (a halted run judges none): the entry named
    assert outcome_of(ended("interrupted", "SIGINT"))[0] == "error"


def test_a_probe_halts_when_it_has_plainly_failed_and_never_before_its_entries_could() -> None:
    from chaos.capacity.probes import HALT_MIN_STREAMS, probe_halts
    from chaos.execution.halt import check, ended
    from chaos.model.observations import NS, StreamRecord

    exp = parse_experiment(BASE + "capacity: {max: 32, probe: 6s, warmup: 2s}\n")
    spec = exp.capacity
    assert spec is not None
    probe = probe_experiment(exp, spec, cases_of(exp, spec)[0], 4, 6.0)
    halts = {h.name: h for h in probe.safety.halt_on}
    # ttft p50 100ms: halts above 3x, over the whole probe; errors 0%: a quarter failed
    assert (halts["ttft"].kind, halts["ttft"].above, halts["ttft"].quantile) == ("ttft", pytest.approx(0.3), 0.5)
    assert halts["ttft"].window >= 8.0 and halts["ttft"].min_streams == HALT_MIN_STREAMS
    assert (halts["errors"].kind, halts["errors"].above) == ("error_share", 0.25)
    off = parse_experiment(BASE + "capacity: {max: 32, halt_factor: 0}\n")
    assert off.capacity is not None and probe_halts(judged_entries(off, off.capacity), off.capacity, 9.0) == ()
    tolerant = parse_experiment(BASE.replace("budget: 0%", "budget: 5%") + "capacity: {max: 32}\n")
    assert tolerant.capacity is not None
    kept = probe_halts(judged_entries(tolerant, tolerant.capacity), tolerant.capacity, 9.0)
    assert [h.kind for h in kept] == ["ttft"]  # a 5% errors budget: a quarter in one stretch may still meet it

    def streams(ttft_s: float, n: int) -> list:  # n streams a tenth of a second apart, each answered at ttft_s
        out = []
        for i in range(n):
            t0 = int(i * 0.1 * NS)
            first = t0 + int(ttft_s * NS)
            st = StreamRecord(id=str(i), phase="probe", t_sent=t0, t_first_byte=first, t_first_content=first,
                              status=200)
            st.t_content = [first]
            st.t_end = t0 + int((ttft_s + 0.5) * NS)
            out.append(ended(st))
        return [e for e in out if e is not None]

    now = int(10 * NS)  # the halt's window is the whole probe (9s): every stream is in it
    only = probe.safety.__class__(halt_on=(halts["ttft"],), halt_on_dead_target=False)
    why = check(streams(0.9, 40), now, only)
    assert why is not None and why.startswith("ttft:")  # named after the entry, which bound the probe
    assert check(streams(0.2, 40), now, only) is None  # 2x the budget: the SLA decides, not the halt
    assert check(streams(0.9, HALT_MIN_STREAMS - 1), now, only) is None  # too few streams yet


@pytest.mark.parametrize("source", ["base", "shipped"])
def test_a_probe_keeps_its_own_text_which_reads_back_as_the_probe(source: str) -> None:
    from chaos.experiment import load_experiment

    root = Path(__file__).resolve().parents[2]
    exp = (parse_experiment(BASE + "capacity: {max: 32}\n") if source == "base"
           else load_experiment(root / "experiments" / "capacity-under-faults.yaml"))
    assert exp.capacity is not None
    for case in cases_of(exp, exp.capacity):
        level = 3 if exp.capacity.integer else 8.717797887081348  # a bisection's midpoint, every digit kept
        probe = probe_experiment(exp, exp.capacity, case, level, 10.0)
        assert probe.text is not None, case.name  # `verify` of the probe's run directory re-judges this probe
        again = parse_experiment(probe.text)
        assert again == probe and again.capacity is None
        assert [p.name for p in again.phases] == ["warmup", WINDOW] and again.phases[-1].faults == case.faults


def test_a_probe_whose_text_would_not_read_back_keeps_none() -> None:
    from dataclasses import replace

    exp = parse_experiment(BASE + "capacity: {max: 32}\n")
    assert exp.capacity is not None
    broken = replace(exp, text="[not, a, mapping]")
    assert probe_experiment(broken, exp.capacity, cases_of(exp, exp.capacity)[0], 3, 6.0).text is None
