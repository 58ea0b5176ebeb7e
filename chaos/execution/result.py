"""What one run produced, and the exit code its verdicts give. A leaf: the run's events, its report
writer, ``verify`` and the pytest plugin hold a ``Result`` without importing the runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.model.context import ProxyInfo, TargetInfo
from chaos.model.experiment import Experiment
from chaos.model.observations import Observations
from chaos.model.verdict import Verdict

__all__ = ["Result", "exit_code_for"]


@dataclass
class Result:
    """What one run produced: verdicts, observations, where the files are, the exit code."""

    experiment: Experiment
    verdicts: list[Verdict]
    observations: Observations
    out_dir: Path
    status: str  # completed | interrupted | halted | failed
    exit_code: int
    started: float
    ended: float
    target: TargetInfo | None = None
    proxy: ProxyInfo | None = None
    client_lag: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def failing(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.ok]


def exit_code_for(verdicts: list[Verdict]) -> int:
    """0 all as expected, 1 an SLA not as expected (decisively), 3 inconclusive (docs/contracts.md). An
    ``unobservable`` verdict counts as its entry's ``when_unobservable`` says (``Verdict.counts_as``):
    tolerated, it leaves the code to the others."""
    if any(not v.ok and v.counts_as != "inconclusive" for v in verdicts):
        return 1
    if any(v.counts_as == "inconclusive" for v in verdicts):
        return 3
    return 0
