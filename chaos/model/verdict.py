"""A verdict: the judgement of one SLA entry on one phase. A leaf, so the run's result, its events
and its reports hold verdicts without importing the verifiers (``sla``).

``unobservable`` is a verdict whose evidence cannot exist on this target (an engine with no
``/metrics``, a profile without the series): not a decision, nor the undecided ``inconclusive`` of
evidence that could exist but is missing. How it counts is the entry's ``when_unobservable``
(``counts_as``): ``tolerate`` (the default) leaves the exit code to the other verdicts,
``inconclusive`` counts it as inconclusive, ``fail`` as a failed SLA. An ``expect: fail`` entry
is never tolerated: a defect that could not be seen was not caught (inconclusive, or failed with
``when_unobservable: fail``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["NOT_OBSERVABLE", "UNOBSERVABLE_POLICIES", "Status", "Unobservable", "Verdict", "counts_as"]

Status = Literal["pass", "fail", "inconclusive", "unobservable"]
Unobservable = Literal["tolerate", "inconclusive", "fail"]  # `sla[].when_unobservable`
UNOBSERVABLE_POLICIES: tuple[Unobservable, ...] = ("tolerate", "inconclusive", "fail")

NOT_OBSERVABLE = "not observable on this engine"  # how the console and the pages word an unobservable verdict


def counts_as(status: str, expect: str = "pass",
              when_unobservable: str = "tolerate") -> Literal["pass", "fail", "inconclusive"] | None:
    """The status as the exit code counts it: the status itself, or for ``unobservable`` what the
    entry's ``when_unobservable`` makes of it (None: tolerated, it counts for nothing). Pure; also
    for report.json's verdict dicts, which may come from before ``when_unobservable`` existed."""
    if status == "pass":
        return "pass"
    if status == "fail":
        return "fail"
    if status != "unobservable":
        return "inconclusive"
    if when_unobservable == "fail":
        return "fail"
    if when_unobservable == "inconclusive" or expect == "fail":
        return "inconclusive"  # (an expected failure that could not be seen is not a caught defect)
    return None


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
    when_unobservable: Unobservable = "tolerate"  # how an `unobservable` status counts (module docstring)

    @property
    def counts_as(self) -> Literal["pass", "fail", "inconclusive"] | None:
        """The status as the exit code counts it; None for a tolerated ``unobservable``."""
        return counts_as(self.status, self.expect, self.when_unobservable)

    @property
    def tolerated(self) -> bool:
        """An ``unobservable`` verdict that counts for nothing (``when_unobservable: tolerate``)."""
        return self.status == "unobservable" and self.counts_as is None

    @property
    def ok(self) -> bool:
        """Whether the verdict is what the experiment expected (a tolerated unobservable one is)."""
        if self.status == "unobservable":
            return self.tolerated
        return self.status == self.expect

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        body["ok"] = self.ok
        return body

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> Verdict:
        data = {k: v for k, v in body.items() if k != "ok"}
        return cls(**data)
