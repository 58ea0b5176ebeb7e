"""`streamchaos budgets RUN_DIR...`: budgets a healthy stack meets, proposed from its own runs.

Budgets copied from examples are guesses. Given finished runs of one experiment on a healthy
stack, this proposes for each SLA entry (over its phases) the tightest budget that a healthy run
of the same length still *passes* with probability at least ``1 - false_fail``, and how many
samples a run needs for that budget to be decidable at all.

How, for a quantile budget (``ttft``, ``itl``). A run passes when the upper bound of its
interval, the order statistic X_(k) that ``sla.stats`` picks for its n samples worth n_eff,
is within the budget. For n_e effective samples F(X_(k)) ~ Beta(k, n_e - k + 1), so with
probability 1 - ff/2 a run's deciding statistic lies below the population's p*-quantile,
p* = Beta⁻¹(1 - ff/2; k, n_e - k + 1), taking the shortest run and the smallest n_eff among the
given ones. The p*-quantile is bounded from above (one-sided, 1 - ff/2) from all runs' samples
pooled, counted at the largest τ any run showed; the budget is that bound, or the largest run's
own deciding statistic if higher, times exp(z_(1-ff) · s) where s is the standard deviation of
the runs' log sample quantiles: the run-to-run variation (one run: none can be measured, and the
output says so). For a share floor (``goodput`` min_share, ``fluidity`` min_on_time) the same
two steps run on the binomial: the pooled share's lower bound (1 - ff/2), the ff/2-quantile of a
run's effective count at that share, that count's Clopper-Pearson lower bound at the entry's
confidence, then minus z · (s.d. of the runs' shares). A ``throughput`` floor, a point figure
with no interval, is the runs' geometric mean minus z of their log spread, and never above the
slowest run. Entries whose budget is a policy rather than a measurement (errors, early closes,
integrity, KV cleanup, recovery) are listed and left as they are.

The false-fail promise holds for a rerun on the box the runs came from, as it was then. A shared
CI machine is not: a rerun minutes later beside other work read an ITL p90 5% over the baselines'
own and straddled a budget proposed from them. ``headroom`` (``--headroom 25%``) is the room for
that, stated and applied last: latency budgets times (1 + headroom), rate floors times
(1 - headroom); share floors keep their binomial allowance, which a slower box does not move
unless its objective is within reach of the drift.

Rounding never tightens: budgets round up and floors round down, to three significant digits.
``--write`` edits those values in the experiment file in place (``chaos.experiment.yamledit``)
and re-validates it.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
from scipy import stats as _stats

from chaos.experiment import Experiment, SlaEntry, load_experiment, parse_experiment
from chaos.experiment.yamledit import apply_edits
from chaos.model.errors import ExperimentInvalid, UsageError
from chaos.model.observations import NS, Observations
from chaos.model.units import format_duration

__all__ = ["Baseline", "Proposal", "load_baselines", "propose", "render_proposals", "write_budgets"]

DEFAULT_FALSE_FAIL = 0.01
_T = TypeVar("_T")
COLUMN_KEY = (  # what the table's columns mean, in plain words
    "CURRENT: the budget the experiment has now; PROPOSED: the tightest one a healthy run still passes "
    "(with the probability above).",
    "RUNS: each run's own deciding figure. SAMPLES/RUN: the fewest samples (streams, or token gaps) one run had; "
    "(n_eff N): successive samples are alike, so they carry as much information as N independent ones would.",
    "NEEDED: how many samples, counted like SAMPLES/RUN (not like n_eff), a run needs for its verdict on the "
    "proposed budget to be pass or fail rather than inconclusive; a run with fewer: lengthen the phase.",
)


@dataclass(frozen=True)
class Baseline:
    """One finished healthy run: where it is, the experiment it ran, what it observed."""

    run_dir: Path
    experiment: Experiment
    obs: Observations


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


def _judged_nothing(run_dir: Path) -> bool:
    """Whether the run's report.json says it ended before any verdict (no report.json: it is judged on its journal)."""
    from chaos.model.outcome import judged_nothing

    try:
        report = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(report, dict) and judged_nothing(report)


def load_baselines(run_dirs: Sequence[str | Path], *, left_out: list[Path] | None = None) -> list[Baseline]:
    """Read finished run directories; they must be runs of one experiment with the same SLA entries.

    A run that ended before any verdict (failed or stopped during setup) is no healthy run: it is
    appended to ``left_out`` and not read.
    """
    if not run_dirs:
        raise UsageError("streamchaos budgets: give at least one run directory of a healthy run")
    out: list[Baseline] = []
    skipped: list[Path] = []
    for raw in run_dirs:
        run_dir = Path(raw)
        journal, stored = run_dir / "journal.jsonl", run_dir / "experiment.yaml"
        if not journal.is_file() or not stored.is_file():
            raise UsageError(f"{run_dir} is not a finished run directory (needs journal.jsonl and experiment.yaml)")
        if _judged_nothing(run_dir):
            skipped.append(run_dir)
            continue
        out.append(Baseline(run_dir, load_experiment(stored), Observations.load(journal)))
    if left_out is not None:
        left_out.extend(skipped)
    if not out:
        raise UsageError(f"streamchaos budgets: none of the {len(skipped)} run(s) got as far as a verdict "
                         "(each failed or was stopped during setup): give runs that finished")
    first = out[0]
    shape = [(e.name, e.kind) for e in first.experiment.sla]
    for other in out[1:]:
        if other.experiment.name != first.experiment.name or [(e.name, e.kind) for e in other.experiment.sla] != shape:
            raise UsageError(
                f"{other.run_dir} ran experiment {other.experiment.name!r} with SLA entries "
                f"{[e.name for e in other.experiment.sla]}, {first.run_dir} ran {first.experiment.name!r} with "
                f"{[e.name for e in first.experiment.sla]}: give runs of one experiment"
            )
    return out


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


# -- the series each kind judges -----------------------------------------------------------------


def _quantile_series(entry: SlaEntry, obs: Observations, phase: str | None) -> list[float]:
    """What the verifier takes quantiles of, in send order, in seconds. TTFT keeps every wait
    censored without content (a lower bound of that TTFT): a budget under it would not pass."""
    if entry.kind == "ttft":
        from sla.ttft import judged_in_send_order

        return [v / NS for v in judged_in_send_order(obs.population(phase), 0.0)]
    from sla.itl import gaps_in_send_order

    return [g / NS for g in gaps_in_send_order(obs, phase)]


def _share_series(entry: SlaEntry, obs: Observations, phase: str | None) -> list[float]:
    """The 0/1 outcomes a share verifier judges, in send order."""
    population = sorted(obs.population(phase), key=lambda st: st.t_sent if st.t_sent is not None else 0)
    if entry.kind == "goodput":
        from sla.goodput import Objectives, request_outcome

        objectives = Objectives(entry.params.get("ttft"), entry.params.get("tpot"), entry.params.get("e2e"))
        outcomes = (request_outcome(st, objectives)[0] for st in population)
        return [1.0 if good else 0.0 for good in outcomes if good is not None]
    from sla.fluidity import deadlines

    return [float(v) for st in population
            for v in deadlines(st, entry.params["pace"], entry.params.get("ttft")).outcomes]


# -- proposals -----------------------------------------------------------------------------------


def _z(false_fail: float) -> float:
    return float(_stats.norm.ppf(1.0 - false_fail))


def _spread(values: Sequence[float], log: bool) -> float:
    """The runs' standard deviation (of logs for positive figures); 0 for fewer than two runs."""
    if len(values) < 2:
        return 0.0
    xs = [math.log(v) for v in values if v > 0] if log else list(values)
    return statistics.stdev(xs) if len(xs) >= 2 else 0.0


def _phases(entry: SlaEntry) -> tuple[str | None, ...]:
    return entry.phases or (None,)


def _per_phase(entry: SlaEntry, runs: list[Baseline], proposal: Proposal,
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


def _propose_quantile(entry: SlaEntry, runs: list[Baseline], ff: float, proposal: Proposal) -> None:
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


def _quantile_phase(entry: SlaEntry, runs: list[Baseline], ff: float, proposal: Proposal,
                    phase: str | None) -> tuple[float, int] | None:
    """One phase's proposed quantile budget and the samples a run needs to decide it; None (with a
    note) when the runs cannot ground one."""
    from sla.stats import _upper_index, quantile_bounds, sample_quantile, sample_size, samples_needed, samples_to_decide

    q: float = entry.params["quantile"]
    confidence: float = entry.params["confidence"]
    alpha = (1.0 - confidence) / 2.0
    where = f"phase {phase}" if phase else "the run"
    series = [_quantile_series(entry, run.obs, phase) for run in runs]
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


def _propose_share(entry: SlaEntry, runs: list[Baseline], ff: float, proposal: Proposal) -> None:
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


def _share_phase(entry: SlaEntry, runs: list[Baseline], ff: float, proposal: Proposal,
                 phase: str | None) -> tuple[float, int, list[float]] | None:
    """One phase's proposed share floor, the samples a run needs to decide it, and (goodput by
    rate) each run's judged requests per second; None (with a note) when a run has nothing to judge."""
    from sla.stats import judge_share, proportion_bounds, sample_size, share_samples_to_decide

    confidence: float = entry.params["confidence"]
    where = f"phase {phase}" if phase else "the run"
    series = [_share_series(entry, run.obs, phase) for run in runs]
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
    return floor, (math.ceil(needed * tau) if needed is not None else 0), _request_rates(entry, runs, series, phase)


def _request_rates(entry: SlaEntry, runs: list[Baseline], series: list[list[float]], phase: str | None) -> list[float]:
    """Goodput by rate: each run's judged requests per second over the phase window (closed windows only)."""
    if entry.kind != "goodput" or entry.params.get("min_rate") is None:
        return []
    from sla.throughput import window

    rates = []
    for run, s in zip(runs, series, strict=True):
        span = window(run.obs, phase)
        if span is not None and span[1] > span[0]:
            rates.append(len(s) / ((span[1] - span[0]) / NS))
    return rates


def _propose_throughput(entry: SlaEntry, runs: list[Baseline], ff: float, proposal: Proposal) -> None:
    floors = _per_phase(entry, runs, proposal, lambda phase: _throughput_phase(entry, runs, ff, proposal, phase))
    if floors is not None:
        proposal.proposed = min(floors)


def _throughput_phase(entry: SlaEntry, runs: list[Baseline], ff: float, proposal: Proposal,
                      phase: str | None) -> float | None:
    """One phase's proposed floor: the runs' geometric mean less their spread, never above the
    slowest run; None (with a note) when a run has no figure."""
    figures = [entry.spec.judge(run.obs, phase).figure for run in runs]
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


_KEYS: dict[str, Callable[[SlaEntry], tuple[str, str]]] = {
    "ttft": lambda e: ("budget", "s"),
    "itl": lambda e: ("budget", "s"),
    "goodput": lambda e: (
        ("min_rate", "requests/s") if e.params.get("min_rate") is not None
        else ("min_share", "fraction")
    ),
    "fluidity": lambda e: ("min_on_time", "fraction"),
    "throughput": lambda e: (
        ("min_tokens_per_s", "tokens/s") if e.params.get("min_tokens_per_s") is not None
        else ("min_requests_per_s", "requests/s")
    ),
}

_POLICY = {
    "errors": "a ceiling on failures is a policy, not a measurement",
    "early_close": "a ceiling on early closes is a policy, not a measurement",
    "integrity": "integrity has no budget: any corrupted stream fails it",
    "kv_cleanup": "the cleanup time is bounded by the engine's step, not by load: keep the stated bound",
    "abort_propagation": "orphaned requests are a bug, not a load figure: keep the stated bound",
    "recovery": "a recovery ratio compares phases of one run; it is not a baseline figure",
    "streaming": "a buffered share is a policy: responses stream or they do not",
}


def propose(runs: list[Baseline], false_fail: float = DEFAULT_FALSE_FAIL, headroom: float = 0.0) -> list[Proposal]:
    """One proposal per SLA entry of the runs' experiment, ``headroom`` applied last (see above)."""
    if not 0.0 < false_fail < 0.5:
        raise UsageError(f"--false-fail must lie between 0 and 50%, found {false_fail:g}")
    if not 0.0 <= headroom < 1.0:
        raise UsageError(f"--headroom must lie between 0 and 100% (exclusive), found {headroom:g}")
    proposals: list[Proposal] = []
    for index, entry in enumerate(runs[0].experiment.sla):
        if entry.kind not in _KEYS:
            proposals.append(Proposal(
                index, entry.name, entry.kind, None, "", None, None,
                notes=[f"not proposed: {_POLICY.get(entry.kind, 'no baseline rule for this kind')}"],
            ))
            continue
        key, unit = _KEYS[entry.kind](entry)
        proposal = Proposal(index, entry.name, entry.kind, key, unit, entry.params.get(key), None)
        if entry.kind in ("ttft", "itl"):
            _propose_quantile(entry, runs, false_fail, proposal)
        elif entry.kind in ("goodput", "fluidity"):
            _propose_share(entry, runs, false_fail, proposal)
        else:
            _propose_throughput(entry, runs, false_fail, proposal)
        _add_headroom(proposal, headroom)
        proposals.append(proposal)
    return proposals


def _add_headroom(proposal: Proposal, headroom: float) -> None:
    """Room for a box that differs from the baselines': latency budgets up, rate floors down."""
    if not headroom or proposal.proposed is None or proposal.unit == "fraction":
        return
    scale = 1.0 + headroom if proposal.unit == "s" else 1.0 - headroom
    before = proposal.proposed
    proposal.proposed = before * scale
    shown = format_value(before, proposal.unit, upper=proposal.unit == "s")
    proposal.notes.append(f"with {headroom * 100:g}% headroom: {shown} x {scale:g}")


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value * 1000:.3g}ms" if value < 1 else f"{value:.3g}s"
    if unit == "fraction":
        return f"{value * 100:.4g}%"
    return f"{value:.4g}/s"


def render_proposals(proposals: list[Proposal], runs: list[Baseline], false_fail: float,
                     headroom: float = 0.0) -> str:
    """The table `streamchaos budgets` prints, with how each budget was found."""
    room = f", plus {headroom * 100:g}% headroom for a box unlike theirs" if headroom else ""
    lines = [
        f"{runs[0].experiment.name}: budgets from {len(runs)} healthy run(s), "
        f"each passed by a healthy run with probability >= {1 - false_fail:.4g}{room}",
        "",
    ]
    rows = [("SLA", "KIND", "KEY", "CURRENT", "PROPOSED", "RUNS", "SAMPLES/RUN", "NEEDED")]
    for p in proposals:
        per_run = " ".join(_fmt(v, p.unit) for v in p.per_run) if p.per_run else "-"
        samples = "-" if p.samples_per_run is None else (
            f"{p.samples_per_run}" + (f" (n_eff {p.n_eff_per_run:.0f})" if p.n_eff_per_run is not None
                                      and p.n_eff_per_run < p.samples_per_run else "")
        )
        rows.append((p.name, p.kind, p.key or "-", _fmt(p.current, p.unit), p.text or "-", per_run, samples,
                     "-" if p.samples_needed is None else str(p.samples_needed)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    lines.extend(COLUMN_KEY)
    lines.append("")
    for p in proposals:
        if p.how:
            lines.append(f"{p.name}, how it was found: {p.how}")
        lines.extend(f"{p.name}: {note}" for note in p.notes)
    return "\n".join(lines).rstrip() + "\n"


def write_budgets(path: str | Path, proposals: list[Proposal], runs: list[Baseline]) -> list[str]:
    """Write the proposed values into the experiment file at ``path`` in place; returns what changed.

    The file's SLA entries must be the runs' (same names and kinds, in order). The edited text is
    validated before it replaces the file; a file that would not validate is left untouched.
    """
    target = Path(path)
    try:
        text = target.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{target}: cannot read it: {exc.strerror or exc}") from None
    current = parse_experiment(text, str(target))
    mine = [(e.name, e.kind) for e in current.sla]
    theirs = [(e.name, e.kind) for e in runs[0].experiment.sla]
    if mine != theirs:
        raise UsageError(f"{target}: its SLA entries {mine} are not the runs' {theirs}; give the experiment they ran")
    edits = {("sla", p.index, p.key): p.text for p in proposals if p.key is not None and p.text is not None}
    if not edits:
        return []
    new_text = apply_edits(text, {k: v for k, v in edits.items() if v is not None}, str(target))
    try:
        parse_experiment(new_text, str(target))
    except ExperimentInvalid as exc:
        raise UsageError(f"{target}: the proposed budgets would not validate, file left as it was:\n{exc}") from None
    target.write_text(new_text, encoding="utf-8")
    return [f"sla[{i}].{key}: {value}" for (_, i, key), value in edits.items()]
