"""Fault families, and nothing else. Importing this package registers every fault kind in ``REGISTRY``.

One module per family (each registers at least one kind with ``@register``); a new family is one
module plus one name in the import below. Beside the families only what they share: ``base`` (the
``Fault`` spec, the ``Injection``, the registry) and ``kill_schedule`` (a kill's timing in its phase,
the same for ``process.kill`` and ``docker.kill``). What a fault acts through (Toxiproxy, NVML and
its helper processes, Docker, Kubernetes, the admin API, the stream hop) lives in the floor of ``chaos/``, the only
rooms a family may import (pyproject.toml's ``faults`` contract; tests/architecture/test_fault_families.py
fails when a module that registers no kind is added here).
"""

from __future__ import annotations

from faults import client, docker, gpu, h2, k8s, kv, network, process, server, stream  # noqa: F401  (each registers its kinds)
from faults.base import REGISTRY, Fault, Injection, register

__all__ = ["REGISTRY", "Fault", "Injection", "register"]
