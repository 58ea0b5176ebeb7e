"""``safety.stop_when``: the fleet's own signals halt a run, and hold one back from starting.

Every source is read once before the run touches anything and then every ``every`` seconds until
its phases are over:

- ``prometheus``: each entry of a krkn alert profile (``expr``, ``description``, ``severity``) is
  an instant query against ``prometheus_url``; it *fires* while it returns a series (or a non-zero
  scalar). ``critical`` halts the run and reverts its faults, and refuses to start it; ``error``
  fails the run (one ``stop_when`` verdict per such entry, judged over every read from the first);
  ``warning`` is recorded.
- ``alertmanager``: an active, unsilenced, uninhibited alert that meets every label matcher halts
  the run, and refuses to start it.

A halt names the source, the expression or alert, and the value, and lands within one ``every``
plus one read of the signal (the source's own delay to see it — Prometheus's scrape and rule
intervals, Alertmanager's receipt — comes before that). A source that does not answer before the
run refuses it (``FleetSignalError``, exit 4: a run that cannot see its stop signal is not started);
one that stops answering while the run runs halts it after ``unreachable_halt`` seconds of silence.
A source that rejects an expression or matcher is the experiment's mistake (exit 2).

The reads are recorded as ``stop_when`` notes: one when an alert starts firing (with its value and
labels) and one when it stops, so the report says what the fleet saw and when; a
``stop_when_watch`` note per source closes the run with its counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chaos.model.context import PromAlert, StopSource
from chaos.model.errors import ExperimentInvalid, FleetSignalError, RunRefused, UsageError
from chaos.model.observations import Note, Observations
from chaos.model.verdict import Status, Verdict

__all__ = [
    "Firing",
    "Reading",
    "StopWhenWatch",
    "read_source",
    "refuse_if_firing",
    "stop_when_verdicts",
    "tokens",
    "watching_stop_when",
]

HALTS = "critical"  # the severity that halts a run (and every matching Alertmanager alert)
FAILS = "error"  # the severity that fails it


@dataclass(frozen=True)
class Firing:
    """One alert seen firing in one read."""

    source: str  # the source's name (``prometheus[0]``)
    what: str  # the expression, or the Alertmanager alert's name and labels
    severity: str  # critical | error | warning (an Alertmanager match: critical)
    description: str  # the description with its value and labels filled in
    value: float | None
    labels: dict[str, str] = field(default_factory=dict)
    key: str = ""  # what identifies the alert across reads (the expression; the alert's fingerprint)
    since: float | None = None  # Alertmanager: when the alert started (unix seconds)

    def reason(self) -> str:
        """One line a halt or a refusal says."""
        value = "" if self.value is None else f" = {self.value:g}"
        said = f"{self.description!r} " if self.description else ""
        return f"{self.source}: {said}({self.severity}) {self.what}{value}"

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "what": self.what, "severity": self.severity,
                "description": self.description, "value": self.value, "labels": self.labels, "key": self.key,
                "since": self.since}


@dataclass(frozen=True)
class Reading:
    """One read of one source: the alerts firing in it, or why it could not be read."""

    source: StopSource
    firing: tuple[Firing, ...] = ()
    error: FleetSignalError | None = None
    t_wall: float = 0.0


def tokens(sources: Sequence[StopSource], environ: Mapping[str, str] = os.environ) -> dict[str, str | None]:
    """Each source's bearer token from its variable, by the source's key path (``where``: unique where
    names need not be); a variable that is not set is a usage error before anything is touched (exit 2).
    Each token is registered with the redactor, so no message or file of the run carries it."""
    from chaos.host.redact import register_secret

    out: dict[str, str | None] = {}
    for source in sources:
        if source.bearer_token_env is None:
            out[source.where] = None
            continue
        value = environ.get(source.bearer_token_env, "").strip()
        if not value:
            raise UsageError(f"{source.where}.bearer_token_env: the environment variable {source.bearer_token_env} "
                             "is not set (or empty); export it before the run")
        register_secret(value)
        out[source.where] = value
    return out


async def _prometheus(source: StopSource, token: str | None) -> list[Firing]:
    from chaos.fleet.prometheus import instant_query, render_description

    firing: list[Firing] = []
    for alert in source.alerts:
        try:
            samples = await instant_query(source.url, alert.expr, token=token, timeout_s=source.timeout)
        except FleetSignalError as exc:
            if exc.rejected:  # which expression: the message says, the experiment is what to fix
                raise FleetSignalError(f"{alert.where}: {alert.expr!r}: {exc}", rejected=True) from None
            raise
        for sample in samples[:5]:  # a few series say enough; the value of each is in the note
            firing.append(_prom_firing(source, alert, sample.value, sample.labels,
                                       render_description(alert.description, sample)))
    return firing


def _prom_firing(source: StopSource, alert: PromAlert, value: float, labels: dict[str, str],
                 description: str) -> Firing:
    return Firing(source=source.name, what=alert.expr, severity=alert.severity, description=description,
                  value=value, labels=labels, key=alert.where or alert.expr)


async def _alertmanager(source: StopSource, token: str | None) -> list[Firing]:
    from chaos.fleet.alertmanager import active_alerts

    alerts = await active_alerts(source.url, source.matchers, token=token, timeout_s=source.timeout)
    out = []
    for alert in alerts:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(alert.labels.items()) if k != "alertname")
        summary = alert.annotations.get("summary") or alert.annotations.get("description") or ""
        out.append(Firing(source=source.name, what=f"alert {alert.name or '?'}{{{shown}}}", severity=HALTS,
                          description=summary, value=None, labels=dict(alert.labels),
                          key=alert.fingerprint or repr(sorted(alert.labels.items())), since=alert.starts_at))
    return out


async def read_source(source: StopSource, token: str | None) -> Reading:
    """One read of ``source``; a rejected expression or matcher is raised (the experiment is wrong),
    a source that does not answer comes back as the reading's ``error``."""
    read = _prometheus if source.source == "prometheus" else _alertmanager
    t_wall = time.time()
    try:
        return Reading(source, tuple(await read(source, token)), t_wall=t_wall)
    except FleetSignalError as exc:
        if exc.rejected:
            raise
        return Reading(source, error=exc, t_wall=t_wall)


def _rejected(source: StopSource, exc: FleetSignalError) -> ExperimentInvalid:
    return ExperimentInvalid(f"{source.where}: the {source.source} at {source.url} rejected it: {exc}")


async def refuse_if_firing(sources: Sequence[StopSource], toks: Mapping[str, str | None],
                           emit: Callable[[Any], None]) -> list[Reading]:
    """Read every source once before the run touches anything: a halting alert firing refuses the run
    (``RunRefused``), a source that does not answer refuses it too (``FleetSignalError``), a rejected
    expression or matcher is the experiment's mistake (``ExperimentInvalid``). What was read is
    noted (``stop_when`` notes, ``before_start``): an ``error`` alert already firing fails the run's
    verdict for it, and the note says it fired before the run. Returns the readings, which the watch
    starts from (an alert firing already is not noted as starting again)."""
    readings = await asyncio.gather(*(_read_or_reject(s, toks.get(s.where)) for s in sources))
    unanswered = [r for r in readings if r.error is not None]
    if unanswered:
        raise FleetSignalError("safety.stop_when: the run is not started without its stop signals: " + "; ".join(
            f"{r.source.name} ({r.source.url}): {r.error}" for r in unanswered))
    halting = [f for r in readings for f in r.firing if f.severity == HALTS]
    for reading in readings:
        for firing in reading.firing:
            emit(Note(topic="stop_when", t=time.monotonic_ns(),
                      data={**firing.to_dict(), "state": "firing", "before_start": True, "t_wall": reading.t_wall}))
    if halting:
        raise RunRefused("safety.stop_when: not started while the fleet says stop: "
                         + "; ".join(f.reason() for f in halting[:5]))
    return list(readings)


async def _read_or_reject(source: StopSource, token: str | None) -> Reading:
    try:
        return await read_source(source, token)
    except FleetSignalError as exc:
        raise _rejected(source, exc) from None


class StopWhenWatch:
    """The sources' reads while the run runs (``watching_stop_when``); ``finish`` ends them."""

    def __init__(self, watches: list[_Watch]) -> None:
        self.watches = watches
        self.tasks = [asyncio.create_task(w.run(), name=f"stop-when-{w.source.name}") for w in watches]
        self.finished = False

    async def finish(self, last_read: bool) -> None:
        """Stop reading; with ``last_read`` (the run's phases, drain and cleanup window are over, and
        nothing stopped it), read each source with ``error`` alerts once more first, noted but acting
        on nothing: the run's last moments count for their verdicts, its teardown (the target stopped
        by the run itself) never does. Once only."""
        if self.finished:
            return
        self.finished = True
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if last_read:
            await asyncio.gather(*(w.last_read() for w in self.watches if w.judges))


@contextlib.asynccontextmanager
async def watching_stop_when(sources: Sequence[StopSource], toks: Mapping[str, str | None],
                             halt: Callable[[str], bool | None], emit: Callable[[Any], None],
                             already: Sequence[Reading] = ()) -> AsyncIterator[StopWhenWatch]:
    """While entered, each source is read every ``every`` seconds: a halting alert calls ``halt`` once
    and, when the run took it (``halt`` returned anything but False: not already stopping or in
    teardown), emits a ``halt`` note (source, what, value); alerts starting or stopping to fire are
    noted; ``unreachable_halt`` seconds without an answer halt too. ``already``: the readings before the
    run (``refuse_if_firing``), which the watch starts from. The runner calls ``finish(last_read=True)``
    when its phases, drain and cleanup window are over; on exit (a halt, a signal, an error: no last
    read), one ``stop_when_watch`` note per source with its counts."""
    before = {r.source.where: r for r in already}
    watch = StopWhenWatch([_Watch(s, toks.get(s.where), halt, emit, before.get(s.where)) for s in sources])
    try:
        yield watch
    finally:
        await watch.finish(last_read=False)
        for w in watch.watches:
            emit(Note(topic="stop_when_watch", t=time.monotonic_ns(), data=w.counts()))


class _Watch:
    """One source's reads while the run runs."""

    def __init__(self, source: StopSource, token: str | None, halt: Callable[[str], bool | None],
                 emit: Callable[[Any], None], before: Reading | None = None) -> None:
        self.source, self.token, self.halt, self.emit = source, token, halt, emit
        self.reads = self.unanswered = 0  # while the run ran (the read before it is not counted)
        # by key: what fired in the last read, from the read before the run on
        self.firing: dict[str, Firing] = {_key(f): f for f in (before.firing if before is not None else ())}
        self.last_answer = time.monotonic()
        self.halted = False  # a halt was asked for: the reads stop
        self.took = False  # ... and the run took it (it was not already stopping or in teardown)
        self.last_error: str | None = None
        self.slowest_read_s = 0.0

    def counts(self) -> dict[str, Any]:
        return {"source": self.source.name, "kind": self.source.source, "url": self.source.url,
                "every_s": self.source.every, "reads": self.reads, "unanswered": self.unanswered,
                "slowest_read_s": round(self.slowest_read_s, 4), "last_error": self.last_error,
                "halted": self.took}

    @property
    def judges(self) -> bool:
        """Whether an ``error`` alert of this source gets a verdict (``stop_when_verdicts``)."""
        return any(a.severity == FAILS for a in self.source.alerts)

    async def last_read(self) -> None:
        """One more read as the run ends, noted but acting on nothing. Its limit: each alert's query in
        turn, one ``timeout`` each; one that cannot be had is counted unanswered, with its error."""
        limit = self.source.timeout * max(1, len(self.source.alerts)) + 1.0
        try:
            async with asyncio.timeout(limit):
                reading = await read_source(self.source, self.token)
        except Exception as exc:  # noqa: BLE001 - a rejected or timed-out last look decides nothing
            self.unanswered += 1
            self.last_error = f"the last read: {type(exc).__name__}: {exc}"[:500]
            return
        if reading.error is not None:
            self.unanswered += 1
            self.last_error = f"the last read: {reading.error}"[:500]
            return
        self.reads += 1
        self._note_changes(reading)

    async def run(self) -> None:
        while not self.halted:
            await asyncio.sleep(self.source.every)
            started = time.monotonic()
            try:
                reading = await read_source(self.source, self.token)
            except FleetSignalError as exc:  # rejected now (a server changed under the run): halt, the run is blind
                self._halt(f"{self.source.name}: the {self.source.source} at {self.source.url} rejected a read: {exc}",
                           {"source": self.source.name, "error": str(exc)})
                return
            self.slowest_read_s = max(self.slowest_read_s, time.monotonic() - started)
            if reading.error is not None:
                self._silent(reading.error)
                continue
            self.reads += 1
            self.last_answer = time.monotonic()
            self._seen(reading)

    def _silent(self, error: FleetSignalError) -> None:
        self.unanswered += 1
        self.last_error = str(error)
        quiet = time.monotonic() - self.last_answer
        limit = self.source.unreachable_halt
        if limit > 0 and quiet >= limit:
            self._halt(f"{self.source.name}: the {self.source.source} at {self.source.url} has not answered for "
                       f"{quiet:.0f}s (unreachable_halt {limit:g}s): the run cannot see its stop signal; last: {error}",
                       {"source": self.source.name, "error": str(error), "silent_s": round(quiet, 3)})

    def _seen(self, reading: Reading) -> None:
        self._note_changes(reading)
        halting = [f for f in reading.firing if f.severity == HALTS]
        if halting:
            self._halt("the fleet says stop: " + "; ".join(f.reason() for f in halting[:3]),
                       {"source": self.source.name, "firing": [f.to_dict() for f in halting[:5]],
                        "t_wall": reading.t_wall})

    def _note_changes(self, reading: Reading) -> None:
        """A ``stop_when`` note for each alert that started or stopped firing since the last read."""
        now = {_key(f): f for f in reading.firing}
        for key, firing in now.items():
            if key not in self.firing:
                self.emit(Note(topic="stop_when", t=time.monotonic_ns(),
                               data={**firing.to_dict(), "state": "firing", "before_start": False,
                                     "t_wall": reading.t_wall}))
        for key, firing in self.firing.items():
            if key not in now:
                self.emit(Note(topic="stop_when", t=time.monotonic_ns(),
                               data={**firing.to_dict(), "state": "resolved", "before_start": False,
                                     "t_wall": reading.t_wall}))
        self.firing = now

    def _halt(self, why: str, data: dict[str, Any]) -> None:
        if self.halted:
            return
        self.halted = True
        t = time.monotonic_ns()
        self.took = self.halt(why) is not False  # not one already stopping or in teardown
        if self.took:
            self.emit(Note(topic="halt", t=t, data={"reason": why, "top_errors": [], "stop_when": data}))


def _key(firing: Firing) -> str:
    """One alert across reads: its expression or fingerprint and its labels."""
    return firing.key + repr(sorted(firing.labels.items()))


def stop_when_verdicts(sources: Sequence[StopSource], obs: Observations) -> list[Verdict]:
    """One ``stop_when`` verdict per ``error``-severity alert: ``fail`` when any read saw it firing
    (before the run too: the evidence says so), ``pass`` when the source answered at least one read
    while the run ran (or the one as it ended) and it never fired, ``inconclusive`` when none answered
    (a source that went silent after the read before the run decides nothing about the run). Pure."""
    notes = obs.notes_on("stop_when")
    watched = {n.data.get("source"): n.data for n in obs.notes_on("stop_when_watch")}
    out: list[Verdict] = []
    for source in sources:
        reads = int((watched.get(source.name) or {}).get("reads", 0))  # while the run ran, and as it ended
        for alert in source.alerts:
            if alert.severity != FAILS:
                continue
            key = alert.where or alert.expr
            fired = [n.data for n in notes if n.data.get("source") == source.name and n.data.get("key") == key
                     and n.data.get("state") == "firing"]
            status: Status = "fail" if fired else ("pass" if reads > 0 else "inconclusive")
            evidence: dict[str, Any] = {"source": source.name, "url": source.url, "expr": alert.expr,
                                        "severity": alert.severity, "reads": reads}
            if fired:
                first = fired[0]
                evidence.update(first_value=first.get("value"), first_description=first.get("description"),
                                first_labels=first.get("labels"), first_at=first.get("t_wall"),
                                fired_before_start=bool(first.get("before_start")), times_started_firing=len(fired))
            out.append(Verdict(sla="stop_when", phase=None, status=status, figure=float(len(fired)), budget=0.0,
                               unit="alerts", samples=reads, evidence=evidence,
                               name=f"stop_when {alert.description or alert.expr}"[:120]))
    return out
