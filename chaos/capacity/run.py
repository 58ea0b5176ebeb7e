"""The capacity search over every case, within its time budget: the baseline first, then each
fault case starting from the baseline's capacity (a fault rarely raises it), each probe a real
experiment run, an inconclusive probe lengthened, a shared target settled between probes."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.api import runner
from chaos.capacity.probes import (
    Case,
    cases_of,
    judged_entries,
    pre_load_kv,
    probe_dir,
    probe_experiment,
    probe_of,
    settle,
    shares_target,
)
from chaos.capacity.search import bracket, next_level
from chaos.experiment.loader import BASELINE_S
from chaos.host.runfiles import prepare_private_dir, release_dir
from chaos.model.capacity import BASELINE_CASE, CapacitySpec, CaseAnswer, Probe, lost_capacity
from chaos.model.errors import UsageError
from chaos.model.experiment import Experiment

__all__ = ["CapacityResult", "search_capacity"]

# an open-loop probe's window holds at least this many arrivals: a p50 of fewer, correlated as a
# probe's TTFTs are, is undecided (2 requests/s for 5 s gave 10 and an inconclusive probe)
MIN_ARRIVALS = 30
START_UP_GUESS_S = 6.0  # a probe's own start-up and tear-down before any was timed (builtin stack: ~5-7 s)
MAX_PROBES_PER_CASE = 40  # bisection of any range this schema allows needs fewer; a bound, not a target


@dataclass
class CapacityResult:
    """Every case's answer, what the search spent, and the exit code (docs/contracts.md)."""

    experiment: Experiment
    spec: CapacitySpec
    answers: list[CaseAnswer]
    out_dir: Path
    started: float
    ended: float
    budget_s: float
    budget_ran_out: bool
    interrupted: bool = False
    errors: list[str] = field(default_factory=list)
    slas: tuple[str, ...] = ()
    runs: int = 0  # probe runs, the lengthened reruns of undecided probes included

    @property
    def exit_code(self) -> int:
        """4 a probe could not run, 3 the budget ended first, 1 a case under min_capacity, else 0."""
        if self.errors or self.interrupted:
            return 4
        if self.budget_ran_out or not all(a.resolved for a in self.answers):
            return 3
        floor = self.spec.min_capacity
        if floor is not None and any((a.passing or 0.0) < floor for a in self.answers):
            return 1
        return 0


class _Clock:
    """The budget: a probe starts only when what it is expected to take still fits."""

    def __init__(self, budget_s: float) -> None:
        self.start = time.monotonic()
        self.budget_s = budget_s
        self.overhead_s: list[float] = []  # each probe's time beyond its planned phases

    def fits(self, planned_s: float) -> bool:
        overhead = max(self.overhead_s) if self.overhead_s else START_UP_GUESS_S
        return time.monotonic() - self.start + planned_s + overhead <= self.budget_s

    def took(self, planned_s: float, took_s: float) -> None:
        self.overhead_s.append(max(0.0, took_s - planned_s))


@dataclass
class _Search:
    experiment: Experiment
    spec: CapacitySpec
    out_dir: Path
    target_url: str | None
    api_key_env: str | None
    say: Callable[[str], None]
    clock: _Clock
    handle_signals: bool = True
    probes: list[Probe] = field(default_factory=list)
    budget_ran_out: bool = False
    interrupted: bool = False
    errors: list[str] = field(default_factory=list)
    metrics_url: str | None = None  # the shared target's, once a probe has found it
    idle_kv: float | None = None  # the shared target's KV at rest: lowest before a probe's load or after a settle
    on_probe: Callable[[Case, list[Probe]], None] | None = None  # after each probe: the case and its probes so far

    def planned_s(self, window_s: float) -> float:
        safety = self.experiment.safety
        return BASELINE_S + self.spec.warmup + window_s + safety.drain_timeout + safety.cleanup_window

    async def probe(self, case: Case, level: float) -> Probe | None:
        """One level, lengthened while inconclusive; None when the budget or a stop ended it first."""
        window = first_window(self.spec, level)
        while True:
            if not self.clock.fits(self.planned_s(window)):
                self.budget_ran_out = True
                return None
            found = await self._run_one(case, level, window)
            if found.outcome != "inconclusive" or window * 2 > self.spec.max_probe:
                return found
            self.say(f"  {case.name} at {level:g}: inconclusive ({', '.join(found.failed)}); again for {window * 2:g}s")
            window *= 2

    async def _run_one(self, case: Case, level: float, window: float) -> Probe:
        if shares_target(self.experiment, self.target_url) and self.probes:
            rest = await settle(self.metrics_url, self.experiment.target.engine, self.spec.settle, idle_kv=self.idle_kv)
            if rest["running"] is not None and rest["running"] <= 0 and rest["kv_usage"] is not None:
                self.idle_kv = rest["kv_usage"] if self.idle_kv is None else min(self.idle_kv, rest["kv_usage"])
        exp = probe_experiment(self.experiment, self.spec, case, level, window)
        where = probe_dir(self.out_dir, len(self.probes) + 1, case, level)
        began = time.monotonic()
        result = await runner(exp, target_url=self.target_url, out_dir=where, api_key_env=self.api_key_env,
                              handle_signals=self.handle_signals).run()
        took = time.monotonic() - began
        self.clock.took(self.planned_s(window), took)
        found = probe_of(case, level, window, result, took)
        if result.target is not None and result.target.metrics_url:
            self.metrics_url = result.target.metrics_url
        if shares_target(self.experiment, self.target_url):
            idle = pre_load_kv(result.observations, self.experiment.target.engine)
            if idle is not None:
                self.idle_kv = idle if self.idle_kv is None else min(self.idle_kv, idle)
        self.probes.append(found)
        self.interrupted = self.interrupted or result.status == "interrupted"
        decided = f" ({', '.join(found.failed)})" if found.failed else ""
        self.say(f"  {case.name} at {level:g} {self.spec.unit}: {found.outcome}{decided} [{took:.0f}s]")
        return found

    async def case(self, case: Case, start: float | None) -> CaseAnswer:
        mine: list[Probe] = []
        why = ""
        for _ in range(MAX_PROBES_PER_CASE):
            level, why = next_level(self.spec, mine, start)
            if level is None:
                break
            found = await self.probe(case, level)
            if found is None:
                why = "the budget ran out before the resolution was reached"
                break
            if found.outcome == "error":
                why = f"a probe could not run: {found.error}"
                self.errors.append(f"{case.name} at {level:g}: {found.error}")
                break
            mine.append(found)
            if self.on_probe is not None:
                self.on_probe(case, mine)
            if self.interrupted:
                why = "interrupted"
                break
        return answer(self.spec, case, mine, why)


def first_window(spec: CapacitySpec, level: float) -> float:
    """A probe's first window: ``probe``, or long enough for MIN_ARRIVALS at an open-loop rate (up to
    ``max_probe``). Pure."""
    if spec.integer:
        return spec.probe
    return min(spec.max_probe, max(spec.probe, math.ceil(MIN_ARRIVALS / level)))


def answer(spec: CapacitySpec, case: Case, probes: list[Probe], why: str) -> CaseAnswer:
    """A case's answer from its probes and how its search ended. Pure."""
    b = bracket(probes)
    at_failing = next((p for p in probes if p.level == b.failing and p.outcome != "pass"), None)
    resolved = why.startswith(("resolved", "even the lowest", "the highest"))
    if at_failing is not None and at_failing.outcome == "inconclusive":
        why += (f"; at {at_failing.level:g} the SLAs stayed undecided for the longest window "
                f"({at_failing.window_s:g}s): counted as not met")
    return CaseAnswer(case=case.name, faults=tuple(f.name for f in case.faults), passing=b.passing,
                      failing=b.failing, bound_by=at_failing.failed if at_failing else (), resolved=resolved,
                      probes=tuple(probes), why=why, non_monotone=b.non_monotone)


async def search_capacity(experiment: Experiment, *, out_dir: Path, target_url: str | None = None,
                          api_key_env: str | None = None, budget_s: float | None = None,
                          say: Callable[[str], None] = print, handle_signals: bool = True,
                          progress: Callable[[CapacityResult], None] | None = None) -> CapacityResult:
    """Search every case of ``experiment.capacity``; probe runs go under ``out_dir/probes``.
    ``handle_signals``: each probe run reverts on SIGINT/SIGTERM and the search stops (off under pytest,
    which owns SIGINT). ``progress``: called after every probe with the answers so far (the case in
    progress as far as it got), e.g. for the Prometheus exporter.

    ``out_dir`` stays held (``chaos.host.runfiles``) for its last files, ``write_capacity_report``,
    which lets it go; a search that raises lets it go itself."""
    spec = experiment.capacity
    if spec is None:
        raise UsageError(f"{experiment.source or experiment.name}: the experiment has no capacity section; add one "
                         "(docs/capacity.md) or run it with `streamchaos run`")
    prepare_private_dir(out_dir)
    try:
        return await _search_cases(experiment, spec, out_dir, target_url, api_key_env, budget_s, say,
                                   handle_signals, progress)
    except BaseException:
        release_dir(out_dir)  # no report follows a search that raised
        raise


async def _search_cases(experiment: Experiment, spec: CapacitySpec, out_dir: Path, target_url: str | None,
                        api_key_env: str | None, budget_s: float | None, say: Callable[[str], None],
                        handle_signals: bool, progress: Callable[[CapacityResult], None] | None) -> CapacityResult:
    """``search_capacity`` once its directory is taken."""
    budget = budget_s if budget_s is not None else spec.budget
    search = _Search(experiment, spec, out_dir, target_url, api_key_env, say, _Clock(budget), handle_signals)
    started = time.time()
    answers: list[CaseAnswer] = []
    base: CaseAnswer | None = None

    def so_far(case: Case, mine: list[Probe]) -> None:
        if progress is not None:
            now = [*answers, answer(spec, case, list(mine), "searching")]
            progress(CapacityResult(experiment, spec, now, out_dir, started, time.time(), budget, False, False,
                                    list(search.errors), tuple(e.name for e in judged_entries(experiment, spec)),
                                    len(search.probes)))

    search.on_probe = so_far
    for case in cases_of(experiment, spec):
        if search.interrupted or search.budget_ran_out:
            answers.append(answer(spec, case, [], "not searched: the search stopped before it"))
            continue
        say(f"case {case.name}" + (f" ({', '.join(f.name for f in case.faults)})" if case.faults else ""))
        start = base.passing if base is not None and base.passing is not None else None
        found = await search.case(case, start)
        answers.append(found)
        say(f"  -> {_summary(spec, found)}")
        if case.name == BASELINE_CASE:
            base = found
    return CapacityResult(experiment, spec, answers, out_dir, started, time.time(), budget, search.budget_ran_out,
                          search.interrupted, search.errors, tuple(e.name for e in judged_entries(experiment, spec)),
                          len(search.probes))


def _summary(spec: CapacitySpec, a: CaseAnswer) -> str:
    lo = "below the lowest level" if a.passing is None else f"{a.passing:g}"
    hi = "above the highest level" if a.failing is None else f"{a.failing:g}"
    bound = f", bound by {', '.join(a.bound_by)}" if a.bound_by else ""
    return f"capacity [{lo}, {hi}) {spec.unit}{bound}: {a.why}"


def summary_lines(result: CapacityResult) -> list[str]:
    return [f"{a.case}: {_summary(result.spec, a)}" for a in result.answers]


def as_dict(result: CapacityResult) -> dict[str, Any]:
    """What capacity.json holds."""
    base = next((a for a in result.answers if a.case == BASELINE_CASE), None)
    cases = []
    for a in result.answers:
        body = {"case": a.case, "faults": list(a.faults), "capacity": {"passing": a.passing, "failing": a.failing},
                "bound_by": list(a.bound_by), "resolved": a.resolved, "why": a.why,
                "non_monotone": list(a.non_monotone), "probes": [_probe_dict(p) for p in a.probes]}
        if base is not None and a is not base:
            body["lost"] = lost_capacity(base, a)
        cases.append(body)
    return {"kind": "capacity", "experiment": result.experiment.name, "dimension": result.spec.dimension,
            "unit": result.spec.unit, "bounds": [result.spec.low, result.spec.high],
            "resolution": result.spec.resolution, "slas": list(result.slas), "min_capacity": result.spec.min_capacity,
            "budget_s": result.budget_s, "took_s": round(result.ended - result.started, 2),
            "budget_ran_out": result.budget_ran_out, "errors": result.errors, "exit_code": result.exit_code,
            "probes": sum(len(a.probes) for a in result.answers), "runs": result.runs, "cases": cases}


def _probe_dict(p: Probe) -> dict[str, Any]:
    return {"level": p.level, "window_s": p.window_s, "outcome": p.outcome, "decided_by": list(p.failed),
            "verdicts": p.figures, "run_dir": p.run_dir, "took_s": round(p.took_s, 2), "error": p.error}
