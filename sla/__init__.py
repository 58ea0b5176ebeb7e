"""The SLA verifiers: pure functions from a run's observations to verdicts, one module per kind
(the kind ``errors`` in ``stream_errors``: the share of streams that failed, not an exception family).

Importing ``sla`` registers every verifier in ``sla.REGISTRY``; ``judge`` runs one by kind. A new
kind is one module here (one ``SlaSpec`` subclass under ``@verifier``, declaring every fact
``sla/base.py`` lists) and its name in the import below; nothing outside ``sla/`` keys on kind names.
``sla.budgets`` (budget proposals from healthy runs) is imported by ``streamchaos budgets`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chaos.model.errors import ExperimentInvalid
from chaos.model.observations import Observations
from chaos.model.params import suggest
from sla import (  # noqa: F401  (registers)
    abort_path,
    abort_propagation,
    capacity,
    context_kept,
    early_close,
    fluidity,
    goodput,
    integrity,
    itl,
    kv_cleanup,
    recovery,
    relay,
    stream_errors,
    streaming,
    throughput,
    tool_calls,
    ttft,
)
from sla.base import REGISTRY, SlaSpec, Status, Verdict, verifier

__all__ = ["REGISTRY", "SlaSpec", "Status", "Verdict", "judge", "spec_for", "verifier"]


def spec_for(kind: str, params: Mapping[str, Any] | None = None, *, parsed: bool = False) -> SlaSpec:
    """The typed spec of an SLA entry of ``kind``.

    ``params`` are raw, as written in YAML (``budget: 500ms``), and go through the kind's schema
    first; pass ``parsed=True`` for values the schema already parsed. Raises ``ExperimentInvalid``
    for an unknown kind or parameters the schema rejects.
    """
    cls = REGISTRY.get(kind)
    if cls is None:
        known = ", ".join(sorted(REGISTRY))
        raise ExperimentInvalid(f"unknown SLA kind {kind!r}{suggest(kind, REGISTRY)}; known kinds: {known}")
    return cls.from_params(params or {}) if parsed else cls.parse(params or {})


def judge(
    obs: Observations,
    kind: str,
    params: Mapping[str, Any] | None = None,
    phase: str | None = None,
    *,
    parsed: bool = False,
) -> Verdict:
    """Run the verifier ``kind`` on ``obs`` with ``params`` (see ``spec_for``): the raw verdict,
    before an experiment entry's name, expectation and the run-wide rules (``judge_entry``)."""
    return spec_for(kind, params, parsed=parsed).judge(obs, phase)
