"""`streamchaos list experiments`: the ready-to-run experiments shipped in the clone's experiments/.

``shipped_experiments`` reads each YAML file there (validated as `streamchaos validate` would);
``render_experiments`` is the pure rendering: file, name, faults, length and the first sentence of
its description. A file that does not validate is listed with its first problem, not hidden.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from chaos.model.errors import ChaosError, ExperimentInvalid

__all__ = ["Shipped", "experiments_dir", "render_experiments", "shipped_experiments"]


@dataclass(frozen=True)
class Shipped:
    """One shipped experiment file, as listed."""

    path: Path
    name: str
    summary: str
    faults: tuple[str, ...] = ()
    duration_s: float = 0.0
    problem: str | None = None  # the file does not validate: its first problem


def experiments_dir() -> Path:
    """The clone's experiments/ (beside the chaos package of an editable install or a clone)."""
    return Path(__file__).resolve().parents[2] / "experiments"


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def shipped_experiments(root: Path | None = None) -> list[Shipped]:
    """Every ``*.yaml`` under ``root`` (default: the clone's experiments/), sorted by file name."""
    from chaos.experiment import load_experiment

    folder = root or experiments_dir()
    if not folder.is_dir():
        raise ChaosError(f"{folder}: no experiments folder here (it ships with a clone of the repository)")
    out = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            exp = load_experiment(path)
        except ExperimentInvalid as exc:
            out.append(Shipped(path, path.stem, "", problem=str(exc.problems[0]) if exc.problems else str(exc)))
            continue
        kinds = tuple(dict.fromkeys(f.kind for p in exp.phases for f in p.faults))
        out.append(Shipped(path, exp.name, _first_sentence(exp.description or ""), kinds, exp.duration))
    return out


def render_experiments(found: Sequence[Shipped], folder: Path) -> str:
    """The list: one block per experiment, and how to run one. Pure."""
    from chaos.model.units import format_duration

    lines = [f"experiments in {folder}:"]
    for s in found:
        if s.problem is not None:
            lines.append(f"  {s.path.name}: DOES NOT VALIDATE: {s.problem}")
            continue
        faults = ", ".join(s.faults) or "no faults"
        lines.append(f"  {s.path.name}  ({s.name}; {format_duration(s.duration_s)} of load; {faults})")
        if s.summary:
            lines.append(f"      {s.summary}")
    if not found:
        lines.append("  none")
    lines.append("run one: streamchaos run experiments/<file> (add --dry-run to see what it would do first)")
    return "\n".join(lines) + "\n"
