"""`streamchaos budgets RUN_DIR...`: budgets a healthy stack meets, proposed from its own runs.

This module reads the runs (``load_baselines``), asks each SLA entry's kind for its proposal
(``sla.budgets.propose_entry``: the statistics, and why a budget that is a policy is left as it
is), prints the table (``render_proposals``) and, with ``--write``, edits those values in the
experiment file in place (``chaos.experiment.yamledit``) and re-validates it (``write_budgets``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from chaos.experiment import Experiment, load_experiment, parse_experiment
from chaos.experiment.yamledit import apply_edits
from chaos.model.errors import ExperimentInvalid, UsageError
from chaos.model.observations import Observations
from sla.budgets import Proposal, propose_entry

__all__ = ["Baseline", "Proposal", "load_baselines", "propose", "render_proposals", "write_budgets"]

DEFAULT_FALSE_FAIL = 0.01
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


def propose(runs: list[Baseline], false_fail: float = DEFAULT_FALSE_FAIL, headroom: float = 0.0) -> list[Proposal]:
    """One proposal per SLA entry of the runs' experiment, ``headroom`` applied last (``sla.budgets``)."""
    if not 0.0 < false_fail < 0.5:
        raise UsageError(f"--false-fail must lie between 0 and 50%, found {false_fail:g}")
    if not 0.0 <= headroom < 1.0:
        raise UsageError(f"--headroom must lie between 0 and 100% (exclusive), found {headroom:g}")
    observed = [run.obs for run in runs]
    return [propose_entry(index, entry.name, entry.spec, entry.phases, observed, false_fail, headroom)
            for index, entry in enumerate(runs[0].experiment.sla)]


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
