"""Run events: one stream of what happens during a run, for everyone who wants to know.

The runner emits, in order: ``RunStarted``; ``Stage`` as it brings things up and down; every
observation record as it is made (``StreamRecord`` when a stream finishes, ``MetricSample`` when a
scrape lands, ``FaultEvent`` for each plan / inject / revert / error, ``PhaseWindow`` when a phase
starts and ends, ``Note`` for facts worth keeping, ``TapRecord`` for each request a stream hop of the
path relayed, when the path comes down); ``VerdictsReady``; ``RunFinished``.

Listeners subscribe to an ``EventBus``: the journal (every record, to disk), the console progress,
the report writer (on ``RunFinished``), the pytest plugin. ``streamchaos verify`` replays a journal
through the same bus, so a re-judged run is reported by the same code as a live one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

from chaos.model.observations import FaultEvent, MetricSample, Note, PhaseWindow, Record, StreamRecord, TapRecord

if TYPE_CHECKING:
    from chaos.execution.result import Result
    from chaos.model.verdict import Verdict

__all__ = [
    "EventBus",
    "RunEvent",
    "RunFinished",
    "RunListener",
    "RunStarted",
    "Stage",
    "VerdictsReady",
    "is_record",
]


@dataclass(frozen=True)
class RunStarted:
    """A run begins: what it is, where its files go, and its clock origin."""

    experiment: str
    out_dir: str
    t0: int  # monotonic ns
    wall_t0: float
    phases: tuple[tuple[str, float], ...] = ()  # (name, seconds) in timeline order
    # (name, most seconds) of the phases that run until decided (``duration: {min, max}``): seconds above is its min
    ranged: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Stage:
    """A step of the run's own lifecycle (starting the target, draining, ...), for progress displays."""

    what: str
    detail: str = ""
    t: int = 0


@dataclass(frozen=True)
class VerdictsReady:
    """The SLA verdicts of a completed run (empty when it did not complete)."""

    verdicts: tuple[Verdict, ...]


@dataclass(frozen=True)
class RunFinished:
    """The run is over and its result is final: reports are written on this event."""

    result: Result


RunEvent = (RunStarted | Stage | VerdictsReady | RunFinished | StreamRecord | MetricSample | FaultEvent | PhaseWindow
            | Note | TapRecord)

_RECORD_TYPES = (StreamRecord, MetricSample, FaultEvent, PhaseWindow, Note, TapRecord)


def is_record(event: object) -> TypeGuard[Record]:
    """Whether the event is an observation record (what the journal keeps and verifiers read)."""
    return isinstance(event, _RECORD_TYPES)


class RunListener(Protocol):
    """Anything that wants to hear about a run. It must not block: it runs on the run's loop."""

    def on_event(self, event: RunEvent) -> None: ...


class EventBus:
    """Delivers each event to every listener, in subscription order.

    A listener that raises stops the run (the journal failing to write is a real failure), but only
    after every other listener has had the event: one listener's bug never costs the others theirs
    (the report files, the JUnit file). The first exception is raised again once all were called.
    """

    def __init__(self, listeners: Iterable[RunListener] = ()) -> None:
        self._listeners: list[RunListener] = list(listeners)

    def subscribe(self, listener: RunListener) -> None:
        self._listeners.append(listener)

    @property
    def listeners(self) -> Sequence[RunListener]:
        return tuple(self._listeners)

    def emit(self, event: RunEvent | Record | Any) -> None:
        failure: Exception | None = None
        for listener in self._listeners:
            try:
                listener.on_event(event)
            except Exception as exc:  # noqa: BLE001 - the others still hear it; raised below
                failure = failure or exc
        if failure is not None:
            raise failure
