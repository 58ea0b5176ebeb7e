"""Small pieces the verifiers share: the quantile parameter, unit conversions, stream classification."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from chaos.model.observations import NS, Observations, StreamRecord
from chaos.model.params import Param

__all__ = [
    "CONFIDENCE",
    "SHARE_CONFIDENCE",
    "MAX_IDS",
    "QuantileParam",
    "content_less_reason",
    "ended_waiting",
    "parse_quantile",
    "quantile_label",
    "rel_s",
    "s",
    "stream_end",
    "summary_s",
    "summary_seconds",
    "usage_count",
]

MAX_IDS = 10  # how many offending stream ids evidence lists


def usage_count(stream: StreamRecord, key: str) -> int | None:
    """One of the server's own counts in the stream's ``usage`` (``completion_tokens``, ``prompt_tokens``), where
    it sent it as an integer."""
    value = (stream.usage or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None

_PCT = re.compile(r"p(\d+(?:\.\d+)?)", re.IGNORECASE)


def parse_quantile(raw: object) -> float:
    """``0.99``, ``"p99"``, ``"p99.9"`` or ``"99%"`` → 0.99 / 0.999; must lie strictly in (0, 1)."""
    # ValueError, not TypeError, for every bad value: Schema.parse turns ValueError into a problem.
    if isinstance(raw, bool):
        raise ValueError(f"expected a quantile such as 0.99 or p99, found {raw!r}")  # noqa: TRY004
    value: float
    if isinstance(raw, (int, float)):
        value = float(raw)
    elif isinstance(raw, str):
        text = raw.strip()
        m = _PCT.fullmatch(text)
        try:
            if m:
                value = float(m.group(1)) / 100.0
            elif text.endswith("%"):
                value = float(text[:-1]) / 100.0
            else:
                value = float(text)
        except ValueError:
            raise ValueError(f"expected a quantile such as 0.99, p99 or p99.9, found {raw!r}") from None
    else:
        raise ValueError(f"expected a quantile such as 0.99 or p99, found {raw!r}")  # noqa: TRY004
    if not 0.0 < value < 1.0:
        raise ValueError(f"a quantile must lie strictly between 0 and 1 (p0 and p100 exclusive), found {raw!r}")
    return value


@dataclass(frozen=True)
class QuantileParam(Param):
    """A ``Param`` accepting a quantile as a number (0.99) or a percentile name (p99, p99.9)."""

    kind: str = "quantile"

    @property
    def unit(self) -> str:
        return "quantile, e.g. 0.99 or p99"

    def parse(self, raw: object) -> Any:
        return parse_quantile(raw)


# The confidence of quantile intervals: both sides at (1 - c) / 2, see sla.stats.
CONFIDENCE = Param(
    "confidence",
    "float",
    default=0.95,
    min=0.5,
    max=0.9999,
    doc="two-sided confidence of the quantile interval",
)


# The same for shares (goodput, fluidity): a Clopper-Pearson interval on the effective sample size.
SHARE_CONFIDENCE = Param(
    "confidence",
    "float",
    default=0.95,
    min=0.5,
    max=0.9999,
    doc="two-sided confidence of the share's interval",
)


def quantile_label(q: float) -> str:
    """0.99 → ``p99``, 0.999 → ``p99.9``."""
    return f"p{round(q * 100, 6):g}"


def s(ns: float | None) -> float | None:
    """Nanoseconds → seconds (None stays None)."""
    return None if ns is None else ns / NS


def rel_s(obs: Observations, t: int | None) -> float | None:
    """A monotonic stamp → seconds since the run's ``t0``, for evidence a person reads."""
    return None if t is None else round((t - obs.t0) / NS, 6)


def summary_s(values_ns: Sequence[float], qs: Sequence[float] = (0.5, 0.9, 0.99)) -> dict[str, float | None]:
    """``{"p50": s, "p90": s, ...}`` of ns values, in seconds; None entries for no values."""
    if len(values_ns) == 0:
        return {quantile_label(q): None for q in qs}
    arr = np.asarray(values_ns, dtype=float) / NS
    return {quantile_label(q): float(np.quantile(arr, q)) for q in qs}


def summary_seconds(values_s: Sequence[float], qs: Sequence[float] = (0.5, 0.9, 0.99)) -> dict[str, float | None]:
    """``summary_s`` of values already in seconds (a verifier's ``samples()``)."""
    if len(values_s) == 0:
        return {quantile_label(q): None for q in qs}
    arr = np.asarray(values_s, dtype=float)
    return {quantile_label(q): float(np.quantile(arr, q)) for q in qs}


def stream_end(stream: StreamRecord) -> int | None:
    """When a stream stopped occupying the target, as the client saw it: its terminal stamp,
    else its hang-up, else the latest stamp it has (a record cut short by a killed run)."""
    if stream.t_end is not None:
        return stream.t_end
    if stream.hangup is not None:
        return stream.hangup.t
    stamps = [
        t
        for t in (stream.t_sent, stream.t_headers, stream.t_first_byte, stream.t_first_event, stream.t_first_content)
        if t is not None
    ]
    for events in (stream.t_content, stream.t_reasoning, stream.t_tool_calls):  # the last token of each kind
        stamps.extend(events[-1:])
    return max(stamps) if stamps else None


def content_less_reason(stream: StreamRecord) -> str:
    """Why a stream produced no content (no token, or no output: the caller says which it lacks): its error
    kind, an in-band error, or an empty completion (one that finished with nothing, or with reasoning only)."""
    if stream.error is not None:
        return stream.error.kind
    if stream.in_band_error is not None:
        return "in_band"
    if stream.status is not None and stream.status >= 400:
        return "http"
    if stream.t_sent is None:
        return "never_sent"
    if stream.finish_reason is not None:
        return "empty_completion"
    return "no_terminal_event"


# How a stream ends while still waiting for what it asked for: the load generator's request
# timeout, a cut read, the run ending (cancelled), or a client fault that gave up after a time.
WAITING_ERRORS = frozenset({"timeout", "read", "cancelled"})
WAITING_HANGUPS = frozenset({"after_time", "read_timeout"})


def ended_waiting(stream: StreamRecord) -> bool:
    """Whether the stream ended while waiting for its next token or output: its wait is right-censored
    (what it waited for would have come later, if at all)."""
    if stream.t_sent is None or stream.t_end is None:
        return False
    if stream.hangup is not None:
        return stream.hangup.reason in WAITING_HANGUPS
    return stream.error is not None and stream.error.kind in WAITING_ERRORS
