"""Targets: what a run drives, one kind per module, each a ``Target`` subclass decorated ``@target_kind``:
``base`` (the Target interface and its registry ``TARGET_KINDS``, the builtin stack, a remote URL),
``docker``, ``vllm``, ``kubernetes``; ``registry`` (``kinds``: every module here and every
``streamchaos.targets`` entry point imported, so a new kind is one new module; ``start_target``), the
metric scraper (``scraper``), the image a docker target runs by default (``host_image``; the container
helpers it shares with faults and rollback are ``chaos.docker.containers``).

The names ``base`` and ``registry`` export resolve here lazily, so importing a leaf such as
``chaos.targets.host_image`` loads neither httpx nor the builtin stack's client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chaos.targets.base import (
        TARGET_KINDS,
        BuiltinStack,
        RemoteTarget,
        ResourceRecorder,
        SupportColumn,
        Target,
        TargetStart,
        configured_admin_token,
        require_engine,
        serve_args,
        target_facts,
        target_kind,
    )
    from chaos.targets.registry import kinds, running_target, start_target, target_class, target_schema

__all__ = [
    "BuiltinStack", "RemoteTarget", "ResourceRecorder", "SupportColumn", "Target", "configured_admin_token",
    "require_engine", "TARGET_KINDS", "TargetStart", "kinds", "running_target", "serve_args", "start_target",
    "target_class", "target_facts", "target_kind", "target_schema",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from chaos.targets import base, registry

        return getattr(registry if name in registry.__all__ else base, name)
    raise AttributeError(f"module 'chaos.targets' has no attribute {name!r}")
