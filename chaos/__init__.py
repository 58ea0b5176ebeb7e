"""streamchaos: chaos experiments for LLM token-streaming stacks.

The front door. Importing it starts nothing and loads no engine: names resolve lazily.

    import chaos
    experiment = chaos.load_experiment("experiments/smoke.yaml")
    result = chaos.run(experiment)          # or: await chaos.run_async(experiment)
    assert result.ok, result.failing()
"""

from __future__ import annotations

from typing import Any

from chaos.errors import (
    ChaosError,
    ExperimentInvalid,
    FaultError,
    FaultPermissionDenied,
    FaultRevertFailed,
    FaultUnsupported,
    SetupFailed,
    TargetUnreachable,
    UsageError,
    VerificationInconclusive,
)

__all__ = [
    "ChaosError",
    "ExperimentInvalid",
    "FaultError",
    "FaultPermissionDenied",
    "FaultRevertFailed",
    "FaultUnsupported",
    "Result",
    "SetupFailed",
    "TargetUnreachable",
    "UsageError",
    "VerificationInconclusive",
    "load_experiment",
    "run",
    "run_async",
]

_LAZY = {
    "load_experiment": ("chaos.experiment", "load_experiment"),
    "run": ("chaos.runner", "run"),
    "run_async": ("chaos.runner", "run_async"),
    "Result": ("chaos.runner", "Result"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'chaos' has no attribute {name!r}")
