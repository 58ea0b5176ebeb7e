"""What every SLA verifier is: a frozen spec whose fields are its kind's parameters, judging observations
into a Verdict, and the one place every fact about its kind lives.

A verifier module defines one ``SlaSpec`` subclass (a frozen, keyword-only dataclass, as a fault
is), decorated with ``@verifier``, and is imported once in ``sla/__init__.py``. The class says:

- ``kind``, ``summary``, ``schema``: its name in YAML, one line for ``streamchaos list slas``, its
  parameters; one field per schema parameter (parsed, in base units: ``budget: 500ms`` is ``0.5``);
- the facts the rest of streamchaos reads instead of tables keyed by kind (``FACTS``): ``timing``,
  ``better``, ``capacity_fit``, ``needs``, ``sample_label`` (see their comments below);
- ``judge(obs, phase)``: the verdict, a pure function of the spec and the observations;
- ``samples(obs, phase)``: the values that verdict is judged on, which the budget proposer
  (``sla.budgets``) and the report's CDF (``chaos.output.reports.distributions``) read too;
- ``budget_rule()``: how ``streamchaos budgets`` proposes its budget from healthy runs, or why not;
- ``probe_halt(...)``: the condition that stops a capacity probe this entry has plainly failed.

``@verifier`` refuses a class that leaves one of these out. A module imports nothing of ours but the
model (``chaos.model``: observations, params, units, the verdict), so a finished run can be re-judged
offline. The experiment holds the spec (``SlaEntry.spec``); ``chaos.execution.verify.judge_entry``
makes the entry's verdict from it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal, Self, TypeVar, get_args

from chaos.model.context import HaltSpec
from chaos.model.errors import ExperimentInvalid
from chaos.model.observations import Observations
from chaos.model.params import Schema
from chaos.model.verdict import Status, Verdict  # the leaf; re-exported: ``sla.base.Verdict`` keeps working

__all__ = ["FACTS", "REGISTRY", "BudgetRule", "HaltSpec", "Need", "SlaSpec", "Status", "Verdict", "missing_facts",
           "verifier"]

# What a verdict reads of the engine beyond the client's own stamps (the support matrix's SLA table):
# a KV-usage series, a running-requests series, or the profile's end-of-stream rule as its very figure.
Need = Literal["kv_usage", "running", "end_of_stream"]  # as chaos.model.experiment.SlaCheck names them

# The class attributes every kind declares; ``@verifier`` and tests/sla/test_registry_facts.py check them.
FACTS = ("kind", "summary", "schema", "timing", "better", "capacity_fit", "needs", "sample_label")


@dataclass(frozen=True)
class BudgetRule:
    """How ``streamchaos budgets`` proposes an entry's budget from healthy runs (``sla.budgets``).

    ``method``: ``quantile`` (an upper bound of ``samples()``' quantile, in seconds; the spec's
    ``quantile`` and ``confidence`` parameters say which and how sure), ``share`` (a floor on the
    share of 1s among ``samples()``' 0/1 outcomes at the spec's ``confidence``; a ``requests/s`` unit
    scales it by each run's judged requests per second), ``floor`` (a point figure with no interval:
    ``judge``'s own figure), or ``policy`` (not proposed; ``why`` says why: a ceiling on failures is
    no measurement).
    """

    method: Literal["quantile", "share", "floor", "policy"]
    key: str | None = None  # the parameter that holds the budget (None: policy)
    unit: str = ""  # s | fraction | requests/s | tokens/s
    why: str = ""  # policy: why a healthy run's figures do not make this budget

    @classmethod
    def policy(cls, why: str) -> BudgetRule:
        return cls("policy", why=why)


@dataclass(frozen=True, kw_only=True)
class SlaSpec(ABC):
    """One SLA entry's budgets, typed: its fields are the kind's schema, nothing of any run."""

    kind: ClassVar[str]
    summary: ClassVar[str]
    schema: ClassVar[Schema]
    # A failure the load generator's own lateness or a busier host could explain (its figure is a
    # time, a rate or a sign of timing): ``judge_entry`` may call it inconclusive. A count of broken
    # streams is never the client's lateness.
    timing: ClassVar[bool]
    # Which way the figure improves: "lower" for a ceiling (a latency, a failed share), "higher" for a
    # floor (a rate, a share on time). ``streamchaos report --compare`` flags a change the other way.
    better: ClassVar[Literal["lower", "higher"]]
    # Whether it judges one window on its own, so a capacity probe (one window, no other phase) can
    # use it; a comparison of two phases (``recovery``) cannot.
    capacity_fit: ClassVar[bool]
    # What it reads of the engine beyond the client's stamps, in the order the support matrix names them.
    needs: ClassVar[tuple[Need, ...]]
    # What one value of ``samples()`` is, as the report's CDF axis says it ("time to first content",
    # in seconds); None: no distribution to draw (outcomes, counts or a point figure).
    sample_label: ClassVar[str | None]
    # Whether its verdict can be decided on the streams of its phase as they end, before the phase is
    # over: a phase that runs until decided (``duration: {min, max}``) judges such entries at each look
    # and stops once all are decided. False for kinds that need what comes after the phase (KV and
    # running requests back down after hang-ups, a hop closing its upstream, pods coming back, a rate
    # over the whole window): they are judged once, after the run, and never hold a phase open.
    decides_in_phase: ClassVar[bool] = True

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

    @abstractmethod
    def samples(self, obs: Observations, phase: str | None) -> list[float] | None:
        """The values ``judge`` decides on for ``phase``, in send order: seconds for a quantile, 0/1
        outcomes for a share; None when the verdict rests on no sample of values (counts, a point
        figure). The one sample the verifier, the budget proposer and the report's CDF all read. Pure."""

    @abstractmethod
    def budget_rule(self) -> BudgetRule:
        """How ``streamchaos budgets`` proposes this entry's budget, or why it does not."""

    @abstractmethod
    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        """The live condition that stops a capacity probe this entry has plainly failed: over ``window_s``
        (the whole probe) at ``factor`` times its budget, after ``min_streams`` streams; None: no
        halt can speak for it (the probe runs its window out). Named after the entry by the caller."""

    def lateness_explains(self, verdict: Verdict, lag_s: float) -> bool:
        """Whether a load generator running ``lag_s`` late could explain this (failed) verdict; asked
        only of ``timing`` kinds. A time over budget by less than the lag, or a ratio whose evidence
        says its excess in seconds (``excess_s``) within it; rates and ratios otherwise: yes (cautious)."""
        if isinstance(verdict.evidence.get("excess_s"), (int, float)):
            return float(verdict.evidence["excess_s"]) <= lag_s
        if verdict.unit != "s" or verdict.figure is None or verdict.budget is None:
            return True  # rates and ratios cannot be compared with a lag: be cautious
        return verdict.figure - verdict.budget <= lag_s


REGISTRY: dict[str, type[SlaSpec]] = {}
_SpecType = TypeVar("_SpecType", bound=type[SlaSpec])


def missing_facts(cls: type[SlaSpec]) -> list[str]:
    """The facts and methods ``cls`` leaves undeclared (empty: a complete kind)."""
    missing = [name for name in FACTS if not hasattr(cls, name)]
    return missing + sorted(getattr(cls, "__abstractmethods__", ()))


def verifier(cls: _SpecType) -> _SpecType:
    """Class decorator: make an SLA kind known to experiments, `streamchaos list slas`, `verify`,
    `budgets`, capacity probes and the reports. Its fields must be its schema's parameters, one for
    one (the schema is what users write, the fields what the verifier reads), and it must declare
    every fact and method above: a kind missing one would be silently mistreated elsewhere."""
    kind = getattr(cls, "kind", cls.__name__)
    if kind in REGISTRY and REGISTRY[kind] is not cls:
        raise AssertionError(f"verifier kind {kind!r} registered twice")
    declared, schema = [f.name for f in fields(cls)], cls.schema.names()
    if sorted(declared) != sorted(schema):
        raise AssertionError(f"verifier {kind!r}: fields {declared} are not its schema's parameters {schema}")
    missing = missing_facts(cls)
    if missing:
        raise AssertionError(f"verifier {kind!r} does not declare {', '.join(missing)} (see sla/base.py)")
    if cls.better not in ("lower", "higher") or not set(cls.needs) <= set(get_args(Need)):
        raise AssertionError(f"verifier {kind!r}: better is lower or higher, needs a tuple of {get_args(Need)}")
    REGISTRY[kind] = cls
    return cls
