"""Chaos Toolkit extension for streamchaos (the ``chaostoolkit-streamchaos`` distribution).

``chaosstreamchaos.actions`` runs streamchaos experiments, or starts load and one fault in the background
and stops them; ``chaosstreamchaos.probes`` judges a run's SLA verdicts and the target's KV cache.
``discover`` is what ``chaos discover chaostoolkit-streamchaos`` calls. docs/chaostoolkit.md has a whole
experiment.
"""

from __future__ import annotations

import logging
from typing import Any

from chaoslib.discovery.discover import discover_actions, discover_probes, initialize_discovery_result
from chaoslib.types import DiscoveredActivities, Discovery

__all__ = ["__version__", "discover"]
__version__ = "0.1.0"

logger = logging.getLogger("chaostoolkit")


def discover(discover_system: bool = True) -> Discovery:
    """The extension's activities (each with its arguments) and, with ``discover_system``, what the
    installed streamchaos offers: its version, fault kinds and SLA kinds."""
    logger.info("Discovering capabilities from chaostoolkit-streamchaos")
    discovery = initialize_discovery_result("chaostoolkit-streamchaos", __version__, "streamchaos")
    discovery["activities"].extend(_activities())
    if discover_system:
        discovery["system"] = _system()
    return discovery


def _activities() -> list[DiscoveredActivities]:
    return [*discover_actions("chaosstreamchaos.actions"), *discover_probes("chaosstreamchaos.probes")]


def _system() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        streamchaos = version("streamchaos")
    except PackageNotFoundError:
        streamchaos = "unknown (not installed)"
    system: dict[str, Any] = {"streamchaos": streamchaos}
    try:
        from chaos.output.catalogue import fault_kinds, sla_kinds

        system["faults"] = {k.kind: k.summary for k in fault_kinds()}
        system["slas"] = {k.kind: k.summary for k in sla_kinds()}
    except ImportError as exc:  # a streamchaos without these: the activities still work
        logger.debug("streamchaos catalogue: %s", exc)
    return system
