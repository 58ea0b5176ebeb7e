"""What every SLA verifier is: a kind with a parameter schema and a pure function to a Verdict.

A verifier module defines one function ``(observations, params, phase) -> Verdict`` and decorates
it with ``@verifier(kind, schema, summary)``. It imports nothing of ours but the observation model
and the leaf modules ``chaos.params`` / ``chaos.units``, so a finished run can be re-judged offline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from chaos.observations import Observations
from chaos.params import Schema

__all__ = ["REGISTRY", "Status", "Verdict", "VerifierSpec", "verifier"]

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


VerifyFn = Callable[[Observations, Mapping[str, Any], "str | None"], Verdict]


@dataclass(frozen=True)
class VerifierSpec:
    kind: str
    schema: Schema
    summary: str
    fn: VerifyFn


REGISTRY: dict[str, VerifierSpec] = {}


def verifier(kind: str, schema: Schema, summary: str) -> Callable[[VerifyFn], VerifyFn]:
    """Register a verifier function under ``kind``."""

    def wrap(fn: VerifyFn) -> VerifyFn:
        if kind in REGISTRY:
            raise AssertionError(f"verifier kind {kind!r} registered twice")
        REGISTRY[kind] = VerifierSpec(kind, schema, summary, fn)
        return fn

    return wrap
