"""Fault families. Importing this package registers every fault kind in ``REGISTRY``.

One module per family; a new family is one module plus one name in the import below.
"""

from __future__ import annotations

from faults import client, docker, gpu, k8s, kv, network, process, server  # noqa: F401  (each registers its kinds)
from faults.base import REGISTRY, Fault, Injection, register

__all__ = ["REGISTRY", "Fault", "Injection", "register"]
