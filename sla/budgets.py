"""Budgets a healthy stack meets, proposed from its own runs: the statistics behind `streamchaos budgets`.

Budgets copied from examples are guesses. Given finished runs of one experiment on a healthy
stack, this proposes for each SLA entry (over its phases) the tightest budget that a healthy run
of the same length still *passes* with probability at least ``1 - false_fail``, and how many
samples a run needs for that budget to be decidable at all. Each kind says how through its
``budget_rule()`` (``sla.base.BudgetRule``), and each method reads the kind's own ``samples()``:
the very values its verdict is judged on. ``chaos.execution.budgets`` reads the runs, prints the
table and writes the file.

How, for a quantile budget (``ttft``, ``itl``). A run passes when the upper bound of its
interval, the order statistic X_(k) that ``sla.stats`` picks for its n samples worth n_eff,
is within the budget. For n_e effective samples F(X_(k)) ~ Beta(k, n_e - k + 1), so with
probability 1 - ff/2 a run's deciding statistic lies below the population's p*-quantile,
p* = Beta⁻¹(1 - ff/2; k, n_e - k + 1), taking the shortest run and the smallest n_eff among the
given ones. The p*-quantile is bounded from above (one-sided, 1 - ff/2) from all runs' samples
pooled, counted at the largest τ any run showed; the budget is that bound, or the largest run's
own deciding statistic if higher, times exp(z_(1-ff) · s) where s is the standard deviation of
the runs' log sample quantiles: the run-to-run variation (one run: none can be measured, and the
output says so). For a share floor (``share``: ``goodput`` min_share, ``fluidity`` min_on_time) the same
two steps run on the binomial: the pooled share's lower bound (1 - ff/2), the ff/2-quantile of a
run's effective count at that share, that count's Clopper-Pearson lower bound at the entry's
confidence, then minus z · (s.d. of the runs' shares). A ``floor`` (``throughput``), a point figure
with no interval, is the runs' geometric mean minus z of their log spread, and never above the
slowest run. Entries whose budget is a policy rather than a measurement (``policy``: errors, early closes,
integrity, KV cleanup, recovery) are listed and left as they are.

The false-fail promise holds for a rerun on the box the runs came from, as it was then. A shared
CI machine is not: a rerun minutes later beside other work read an ITL p90 5% over the baselines'
own and straddled a budget proposed from them. ``headroom`` (``--headroom 25%``) is the room for
that, stated and applied last: latency budgets times (1 + headroom), rate floors times
(1 - headroom); share floors keep their binomial allowance, which a slower box does not move
unless its objective is within reach of the drift.

Rounding never tightens: budgets round up and floors round down, to three significant digits.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from scipy import stats as _stats

from chaos.model.experiment import SlaCheck
from chaos.model.observations import NS, Observations
from chaos.model.units import format_duration
from sla.base import BudgetRule
from sla.stats import (
    _upper_index,
    judge_share,
    proportion_bounds,
    quantile_bounds,
    sample_quantile,
    sample_size,
    samples_needed,
    samples_to_decide,
    share_samples_to_decide,
)
from sla.throughput import window

__all__ = ["Proposal", "format_value", "propose_entry"]

_T = TypeVar("_T")


@dataclass
class Proposal:
    """The budget proposed for one SLA entry (over all its phases)."""

    index: int  # position in the experiment's sla list
    name: str
    kind: str
    key: str | None  # the entry's key that holds the budget; None: nothing proposed
    unit: str  # s | fraction | requests/s | tokens/s
    current: float | None
    proposed: float | None
    per_run: list[float | None] = field(default_factory=list)  # each run's deciding figure
    samples_per_run: int | None = None  # the fewest samples a run had (over phases)
    n_eff_per_run: float | None = None
    samples_needed: int | None = None  # per run, for the proposed budget to be decidable
    how: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def text(self) -> str | None:
        """The proposed value as it is written in YAML (rounded so as never to tighten)."""
        return None if self.proposed is None else format_value(self.proposed, self.unit, upper=self.unit == "s")


# -- rounding ------------------------------------------------------------------------------------


def _round_sig(value: float, upper: bool, digits: int = 3) -> float:
    if value <= 0 or not math.isfinite(value):
        return value
    step = 10 ** (math.floor(math.log10(value)) - digits + 1)
    units = value / step
    units = math.ceil(units - 1e-9) if upper else math.floor(units + 1e-9)
    return float(f"{units * step:.{digits + 2}g}")


def format_value(value: float, unit: str, upper: bool) -> str:
    """YAML text of a budget: ``61.3ms``, ``97.1%``, ``12.3/s``; rounded up for budgets, down for floors."""
    if unit == "s":
        return format_duration(_round_sig(value, upper=True))
    if unit == "fraction":
        pct = math.floor(value * 1000 + 1e-9) / 10 if not upper else math.ceil(value * 1000 - 1e-9) / 10
        return f"{max(0.0, min(100.0, pct)):g}%"
    return f"{_round_sig(value, upper=upper):g}/s"


@dataclass(frozen=True)
class _Entry:
    """One SLA entry as a proposal sees it: its spec and the phases it is scoped to (None: the whole run)."""

    spec: SlaCheck
    phases: tuple[str, ...] | None

    @property
    def params(self) -> dict[str, Any]:
        return self.spec.params


# -- proposals -----------------------------------------------------------------------------------


def _z(false_fail: float) -> float:
    return float(_stats.norm.ppf(1.0 - false_fail))


def _spread(values: Sequence[float], log: bool) -> float:
    """The runs' standard deviation (of logs for positive figures); 0 for fewer than two runs."""
    if len(values) < 2:
        return 0.0
    xs = [math.log(v) for v in values if v > 0] if log else list(values)
    return statistics.stdev(xs) if len(xs) >= 2 else 0.0


def _phases(entry: _Entry) -> tuple[str | None, ...]:
    return entry.phases or (None,)


def _per_phase(entry: _Entry, runs: Sequence[Observations], proposal: Proposal,
               judge_phase: Callable[[str | None], _T | None]) -> list[_T] | None:
    """The skeleton every proposal shares: one figure per phase the entry is scoped to (the whole
    run when none), None as soon as one phase cannot ground a figure (its note says why); and the
    note that one run cannot show run-to-run variation."""
    results: list[_T] = []
    for phase in _phases(entry):
        judged = judge_phase(phase)
        if judged is None:
            return None
        results.append(judged)
    if len(runs) < 2:
        proposal.notes.append("one run: run-to-run variation cannot be measured; give two or more runs")
    return results


def _propose_quantile(entry: _Entry, runs: Sequence[Observations], ff: float, proposal: Proposal) -> None:
    judged = _per_phase(entry, runs, proposal, lambda phase: _quantile_phase(entry, runs, ff, proposal, phase))
    if judged is None:
        return
    proposal.proposed = max(budget for budget, _ in judged)
    proposal.samples_needed = max(need for _, need in judged)
    if proposal.samples_per_run is not None and proposal.samples_per_run < proposal.samples_needed:
        proposal.notes.append(
            f"runs had {proposal.samples_per_run} samples; about {proposal.samples_needed} are needed to decide: "
            "lengthen the phase"
        )


def _quantile_phase(entry: _Entry, runs: Sequence[Observations], ff: float, proposal: Proposal,
                    phase: str | None) -> tuple[float, int] | None:
    """One phase's proposed quantile budget and the samples a run needs to decide it; None (with a
    note) when the runs cannot ground one."""
    q: float = entry.params["quantile"]
    confidence: float = entry.params["confidence"]
    alpha = (1.0 - confidence) / 2.0
    where = f"phase {phase}" if phase else "the run"
    series = [entry.spec.samples(run, phase) or [] for run in runs]
    if any(not s for s in series):
        proposal.notes.append(f"{where}: a run has no samples; nothing to propose from")
        return None
    sizes = [sample_size(s, q) for s in series]
    per_run = [quantile_bounds(s, q, confidence, n_eff=z.n_eff).upper for s, z in zip(series, sizes, strict=True)]
    quantiles = [sample_quantile(s, q) or 0.0 for s in series]
    proposal.per_run = per_run if len(_phases(entry)) == 1 else proposal.per_run
    n_min, n_eff_min = min(len(s) for s in series), min(z.n_eff for z in sizes)
    tau = max(z.tau for z in sizes)
    proposal.samples_per_run = min(n_min, proposal.samples_per_run or n_min)
    proposal.n_eff_per_run = min(n_eff_min, proposal.n_eff_per_run or n_eff_min)
    bound_needs = math.ceil(samples_needed(q, confidence, "upper") * tau)
    n_e = max(1, math.floor(n_eff_min))
    k = _upper_index(n_e, q, alpha)
    if k is None:
        proposal.notes.append(
            f"{where}: runs of {n_min} samples (worth {n_eff_min:.0f}) cannot bound a p{q * 100:g} at all; "
            f"about {bound_needs} are needed: lengthen the phase"
        )
        proposal.samples_needed = max(proposal.samples_needed or 0, bound_needs)
        return None
    p_star = float(_stats.beta.ppf(1.0 - ff / 2.0, k, n_e - k + 1))
    pooled = [v for s in series for v in s]
    pooled_bound = quantile_bounds(pooled, p_star, 1.0 - ff / 2.0, two_sided=False, n_eff=len(pooled) / tau).upper
    largest_run = max(u for u in per_run if u is not None) if any(u is not None for u in per_run) else None
    if pooled_bound is None:
        proposal.notes.append(
            f"{where}: the {len(pooled)} pooled samples cannot bound their p{p_star * 100:.4g}; the budget rests on "
            "the runs' own upper bounds and their spread: more or longer runs would ground it"
        )
    candidates = [b for b in (pooled_bound, largest_run, max(pooled) if pooled_bound is None else None)
                  if b is not None]
    spread = _spread(quantiles, log=True)
    budget = max(candidates) * math.exp(_z(ff) * spread)
    if len(_phases(entry)) > 1:
        proposal.notes.append(f"{where}: {format_value(budget, 's', upper=True)} ({n_min} samples a run)")
    share = float(np.count_nonzero(np.asarray(pooled) <= budget)) / len(pooled)
    projected = samples_to_decide(q, confidence, share)
    need = max(bound_needs, math.ceil((projected or 0) * tau))
    proposal.how = (
        f"upper {1 - ff / 2:.3g} bound of the pooled p{p_star * 100:.4g} ({len(pooled)} samples, tau {tau:.2f}), "
        f"the quantile under which a run of {n_min} samples (n_eff {n_eff_min:.0f}) keeps its deciding order "
        f"statistic with probability {1 - ff / 2:.3g}; x exp({_z(ff):.2f} x {spread:.3f}) for the runs' spread"
    )
    return budget, need


def _propose_share(entry: _Entry, runs: Sequence[Observations], ff: float, proposal: Proposal) -> None:
    judged = _per_phase(entry, runs, proposal, lambda phase: _share_phase(entry, runs, ff, proposal, phase))
    if judged is None:
        return
    proposal.proposed = min(floor for floor, _, _ in judged)
    proposal.samples_needed = max(need for _, need, _ in judged)
    if proposal.unit == "requests/s":
        scales = [scale for _, _, phase_scales in judged for scale in phase_scales]
        if not scales:
            proposal.notes.append("no closed phase windows: no rate to propose")
            proposal.proposed = None
            return
        proposal.proposed = proposal.proposed * min(scales)
        proposal.how += f"; times the fewest judged requests per second ({min(scales):.4g}/s)"


def _share_phase(entry: _Entry, runs: Sequence[Observations], ff: float, proposal: Proposal,
                 phase: str | None) -> tuple[float, int, list[float]] | None:
    """One phase's proposed share floor, the samples a run needs to decide it, and (goodput by
    rate) each run's judged requests per second; None (with a note) when a run has nothing to judge."""
    confidence: float = entry.params["confidence"]
    where = f"phase {phase}" if phase else "the run"
    series = [entry.spec.samples(run, phase) or [] for run in runs]
    if any(not s for s in series):
        proposal.notes.append(f"{where}: a run has nothing to judge; nothing to propose from")
        return None
    sizes = [sample_size(s) for s in series]
    lowers = [judge_share(s, 0.0, confidence)[2] for s in series]
    shares = [sum(s) / len(s) for s in series]
    n_min, n_eff_min = min(len(s) for s in series), min(z.n_eff for z in sizes)
    tau = max(z.tau for z in sizes)
    proposal.per_run = list[float | None](shares) if len(_phases(entry)) == 1 else proposal.per_run
    proposal.samples_per_run = min(n_min, proposal.samples_per_run or n_min)
    proposal.n_eff_per_run = min(n_eff_min, proposal.n_eff_per_run or n_eff_min)
    pooled = [v for s in series for v in s]
    good = int(sum(pooled))
    pooled_lower = proportion_bounds(good, len(pooled), 1.0 - ff / 2.0, two_sided=False,
                                     n_eff=len(pooled) / tau).lower or 0.0
    n_e = max(1, math.floor(n_eff_min))
    count = int(_stats.binom.ppf(ff / 2.0, n_e, pooled_lower))
    within = proportion_bounds(count, n_e, confidence).lower or 0.0
    base = min([within] + [lo for lo in lowers if lo is not None])
    spread = _spread(shares, log=False)
    floor = max(0.0, base - _z(ff) * spread)
    if len(_phases(entry)) > 1:
        proposal.notes.append(f"{where}: {format_value(floor, 'fraction', upper=False)} ({n_min} samples a run)")
    needed = share_samples_to_decide(good / len(pooled), floor, confidence)
    proposal.how = (
        f"Clopper-Pearson lower bound (confidence {confidence:g}) of the {ff / 2:.3g}-quantile of a run's effective "
        f"count ({n_e} of {n_min} samples) at the pooled share's lower {1 - ff / 2:.3g} bound {pooled_lower:.4f}; "
        f"minus {_z(ff):.2f} x {spread:.4f} for the runs' spread"
    )
    return floor, (math.ceil(needed * tau) if needed is not None else 0), _request_rates(proposal, runs, series, phase)


def _request_rates(proposal: Proposal, runs: Sequence[Observations], series: list[list[float]],
                   phase: str | None) -> list[float]:
    """A share floor by rate (goodput's ``min_rate``): each run's judged requests per second over the
    phase window (closed windows only)."""
    if proposal.unit != "requests/s":
        return []
    rates = []
    for run, s in zip(runs, series, strict=True):
        span = window(run, phase)
        if span is not None and span[1] > span[0]:
            rates.append(len(s) / ((span[1] - span[0]) / NS))
    return rates


def _propose_throughput(entry: _Entry, runs: Sequence[Observations], ff: float, proposal: Proposal) -> None:
    floors = _per_phase(entry, runs, proposal, lambda phase: _throughput_phase(entry, runs, ff, proposal, phase))
    if floors is not None:
        proposal.proposed = min(floors)


def _throughput_phase(entry: _Entry, runs: Sequence[Observations], ff: float, proposal: Proposal,
                      phase: str | None) -> float | None:
    """One phase's proposed floor: the runs' geometric mean less their spread, never above the
    slowest run; None (with a note) when a run has no figure."""
    figures = [entry.spec.judge(run, phase).figure for run in runs]
    if any(f is None or f <= 0 for f in figures):
        proposal.notes.append(f"{'phase ' + phase if phase else 'the run'}: a run has no throughput figure")
        return None
    values = [float(f) for f in figures if f is not None]
    proposal.per_run = list[float | None](values) if len(_phases(entry)) == 1 else proposal.per_run
    spread = _spread(values, log=True)
    centre = math.exp(statistics.fmean(math.log(v) for v in values))
    floor = min(min(values), centre * math.exp(-_z(ff) * spread))
    if len(_phases(entry)) > 1:
        proposal.notes.append(f"phase {phase}: {format_value(floor, proposal.unit, upper=False)}")
    proposal.how = (
        f"the runs' geometric mean x exp(-{_z(ff):.2f} x {spread:.4f}) (their log spread), "
        "never above the slowest run"
    )
    return floor


_METHODS: dict[str, Callable[[_Entry, Sequence[Observations], float, Proposal], None]] = {
    "quantile": lambda e, r, ff, p: _propose_quantile(e, r, ff, p),
    "share": lambda e, r, ff, p: _propose_share(e, r, ff, p),
    "floor": lambda e, r, ff, p: _propose_throughput(e, r, ff, p),
}


def propose_entry(index: int, name: str, spec: SlaCheck, phases: tuple[str, ...] | None,
                  runs: Sequence[Observations], false_fail: float, headroom: float = 0.0) -> Proposal:
    """The proposal for one SLA entry (``index``, ``name``, scoped to ``phases``) from the healthy
    runs' observations, by its kind's ``budget_rule()``, ``headroom`` applied last (see above)."""
    rule: BudgetRule = spec.budget_rule()
    if rule.method == "policy" or rule.key is None:
        return Proposal(index, name, spec.kind, None, "", None, None, notes=[f"not proposed: {rule.why}"])
    proposal = Proposal(index, name, spec.kind, rule.key, rule.unit, spec.params.get(rule.key), None)
    _METHODS[rule.method](_Entry(spec, phases), runs, false_fail, proposal)
    _add_headroom(proposal, headroom)
    return proposal


def _add_headroom(proposal: Proposal, headroom: float) -> None:
    """Room for a box that differs from the baselines': latency budgets up, rate floors down."""
    if not headroom or proposal.proposed is None or proposal.unit == "fraction":
        return
    scale = 1.0 + headroom if proposal.unit == "s" else 1.0 - headroom
    before = proposal.proposed
    proposal.proposed = before * scale
    shown = format_value(before, proposal.unit, upper=proposal.unit == "s")
    proposal.notes.append(f"with {headroom * 100:g}% headroom: {shown} x {scale:g}")
