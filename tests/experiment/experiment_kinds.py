"""Test-only fault and SLA kinds (the conftest registers them for this folder's tests): a module of
its own, importable by name, so an experiment holding them pickles as a real one does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chaos.model.params import Param, Schema
from faults.base import Fault, Injection
from sla.base import BudgetRule, HaltSpec, SlaSpec, Verdict


@dataclass(frozen=True, kw_only=True)
class LatencyFault(Fault):
    """Adds latency through the proxy (a stand-in for network.latency)."""

    kind = "test.latency"
    summary = "test-only: delay every chunk through the proxy"
    schema = Schema((
        Param("latency", "duration", required=True, doc="added delay"),
        Param("jitter", "duration", 0.0, doc="random extra delay"),
        Param("toxicity", "fraction", 1.0, doc="share of connections affected"),
    ))

    latency: float
    jitter: float
    toxicity: float

    def problems(self, experiment: Any) -> list[tuple[str, str]]:
        if not experiment.proxy.enabled:
            return [("", "test.latency acts through the proxy; add a `proxy:` section")]
        return []

    def activate(self, ctx: Any) -> Injection:
        raise NotImplementedError("test kinds are only parsed, never run")


@dataclass(frozen=True, kw_only=True)
class HangupFault(Fault):
    """A client fault with an exactly-one-of group (a stand-in for client.disconnect)."""

    kind = "test.hangup"
    summary = "test-only: clients hang up"
    schema = Schema(
        (
            Param("fraction", "fraction", 1.0),
            Param("after_tokens", "int_or_range", min=0),
            Param("after", "duration"),
        ),
        one_of=(("after_tokens", "after"),),
    )

    fraction: float
    after_tokens: tuple[int, int] | None
    after: float | None

    def activate(self, ctx: Any) -> Injection:
        raise NotImplementedError("test kinds are only parsed, never run")


@dataclass(frozen=True, kw_only=True)
class QuantileSlo(SlaSpec):
    """A quantile budget (a stand-in for ttft): only parsed, never judged."""

    kind = "test.slo"
    summary = "test-only: a quantile budget"
    schema = Schema((
        Param("budget", "duration", required=True, doc="the most it may be"),
        Param("quantile", "float", 0.99, min=0.5, max=0.999, doc="which quantile"),
    ))

    timing = True
    better = "lower"
    capacity_fit = True
    needs = ()
    sample_label = None

    budget: float
    quantile: float

    def judge(self, obs: Any, phase: str | None) -> Verdict:
        return Verdict("test.slo", phase, "inconclusive", None, None, "s", 0)

    def samples(self, obs: Any, phase: str | None) -> list[float] | None:
        return None

    def budget_rule(self) -> BudgetRule:
        return BudgetRule.policy("test-only")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return None


SLO = QuantileSlo
