"""A verdict: the judgement of one SLA entry on one phase. A leaf, so the run's result, its events
and its reports hold verdicts without importing the verifiers (``sla``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["Status", "Verdict"]

Status = Literal["pass", "fail", "inconclusive"]


@dataclass(frozen=True)
class Verdict:
    """The judgement of one SLA on one phase (or the whole run when ``phase`` is None)."""

    sla: str  # the kind, e.g. ttft
    phase: str | None
    status: Status
    figure: float | None  # the measured value compared with the budget
    budget: float | None
    unit: str  # s, fraction, tokens/s, ...
    samples: int
    evidence: dict[str, Any] = field(default_factory=dict)
    expect: Literal["pass", "fail"] = "pass"  # `expect: fail` asserts a known-bad stack is caught
    name: str = ""  # the entry's name in the experiment, defaults to the kind

    @property
    def ok(self) -> bool:
        """Whether the verdict is what the experiment expected."""
        return self.status == self.expect

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        body["ok"] = self.ok
        return body

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> Verdict:
        data = {k: v for k, v in body.items() if k != "ok"}
        return cls(**data)
