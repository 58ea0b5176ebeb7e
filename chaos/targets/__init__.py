"""Targets: what a run drives. ``base`` (the Target interface, the builtin stack, a remote URL),
``docker``, ``vllm``, ``kubernetes``, ``registry`` (``start_target`` and its kind -> factory registry
``TARGET_KINDS``), the metric scraper (``scraper``), the container helpers (``containers``,
``host_image``).

The names ``base`` and ``registry`` export resolve here lazily, so importing a leaf such as
``chaos.targets.containers`` loads neither httpx nor the builtin stack's client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chaos.targets.base import (
        BuiltinStack,
        RemoteTarget,
        ResourceRecorder,
        Target,
        configured_admin_token,
        require_engine,
        serve_args,
        target_facts,
    )
    from chaos.targets.registry import TARGET_KINDS, TargetFactory, TargetStart, running_target, start_target

__all__ = [
    "BuiltinStack", "RemoteTarget", "ResourceRecorder", "Target", "configured_admin_token", "require_engine",
    "TARGET_KINDS", "TargetFactory", "TargetStart", "running_target", "serve_args", "start_target", "target_facts",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from chaos.targets import base, registry

        return getattr(registry if name in registry.__all__ else base, name)
    raise AttributeError(f"module 'chaos.targets' has no attribute {name!r}")
