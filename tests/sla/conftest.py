"""Builders of synthetic observations for the verifier tests: streams, metric series, phase windows.

Times are given in seconds from the run's t0 and stored as the monotonic nanoseconds the real
load generator writes. Tests get the builders through the ``synth`` fixture.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from chaos.model.observations import (
    ErrorInfo,
    Hangup,
    MetricSample,
    Note,
    Observations,
    PhaseWindow,
    StreamRecord,
)

S = 1_000_000_000
T0 = 1_000 * S  # a monotonic clock does not start at zero; neither do these observations


def ns(seconds: float) -> int:
    """Seconds since t0 → the monotonic ns stamp a record carries."""
    return T0 + round(seconds * S)


class Synth:
    """Small builders; every argument in seconds since t0."""

    S = S
    T0 = T0
    ns = staticmethod(ns)

    @staticmethod
    def stream(
        id: str,
        *,
        phase: str = "load",
        sent: float = 0.0,
        ttft: float | None = 0.1,
        itl: float = 0.02,
        tokens: int = 10,
        gaps: Sequence[float] | None = None,
        ttfb: float | None = None,
        finish: str | None = "stop",
        done: bool = True,
        text: str | None = None,
        expected: str | None = None,
        error: ErrorInfo | None = None,
        in_band: str | None = None,
        status: int | None = 200,
        hangup_after: float | None = None,
        **extra: Any,
    ) -> StreamRecord:
        """A stream sent at ``sent``: first content after ``ttft``, then ``gaps`` (default ``tokens - 1``
        gaps of ``itl``). ``ttft=None`` or ``tokens=0``: no content. ``hangup_after``: the client hung
        up that long after sending; content stamps after it are dropped and no terminal event came."""
        t_sent = ns(sent)
        stamps: list[int] = []
        if ttft is not None and tokens > 0:
            gap_list = list(gaps) if gaps is not None else [itl] * (tokens - 1)
            t = sent + ttft
            stamps.append(ns(t))
            for gap in gap_list:
                t += gap
                stamps.append(ns(t))
        hangup = None
        if hangup_after is not None:
            cut = ns(sent + hangup_after)
            stamps = [x for x in stamps if x <= cut]
            hangup = Hangup(fault="client.disconnect", reason="after_time", t=cut)
            finish, done = None, False
        end = hangup.t if hangup else ((stamps[-1] if stamps else t_sent) + S // 1000)
        first_byte = ns(sent + ttfb) if ttfb is not None else (stamps[0] if stamps else None)
        return StreamRecord(
            id=id,
            phase=phase,
            t_sent=t_sent,
            t_headers=first_byte,
            t_first_byte=first_byte,
            t_first_event=stamps[0] if stamps else None,
            t_first_content=stamps[0] if stamps else None,
            t_content=stamps,
            t_end=end,
            status=status,
            finish_reason=finish,
            done_seen=done,
            in_band_error=in_band,
            error=error,
            hangup=hangup,
            text=text if text is not None else "x" * len(stamps),
            expected_text=expected,
            events=len(stamps),
            **extra,
        )

    @staticmethod
    def series(name: str, points: Iterable[tuple[float, float]], **labels: str) -> list[MetricSample]:
        """One metric series: ``(seconds, value)`` points."""
        return [MetricSample(name=name, labels=dict(labels), value=float(v), t=ns(t)) for t, v in points]

    @staticmethod
    def steps(name: str, start: float, stop: float, every: float, value_at: Any, **labels: str) -> list[MetricSample]:
        """A series scraped every ``every`` seconds from ``start`` to ``stop``; ``value_at(t)`` gives the value."""
        out = []
        k = 0
        while start + k * every <= stop + 1e-9:
            t = start + k * every
            out.append(MetricSample(name=name, labels=dict(labels), value=float(value_at(t)), t=ns(t)))
            k += 1
        return out

    @staticmethod
    def phase(name: str, start: float, end: float | None) -> PhaseWindow:
        return PhaseWindow(name=name, t_start=ns(start), t_end=ns(end) if end is not None else None)

    @staticmethod
    def note(topic: str, t: float, **data: Any) -> Note:
        return Note(topic=topic, t=ns(t), data=data)

    @staticmethod
    def obs(
        streams: Iterable[StreamRecord] = (),
        metrics: Iterable[MetricSample] = (),
        phases: Iterable[PhaseWindow] = (),
        notes: Iterable[Note] = (),
    ) -> Observations:
        return Observations(
            experiment="synthetic",
            t0=T0,
            streams=list(streams),
            metrics=list(metrics),
            phases=list(phases),
            notes=list(notes),
        )


@pytest.fixture
def synth() -> type[Synth]:
    return Synth


def http_error(status: int) -> ErrorInfo:
    return ErrorInfo(kind="http", message=f"HTTP {status}", status=status)


@pytest.fixture
def err() -> dict[str, Any]:
    """Typical ErrorInfo values by name."""
    return {
        "503": http_error(503),
        "500": http_error(500),
        "read": ErrorInfo(kind="read", message="connection reset by peer"),
        "timeout": ErrorInfo(kind="timeout", message="no byte for 5s"),
    }
