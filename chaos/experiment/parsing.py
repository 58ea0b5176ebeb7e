"""What every section's parser shares: the problems found so far, located by key path (``_Context``),
and the generic steps: a mapping read, a schema run, a parsed value rejected. The loader and the
sections parsed in modules of their own (``workload_section``) both use them, so neither imports the other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from chaos.model.errors import Problem
from chaos.model.params import Schema, suggest

from .yamlpos import KeyPath, Mark, render_path

__all__ = ["At", "_Context", "_Found", "_describe", "_mapping", "_parse", "_positive", "_reject"]

At = Literal["key", "value"]


@dataclass
class _Found:
    path: KeyPath
    message: str
    mark: Mark | None = None  # known position; otherwise derived from the path
    at: At = "value"


@dataclass
class _Context:
    """Collects problems with their key paths and turns them into located ``Problem``s."""

    file: str
    keys: dict[KeyPath, Mark]
    values: dict[KeyPath, Mark]
    unreadable: set[KeyPath]  # values the YAML layer already reported; do not report them twice
    found: list[_Found] = field(default_factory=list)
    # problems about an unreadable value, not reported again: still problems, so a section that had one
    # is not built from what is left of it (a verifier or fault missing the parameter, a TypeError)
    suppressed: int = 0

    def add(self, path: KeyPath, message: str, at: At = "value") -> None:
        if path in self.unreadable:
            self.suppressed += 1
            return
        self.found.append(_Found(path, message, None, at))

    @property
    def count(self) -> int:
        """Problems so far, reported or not: a section compares it before and after it is parsed."""
        return len(self.found) + self.suppressed

    @property
    def base_dir(self) -> Path:
        if self.file.startswith("<"):
            return Path.cwd()
        return Path(self.file).parent

    def locate(self, item: _Found) -> Mark:
        if item.mark is not None:
            return item.mark
        if item.at == "key" and item.path in self.keys:
            return self.keys[item.path]
        path = item.path
        while path:  # a missing key is reported where its mapping starts
            if path in self.values:
                return self.values[path]
            path = path[:-1]
        return self.values.get((), Mark(0, 0))

    def problems(self) -> list[Problem]:
        out = []
        for item in self.found:
            mark = self.locate(item)
            out.append(Problem(self.file, mark.line, mark.column, render_path(item.path), item.message))
        return out


# ---------------------------------------------------------------------------------------------
# generic helpers


def _describe(value: object) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _mapping(ctx: _Context, raw: object, path: KeyPath, what: str) -> dict[str, Any] | None:
    """``raw`` as a string-keyed dict, or None (with a problem) when it is not a mapping."""
    if not isinstance(raw, Mapping):
        ctx.add(path, f"expected {what} (a mapping of key: value), found {_describe(raw)}")
        return None
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            ctx.add(path, f"keys must be names (strings), found {key!r}")
            continue
        out[key] = value
    return out


def _parse(ctx: _Context, raw: dict[str, Any], path: KeyPath, schema: Schema,
           extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run ``schema`` over ``raw`` (minus ``extra`` keys handled by the caller), locating problems."""
    names = schema.names()
    allowed = [*extra, *names]
    known: dict[str, Any] = {}
    for key, value in raw.items():
        if key in extra:
            continue
        param = next((p for p in schema.params if p.name == key), None)
        if param is None:
            ctx.add(path + (key,), f"unknown key {key!r}{suggest(key, allowed)}; allowed: {', '.join(allowed)}",
                    at="key")
        elif value is None and param.default is None and not param.required:
            continue  # `key: null` / `key:` means "not given" for optional keys without a default
        else:
            known[key] = value
    values, problems = schema.parse(known)
    for key, message in problems:
        ctx.add(path + (key,) if key else path, message)
    for param in schema.params:  # a float key given .nan or .inf passes the bounds; it is still wrong
        value = values.get(param.name)
        if param.kind in ("float", "rate") and isinstance(value, float) and not math.isfinite(value):
            ctx.add(path + (param.name,), f"expected a finite number, found {value!r}")
            values[param.name] = param.default
    return values


def _reject(ctx: _Context, values: dict[str, Any], path: KeyPath, name: str, message: str) -> None:
    """Report a value that parsed but is wrong, and drop it so the section falls back to the default."""
    ctx.add(path + (name,), message)
    values.pop(name, None)


def _positive(ctx: _Context, values: dict[str, Any], path: KeyPath, *names: str) -> None:
    for name in names:
        value = values.get(name)
        if isinstance(value, (int, float)) and value <= 0:
            _reject(ctx, values, path, name, f"must be greater than zero, found {value:g}")
