"""Test-only fault and SLA kinds, registered for this package's tests and removed afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import faults  # noqa: F401  (registers the real fault kinds first, so ours cannot shadow them)
import sla  # noqa: F401
from chaos.params import Param, Schema
from faults.base import REGISTRY as FAULTS
from faults.base import Fault, Injection
from sla.base import REGISTRY as VERIFIERS
from sla.base import Verdict, VerifierSpec


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


def _never(obs: Any, params: Any, phase: str | None) -> Verdict:
    return Verdict("test.slo", phase, "inconclusive", None, None, "s", 0)


SLO = VerifierSpec(
    "test.slo",
    Schema((
        Param("budget", "duration", required=True, doc="the most it may be"),
        Param("quantile", "float", 0.99, min=0.5, max=0.999, doc="which quantile"),
    )),
    "test-only: a quantile budget",
    _never,
)

TEST_FAULTS: dict[str, type[Fault]] = {LatencyFault.kind: LatencyFault, HangupFault.kind: HangupFault}


@pytest.fixture(scope="module", autouse=True)
def registered_test_kinds() -> Iterator[None]:
    """Register the test kinds for each module; remove them (and only them) afterwards.

    Module scope, not package: this directory is no package, and a "package" fixture here would
    live until the end of the session and leak the test kinds into other directories' tests.
    """
    FAULTS.update(TEST_FAULTS)
    VERIFIERS[SLO.kind] = SLO
    try:
        yield
    finally:
        for kind in TEST_FAULTS:
            FAULTS.pop(kind, None)
        VERIFIERS.pop(SLO.kind, None)
