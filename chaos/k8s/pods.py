"""Facts about pod objects (as the API returns them, plain dicts): pure functions, nothing of ours.

A pod *serves* when its Ready condition is True and it is not terminating (``deletionTimestamp``
set): that is when a Service's endpoints include it. ``choose`` picks a fault's victims the same
way for the same seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["choose", "container_port", "is_ready", "pod_facts", "restarts", "selects", "selector_text", "serving",
           "terminating"]

Pod = Mapping[str, Any]


def is_ready(pod: Pod) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def terminating(pod: Pod) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def serving(pod: Pod) -> bool:
    """Ready and not terminating: what a Service routes to."""
    return is_ready(pod) and not terminating(pod)


def restarts(pod: Pod) -> int:
    return sum(int(c.get("restartCount") or 0) for c in (pod.get("status") or {}).get("containerStatuses") or [])


def pod_facts(pod: Pod) -> dict[str, Any]:
    """What the observations keep about a pod (its name, uid, readiness, restarts, where it runs)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return {
        "name": meta.get("name"), "uid": meta.get("uid"), "phase": status.get("phase"), "ready": is_ready(pod),
        "terminating": terminating(pod), "restarts": restarts(pod), "ip": status.get("podIP"),
        "node": (pod.get("spec") or {}).get("nodeName"), "created": meta.get("creationTimestamp"),
    }


def selector_text(labels: Mapping[str, str]) -> str:
    """``{"app": "web", "tier": "x"}`` → ``app=web,tier=x`` (a labelSelector query)."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a LabelSelector object (matchLabels, matchExpressions) selects ``labels``: a missing
    selector selects nothing, an empty one everything (a policy/v1 PodDisruptionBudget's rule)."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), set(expr.get("values") or ())
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and labels.get(key) in values) \
                or (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
            return False
    return True


def container_port(pod: Pod, port: int | str) -> int | None:
    """The number of ``port`` (a number, or the name of a container port) in this pod; None if it has no such port."""
    if isinstance(port, int):
        return port
    for container in (pod.get("spec") or {}).get("containers") or []:
        for p in container.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
    return int(port) if str(port).isdigit() else None


def choose(pods: Sequence[Pod], *, count: int | None, fraction: float | None, rng: random.Random) -> list[Pod]:
    """The pods a fault acts on: ``count`` of them, or ``fraction`` (rounded up, at least one when
    above zero), drawn by ``rng`` from the pods sorted by name, so a seed replays the same choice."""
    ordered = sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name")))
    if fraction is not None:
        wanted = math.ceil(round(fraction * len(ordered), 9))
    else:
        wanted = count if count is not None else 1
    return rng.sample(ordered, min(wanted, len(ordered)))
