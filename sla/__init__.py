"""The SLA verifiers: pure functions from a run's observations to verdicts, one module per kind.

Importing ``sla`` registers every verifier in ``sla.REGISTRY``; ``judge`` runs one by kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chaos.errors import ExperimentInvalid
from chaos.observations import Observations
from chaos.params import suggest
from sla import (  # noqa: F401  (registers)
    capacity,
    early_close,
    errors,
    fluidity,
    goodput,
    integrity,
    itl,
    kv_cleanup,
    recovery,
    streaming,
    throughput,
    ttft,
)
from sla.base import REGISTRY, Status, Verdict, VerifierSpec, verifier

__all__ = ["REGISTRY", "Status", "Verdict", "VerifierSpec", "judge", "verifier"]


def judge(
    obs: Observations,
    kind: str,
    params: Mapping[str, Any] | None = None,
    phase: str | None = None,
    *,
    parsed: bool = False,
) -> Verdict:
    """Run the verifier ``kind`` on ``obs``.

    ``params`` are raw, as written in YAML (``budget: 500ms``), and go through the kind's schema
    first; pass ``parsed=True`` for values the schema already parsed (the runner's case). Raises
    ``ExperimentInvalid`` for an unknown kind or parameters the schema rejects.
    """
    spec = REGISTRY.get(kind)
    if spec is None:
        known = ", ".join(sorted(REGISTRY))
        raise ExperimentInvalid(f"unknown SLA kind {kind!r}{suggest(kind, REGISTRY)}; known kinds: {known}")
    if parsed:
        values = dict(params or {})
    else:
        values, problems = spec.schema.parse(params or {})
        if problems:
            raise ExperimentInvalid(
                "; ".join(f"sla {kind}{'.' + key if key else ''}: {message}" for key, message in problems)
            )
    return spec.fn(obs, values, phase)
