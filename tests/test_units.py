"""Unit parsing: every form the experiment format promises, and clear errors for the rest."""

import pytest

from chaos.model.units import (
    UnitError,
    format_duration,
    parse_data_rate,
    parse_duration,
    parse_fraction,
    parse_rate,
    parse_size,
)


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("250ms", 0.25), ("1.5s", 1.5), ("2m", 120.0), ("100us", 1e-4), ("1h", 3600.0), (0, 0.0), ("0", 0.0)],
)
def test_durations(raw: object, seconds: float) -> None:
    assert parse_duration(raw) == pytest.approx(seconds)


@pytest.mark.parametrize("raw", ["5", 5, "abc", "-1s", "3 parsecs", None, True, [1]])
def test_bad_durations_say_what_is_right(raw: object) -> None:
    with pytest.raises(UnitError) as err:
        parse_duration(raw)
    assert "duration" in str(err.value)


def test_bare_seconds_only_when_allowed() -> None:
    assert parse_duration(5, allow_bare_seconds=True) == 5.0


def test_rates_sizes_fractions() -> None:
    assert parse_rate("20/s") == 20.0
    assert parse_rate("600/m") == pytest.approx(10.0)
    assert parse_data_rate("10KB/s") == 10_000.0  # 1 KB = 1000 B
    assert parse_data_rate("1MiB/s") == 1024**2
    assert parse_size("64KiB") == 65536
    assert parse_size("1MB") == 1_000_000
    assert parse_fraction("30%") == pytest.approx(0.3)
    assert parse_fraction(0.25) == 0.25


@pytest.mark.parametrize(
    ("fn", "raw"),
    [(parse_fraction, 1.5), (parse_fraction, "150%"), (parse_data_rate, "10KB"), (parse_data_rate, 100),
     (parse_size, "12 parsecs"), (parse_rate, "5/fortnight")],
)
def test_bad_values(fn: object, raw: object) -> None:
    with pytest.raises(UnitError):
        fn(raw)  # type: ignore[operator]


def test_format_duration() -> None:
    assert format_duration(0.25) == "250ms"
    assert format_duration(2) == "2s"
