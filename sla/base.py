"""What every SLA verifier is: a frozen spec whose fields are its kind's parameters, judging observations
into a Verdict.

A verifier module defines one ``SlaSpec`` subclass (a frozen, keyword-only dataclass, as a fault
is), decorated with ``@verifier``: its ``kind``, ``summary`` and ``schema`` as class attributes, one
field per schema parameter (parsed, in base units: ``budget: 500ms`` is ``budget=0.5``), and
``judge(obs, phase)``, a pure function of the spec and the observations. A module imports nothing of
ours but the observation model and the leaf modules ``chaos.model.params`` / ``chaos.model.units``,
so a finished run can be re-judged offline. The experiment holds the spec (``SlaEntry.spec``);
``chaos.execution.verify.judge_entry`` makes the entry's verdict from it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Self, TypeVar

from chaos.model.errors import ExperimentInvalid
from chaos.model.observations import Observations
from chaos.model.params import Schema
from chaos.model.verdict import Status, Verdict  # the leaf; re-exported: ``sla.base.Verdict`` keeps working

__all__ = ["REGISTRY", "SlaSpec", "Status", "Verdict", "verifier"]


@dataclass(frozen=True, kw_only=True)
class SlaSpec(ABC):
    """One SLA entry's budgets, typed: its fields are the kind's schema, nothing of any run."""

    kind: ClassVar[str]
    summary: ClassVar[str]
    schema: ClassVar[Schema]

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Self:
        """The spec from values its schema already parsed (every parameter present, defaults filled)."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in params.items()})

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Self:
        """The spec from raw YAML values (``budget: 500ms``); ``ExperimentInvalid`` when they are wrong."""
        values, problems = cls.schema.parse(raw)
        if problems:
            raise ExperimentInvalid("; ".join(f"sla {cls.kind}{'.' + key if key else ''}: {message}"
                                              for key, message in problems))
        return cls.from_params(values)

    @property
    def params(self) -> dict[str, Any]:
        """The parameters as a mapping (for reports, budget proposals and messages)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @abstractmethod
    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        """The verdict of this entry on ``phase`` (None: the whole run). Pure."""


REGISTRY: dict[str, type[SlaSpec]] = {}
_SpecType = TypeVar("_SpecType", bound=type[SlaSpec])


def verifier(cls: _SpecType) -> _SpecType:
    """Class decorator: make an SLA kind known to experiments, `streamchaos list slas` and `verify`.
    Its fields must be its schema's parameters, one for one: the schema is what users write, the
    fields what the verifier reads, and a parameter in one but not the other is a bug."""
    if cls.kind in REGISTRY and REGISTRY[cls.kind] is not cls:
        raise AssertionError(f"verifier kind {cls.kind!r} registered twice")
    declared, schema = [f.name for f in fields(cls)], cls.schema.names()
    if sorted(declared) != sorted(schema):
        raise AssertionError(f"verifier {cls.kind!r}: fields {declared} are not its schema's parameters {schema}")
    REGISTRY[cls.kind] = cls
    return cls

