"""Kubernetes label keys and values as the API server validates them (k8s.io/apimachinery): a key is
a name of at most 63 characters with an optional DNS-subdomain prefix (``app.kubernetes.io/name``),
a value is empty or a name of at most 63. Pure; imports nothing of ours, so the experiment loader
and the faults check selectors before anything reaches a cluster."""

from __future__ import annotations

import re

__all__ = ["key_problem", "selector_problems", "value_problem"]

_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_PREFIX = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def key_problem(key: object) -> str | None:
    """Why ``key`` is not a label key, or None."""
    if isinstance(key, str):
        prefix, _, name = key.rpartition("/")
        if _NAME.fullmatch(name) and (not prefix or _PREFIX.fullmatch(prefix)):
            return None
    return f"expected a label key such as app or app.kubernetes.io/name, found {key!r}"


def value_problem(value: object) -> str | None:
    """Why ``value`` is not a label value, or None (YAML's numbers and booleans must be quoted)."""
    if isinstance(value, str) and (not value or _NAME.fullmatch(value)):
        return None
    return ("expected a label value (letters, digits, '-', '_', '.', at most 63; quote numbers and booleans), found "
            f"{value!r}")


def selector_problems(pairs: object) -> list[tuple[str, str]]:
    """(key, why) for each pair of a matchLabels mapping (or its sorted pairs) the API would refuse."""
    items = pairs.items() if isinstance(pairs, dict) else pairs if isinstance(pairs, (list, tuple)) else ()
    found: list[tuple[str, str]] = []
    for key, value in items:
        problem = key_problem(key)
        if problem is None:
            problem = value_problem(value)
        if problem:
            found.append((str(key), problem))
    return found
