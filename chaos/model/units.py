"""Parsing of the explicit units used in experiments: durations, rates, data rates, sizes, fractions.

Each parser takes the YAML value (a string such as ``"250ms"`` or a bare number where a bare number
is unambiguous) and returns a float in base units (seconds, events per second, bytes per second,
bytes, a fraction in [0, 1]). A value that cannot be parsed raises ``UnitError`` whose message says
what was found and what would be right; the experiment loader turns it into a located problem.

Decimal prefixes are powers of 1000 (``1 KB = 1000 B``), binary prefixes powers of 1024
(``1 KiB = 1024 B``), as in IEC 80000-13.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "UnitError",
    "format_duration",
    "parse_data_rate",
    "parse_duration",
    "parse_fraction",
    "parse_rate",
    "parse_size",
]


class UnitError(ValueError):
    """A value does not carry the unit its key needs."""


_NUMBER = r"([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"

_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_SIZE_UNITS = {
    "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3,
}
_RATE_UNITS = {"s": 1.0, "sec": 1.0, "m": 1 / 60.0, "min": 1 / 60.0, "h": 1 / 3600.0}


def _split(value: object, what: str, example: str) -> tuple[float, str]:
    if isinstance(value, bool) or value is None:
        raise UnitError(f"expected {what} such as {example!r}, found {value!r}")
    if isinstance(value, (int, float)):
        return float(value), ""
    if not isinstance(value, str):
        raise UnitError(f"expected {what} such as {example!r}, found {type(value).__name__} {value!r}")
    m = re.fullmatch(_NUMBER + r"\s*([A-Za-zµ/%]*(?:/[A-Za-z]+)?)", value.strip())
    if not m:
        raise UnitError(f"expected {what} such as {example!r}, found {value!r}")
    number = float(m.group(1))
    if not math.isfinite(number):
        raise UnitError(f"expected a finite {what}, found {value!r}")
    return number, m.group(2)


def parse_duration(value: object, *, allow_bare_seconds: bool = False) -> float:
    """``"250ms"``, ``"1.5s"``, ``"2m"`` → seconds. A bare number needs ``allow_bare_seconds``."""
    number, unit = _split(value, "a duration", "250ms")
    if unit == "":
        # A bare number is ambiguous (seconds? milliseconds?) except zero.
        if number != 0 and not allow_bare_seconds:
            raise UnitError(f"expected a duration with a unit such as '250ms' or '2s', found {value!r}")
        if number < 0:
            raise UnitError(f"a duration cannot be negative, found {value!r}")
        return number
    factor = _DURATION_UNITS.get(unit)
    if factor is None:
        raise UnitError(f"unknown duration unit {unit!r} in {value!r}; use one of ns, us, ms, s, m, h")
    seconds = number * factor
    if seconds < 0:
        raise UnitError(f"a duration cannot be negative, found {value!r}")
    return seconds


def parse_rate(value: object) -> float:
    """``"20/s"``, ``"600/m"`` or a bare number of events per second → events per second."""
    number, unit = _split(value, "a rate", "20/s")
    if unit == "":
        factor = 1.0
    else:
        if not unit.startswith("/"):
            raise UnitError(f"expected a rate such as '20/s', found {value!r}")
        factor_or_none = _RATE_UNITS.get(unit[1:])
        if factor_or_none is None:
            raise UnitError(f"unknown rate unit {unit!r} in {value!r}; use /s, /m or /h")
        factor = factor_or_none
    if number < 0:
        raise UnitError(f"a rate cannot be negative, found {value!r}")
    return number * factor


def parse_size(value: object) -> float:
    """``"64KiB"``, ``"1MB"``, ``"512B"`` or a bare number of bytes → bytes."""
    number, unit = _split(value, "a size", "64KiB")
    factor = 1 if unit == "" else _SIZE_UNITS.get(unit.lower())
    if factor is None:
        raise UnitError(f"unknown size unit {unit!r} in {value!r}; use B, KB, MB, GB, KiB, MiB or GiB")
    if number < 0:
        raise UnitError(f"a size cannot be negative, found {value!r}")
    return number * factor


def parse_data_rate(value: object) -> float:
    """``"10KB/s"``, ``"1MiB/s"`` → bytes per second (a unit is required)."""
    if isinstance(value, str) and "/" in value:
        size_part, _, per = value.strip().rpartition("/")
        if per not in _RATE_UNITS:
            raise UnitError(f"expected a data rate such as '10KB/s', found {value!r}")
        try:
            size = parse_size(size_part)
        except UnitError:
            raise UnitError(f"expected a data rate such as '10KB/s', found {value!r}") from None
        return size * _RATE_UNITS[per]
    raise UnitError(f"expected a data rate with a unit such as '10KB/s', found {value!r}")


def parse_fraction(value: object) -> float:
    """``0.3`` or ``"30%"`` → 0.3; must lie in [0, 1]."""
    number, unit = _split(value, "a fraction", "0.3 or '30%'")
    if unit == "%":
        number /= 100.0
    elif unit != "":
        raise UnitError(f"expected a fraction such as 0.3 or '30%', found {value!r}")
    if not 0.0 <= number <= 1.0:
        raise UnitError(f"a fraction must lie between 0 and 1 (0% and 100%), found {value!r}")
    return number


def format_duration(seconds: float) -> str:
    """Seconds → the shortest readable form, e.g. ``0.25`` → ``"250ms"``."""
    if seconds >= 1 or seconds == 0:
        return f"{seconds:g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:g}ms"
    return f"{seconds * 1e6:g}us"
