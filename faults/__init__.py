"""Fault families. Importing this package registers every fault kind in ``REGISTRY``.

One module per family; a new family is one module plus one line in ``FAMILIES``.
"""

from __future__ import annotations

import importlib

from faults.base import REGISTRY, Fault, FaultEnv, register

__all__ = ["FAMILIES", "REGISTRY", "Fault", "FaultEnv", "register"]

FAMILIES = ("client", "network", "server", "kv", "gpu", "process")

for _family in FAMILIES:
    try:
        importlib.import_module(f"faults.{_family}")
    except ModuleNotFoundError as _exc:  # TEMP while families land; removed before release
        if _exc.name != f"faults.{_family}":
            raise
