"""streamchaos: chaos experiments for LLM token-streaming stacks.

The front door. Importing it starts nothing and loads no engine: names resolve lazily.

    import chaos
    experiment = chaos.load_experiment("experiments/smoke.yaml")
    result = chaos.run(experiment)          # or: await chaos.run_async(experiment)
    assert result.ok, result.failing()
"""

from __future__ import annotations

from typing import Any

from chaos.model.errors import (
    ChaosError,
    ExperimentInvalid,
    FaultError,
    FaultPermissionDenied,
    FaultRevertFailed,
    FaultUnsupported,
    SetupFailed,
    TargetNotAllowed,
    TargetUnreachable,
    UsageError,
    VerificationInconclusive,
)

__all__ = [
    "ChaosError",
    "Experiment",
    "ExperimentInvalid",
    "FaultError",
    "FaultPermissionDenied",
    "FaultRevertFailed",
    "FaultUnsupported",
    "Result",
    "SetupFailed",
    "TargetNotAllowed",
    "TargetUnreachable",
    "UsageError",
    "Verdict",
    "VerificationInconclusive",
    "load_experiment",
    "run",
    "run_async",
]

_LAZY = {
    "Experiment": ("chaos.model.experiment", "Experiment"),
    "Verdict": ("chaos.model.verdict", "Verdict"),
    "load_experiment": ("chaos.experiment", "load_experiment"),
    "run": ("chaos.api", "run"),
    "run_async": ("chaos.api", "run_async"),
    "Result": ("chaos.execution.result", "Result"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'chaos' has no attribute {name!r}")
