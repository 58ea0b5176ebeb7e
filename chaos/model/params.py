"""Parameter schemas that fault and verifier kinds declare, and their pure validation.

A kind registers a ``Schema`` (a tuple of ``Param``); the experiment loader hands each YAML mapping to
``Schema.parse`` and gets back parsed values in base units or a list of ``(key, message)``
problems, which it turns into located errors. This module imports nothing of ours but ``units``,
so ``sla`` and ``faults`` may use it without reaching the runner.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chaos.model import units

__all__ = ["Param", "Schema", "suggest"]

# kind name → (parser, unit shown in `streamchaos list`)
_PARSERS: dict[str, tuple[Callable[[object], Any], str]] = {
    "duration": (units.parse_duration, "duration, e.g. 250ms"),
    "rate": (units.parse_rate, "rate, e.g. 20/s"),
    "data_rate": (units.parse_data_rate, "data rate, e.g. 10KB/s"),
    "size": (units.parse_size, "size, e.g. 64KiB"),
    "fraction": (units.parse_fraction, "fraction, e.g. 0.3 or 30%"),
}


def suggest(word: str, choices: Any) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass(frozen=True)
class Param:
    """One parameter of a kind: its name, type, default and bounds.

    ``kind`` is one of duration, rate, data_rate, size, fraction, int, float, str, bool, choice,
    int_or_range (an int or a two-item list ``[lo, hi]``), str_list, mapping.
    """

    name: str
    kind: str
    default: Any = None
    required: bool = False
    doc: str = ""
    choices: tuple[str, ...] = ()
    min: float | None = None
    max: float | None = None

    @property
    def unit(self) -> str:
        if self.kind in _PARSERS:
            return _PARSERS[self.kind][1]
        if self.kind == "choice":
            return " | ".join(self.choices)
        return self.kind

    def parse(self, raw: object) -> Any:
        """Parse one raw YAML value; raise ``ValueError`` with a message saying what is allowed."""
        value: Any
        if self.kind in _PARSERS:
            value = _PARSERS[self.kind][0](raw)
        elif self.kind in _PLAIN:
            value = _PLAIN[self.kind](raw)
        elif self.kind == "choice":
            if raw not in self.choices:
                raise ValueError(f"expected one of {', '.join(self.choices)}, found "
                                 f"{raw!r}{suggest(str(raw), self.choices)}")
            value = raw
        else:  # pragma: no cover - a registration mistake, not a user mistake
            raise AssertionError(f"unknown parameter kind {self.kind!r}")
        self._check_bounds(value)
        return value

    def format(self, value: Any) -> str:
        """A parsed value in the units a person writes (``0.25`` s → ``250ms``, ``0.3`` → ``30%``)."""
        if value is None:
            return "-"
        if self.kind == "duration":
            return units.format_duration(float(value))
        if self.kind == "fraction":
            return f"{float(value) * 100:g}%"
        if self.kind == "rate":
            return f"{float(value):g}/s"
        if self.kind == "data_rate":
            return f"{float(value) / 1000:g}KB/s"
        if self.kind == "size":
            return f"{float(value):g}B"
        if self.kind == "int_or_range" and isinstance(value, tuple):
            return str(value[0]) if value[0] == value[1] else f"[{value[0]}, {value[1]}]"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)

    def _check_bounds(self, value: Any) -> None:
        numbers = value if isinstance(value, tuple) and self.kind == "int_or_range" else (value,)
        for number in numbers:
            if not isinstance(number, (int, float)) or isinstance(number, bool):
                continue
            if self.min is not None and number < self.min:
                raise ValueError(f"must be at least {self.min:g}, found {number:g}")
            if self.max is not None and number > self.max:
                raise ValueError(f"must be at most {self.max:g}, found {number:g}")


def _int_or_range(raw: object) -> tuple[int, int]:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return (raw, raw)
    if (
        isinstance(raw, list)
        and len(raw) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in raw)
        and raw[0] <= raw[1]
    ):
        return (raw[0], raw[1])
    raise ValueError(f"expected an integer or a range [low, high] with low <= high, found {raw!r}")

def _as_int(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ValueError(f"expected an integer, found {raw!r}")
    return raw


def _as_float(raw: object) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ValueError(f"expected a number, found {raw!r}")
    return float(raw)


def _as_str(raw: object) -> str:
    if not isinstance(raw, str):
        raise ValueError(f"expected a string, found {raw!r}")
    return raw


def _as_bool(raw: object) -> bool:
    if not isinstance(raw, bool):
        raise ValueError(f"expected true or false, found {raw!r}")
    return raw


def _as_str_list(raw: object) -> tuple[str, ...]:
    items = [raw] if isinstance(raw, str) else raw  # one string is a list of one
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise ValueError(f"expected a list of strings, found {raw!r}")
    return tuple(items)


def _as_mapping(raw: object) -> dict[Any, Any]:
    if not isinstance(raw, Mapping):
        raise ValueError(f"expected a mapping, found {raw!r}")
    return dict(raw)


# kinds parsed without units (``_PARSERS`` holds those with them); ``choice`` needs the param's choices
_PLAIN: dict[str, Callable[[object], Any]] = {
    "int": _as_int, "float": _as_float, "str": _as_str, "bool": _as_bool,
    "int_or_range": _int_or_range, "str_list": _as_str_list, "mapping": _as_mapping,
}



@dataclass(frozen=True)
class Schema:
    """The parameters of one kind, plus groups of which exactly one / at most one may be given."""

    params: tuple[Param, ...] = ()
    one_of: tuple[tuple[str, ...], ...] = field(default=())  # exactly one of each group
    at_most_one_of: tuple[tuple[str, ...], ...] = field(default=())

    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def format(self, values: Mapping[str, Any]) -> str:
        """``name=value`` for each given (non-None) value, in schema order, in written units."""
        return ", ".join(f"{p.name}={p.format(values[p.name])}" for p in self.params if values.get(p.name) is not None)

    def parse(self, raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """Validate a mapping; return parsed values (defaults filled) and ``(key, message)`` problems."""
        values: dict[str, Any] = {}
        problems: list[tuple[str, str]] = []
        self._parse_given(raw, values, problems)
        self._fill_defaults(raw, values, problems)
        self._check_groups(raw, problems)
        return values, problems

    def _parse_given(self, raw: Mapping[str, Any], values: dict[str, Any], problems: list[tuple[str, str]]) -> None:
        """Each given key parsed by its parameter; an unknown key reported with the allowed ones."""
        by_name = {p.name: p for p in self.params}
        for key, raw_value in raw.items():
            param = by_name.get(str(key))
            if param is None:
                allowed = ", ".join(by_name) or "no parameters"
                problems.append((str(key), f"unknown key{suggest(str(key), by_name)}; allowed: {allowed}"))
                continue
            try:
                values[param.name] = param.parse(raw_value)
            except ValueError as exc:
                problems.append((param.name, str(exc)))

    def _fill_defaults(self, raw: Mapping[str, Any], values: dict[str, Any], problems: list[tuple[str, str]]) -> None:
        """Each parameter not given: its default, or a problem where it is required."""
        for param in self.params:
            if param.name in values or param.name in raw:
                continue
            if param.required:
                problems.append(("", f"missing required key {param.name!r} ({param.unit})"))
            else:
                values[param.name] = param.default

    def _check_groups(self, raw: Mapping[str, Any], problems: list[tuple[str, str]]) -> None:
        """The ``one_of`` and ``at_most_one_of`` groups, counted on the keys given."""
        for group in self.one_of:
            given = [n for n in group if n in raw]
            if len(given) != 1:
                found = ", ".join(given) if given else "none"
                problems.append(("", f"give exactly one of {', '.join(group)} (found: {found})"))
        for group in self.at_most_one_of:
            given = [n for n in group if n in raw]
            if len(given) > 1:
                problems.append(("", f"give at most one of {', '.join(group)} (found: {', '.join(given)})"))
