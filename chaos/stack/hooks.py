"""In-process fault hooks of the builtin stack: the points where server faults plug in.

Hook points, all designed up front so later faults never touch the request path again:

    engine_step   Engine.step_hook, called in the engine thread before each step with the running
                  ids; the ids it returns are failed by the engine (TokenOutput finish_reason=error)
    detokenize    in the event loop, before a request's new token ids reach its detokenizer
    send          in the event loop, before each SSE event (or the JSON body) is written
    first_byte    ASGI (``chaos.stack.asgi_faults``): before the response's headers go out
    mid_stream    ASGI: before a body chunk once ``after_events`` SSE events have gone out
    request_body  ASGI: while the handler reads the request body
    event_loop    a task that blocks the loop with CPU work (a tokenizer holding the GIL)
    engine        a task that pauses the engine thread (Engine.pause / resume)
    connections   the accepted TCP connections (``sockets.Connections``): a ``nagle`` fault turns
                  TCP_NODELAY off on live and new connections while it is installed

A hook fault is installed from a JSON spec (``parse_spec``), held under a lease of ``ttl`` seconds
that its holder renews (``renew``) and after which it expires by itself, and removed by name.
Timeout faults pick requests deterministically: the k-th request a fault meets is matched when
``k % every_n == every_n - 1`` or when
``Random(f"{seed}:{k}").random() < fraction``; a matched request gets ``asyncio.TimeoutError`` at
the hook point once it is ``after`` seconds old. Only requests that arrive after the fault was
installed are considered, so streams started in an earlier phase are never charged to it.

The ASGI points belong to the fault middleware, which wraps any ASGI app (the builtin server, and
vLLM's through ``--middleware``): they need nothing of the engine. An ``abort`` fault is matched the
same way at ``mid_stream``; the middleware then ends the stream with an error event, as an engine
that fails a request mid-generation does, and cancels the handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from chaos.model.errors import ChaosError

__all__ = [
    "MAX_LIFETIME_S",
    "ASGI_WHERE",
    "ENGINE_WHERE",
    "Due",
    "HookSpecInvalid",
    "Hooks",
    "NagleSpec",
    "StallSpec",
    "TimeoutSpec",
    "parse_spec",
]

MAX_LIFETIME_S = 600.0  # the default and longest lease: a forgotten fault must not outlive a game-day by much
ASGI_WHERE = ("first_byte", "mid_stream", "request_body")  # served by chaos.stack.asgi_faults, any ASGI app
ENGINE_WHERE = ("engine_step", "detokenize", "send")  # inside the builtin stack's own request path
TIMEOUT_WHERE = ENGINE_WHERE + ASGI_WHERE
STALL_WHERE = ("event_loop", "engine")


class HookSpecInvalid(ChaosError):
    """A hook-fault spec sent to the admin API is malformed (HTTP 400)."""

    exit_code = 2


@dataclass(frozen=True)
class TimeoutSpec:
    """Raise ``asyncio.TimeoutError`` at ``where`` for matching requests older than ``after`` (and, at
    ``mid_stream``, with at least ``after_events`` events sent); ``type: abort`` ends the stream with
    an error event there instead."""

    where: str
    fraction: float | None = None
    every_n: int | None = None
    after: float = 0.0
    seed: int = 0
    ttl: float = MAX_LIFETIME_S
    after_events: int = 0
    type: str = "timeout"


@dataclass(frozen=True)
class Due:
    """A hook fault that fires now for a request: what to say, and whether it aborts or times out."""

    message: str
    abort: bool = False


@dataclass(frozen=True)
class StallSpec:
    """Stall ``where`` for ``duration`` seconds, starting at install and then every ``every``."""

    where: str
    duration: float
    every: float
    ttl: float = MAX_LIFETIME_S
    type: str = "stall"


@dataclass(frozen=True)
class NagleSpec:
    """Nagle's algorithm back on (TCP_NODELAY off) for every accepted connection, live and new."""

    ttl: float = MAX_LIFETIME_S
    type: str = "nagle"


Spec = TimeoutSpec | StallSpec | NagleSpec


def _number(raw: Mapping[str, Any], key: str, *, lo: float, hi: float, default: float | None = None) -> float:
    value = raw.get(key, default)
    if value is None:
        raise HookSpecInvalid(f"missing {key!r}: a number of seconds in [{lo:g}, {hi:g}]")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise HookSpecInvalid(f"{key!r} must be a number in [{lo:g}, {hi:g}], found {value!r}")
    return float(value)


def parse_spec(raw: object) -> Spec:
    """Validate a JSON hook-fault spec; raise ``HookSpecInvalid`` saying what would be right."""
    if not isinstance(raw, dict):
        raise HookSpecInvalid(f"a hook fault spec must be a JSON object, found {type(raw).__name__}")
    kind = raw.get("type")
    ttl = _number(raw, "ttl", lo=0.001, hi=MAX_LIFETIME_S, default=MAX_LIFETIME_S)
    if kind in ("timeout", "abort"):
        return _parse_timeout(raw, kind, ttl)
    if kind == "stall":
        _no_extra(raw, {"type", "where", "duration", "every", "ttl"})
        where = raw.get("where")
        if where not in STALL_WHERE:
            raise HookSpecInvalid(f"stall 'where' must be one of {', '.join(STALL_WHERE)}, found {where!r}")
        duration = _number(raw, "duration", lo=0.001, hi=60.0)
        every = _number(raw, "every", lo=0.002, hi=MAX_LIFETIME_S)
        if every <= duration:
            raise HookSpecInvalid(f"'every' ({every:g}s) must be longer than 'duration' ({duration:g}s), or nothing "
                                  "would run between stalls")
        return StallSpec(where=where, duration=duration, every=every, ttl=ttl)
    if kind == "nagle":
        _no_extra(raw, {"type", "ttl"})
        return NagleSpec(ttl=ttl)
    raise HookSpecInvalid(f"'type' must be 'timeout', 'abort', 'stall' or 'nagle', found {kind!r}")


def _int(raw: Mapping[str, Any], key: str, *, lo: int, default: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise HookSpecInvalid(f"{key!r} must be an integer >= {lo}, found {value!r}")
    return value


def _parse_timeout(raw: Mapping[str, Any], kind: str, ttl: float) -> TimeoutSpec:
    """A timeout at a named point, or an abort (always at ``mid_stream``)."""
    allowed = ({"type", "fraction", "every_n", "after", "after_events", "seed", "ttl"}
               | ({"where"} if kind == "timeout" else set()))
    _no_extra(raw, allowed)
    where = raw.get("where") if kind == "timeout" else "mid_stream"
    if where not in TIMEOUT_WHERE:
        raise HookSpecInvalid(f"timeout 'where' must be one of {', '.join(TIMEOUT_WHERE)}, found {where!r}")
    if ("fraction" in raw) == ("every_n" in raw):
        raise HookSpecInvalid("give exactly one of 'fraction' (0..1) or 'every_n' (an integer >= 1)")
    fraction = _number(raw, "fraction", lo=0.0, hi=1.0) if "fraction" in raw else None
    every_n = _int(raw, "every_n", lo=1, default=1) if "every_n" in raw else None
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise HookSpecInvalid(f"'seed' must be an integer, found {seed!r}")
    after = _number(raw, "after", lo=0.0, hi=MAX_LIFETIME_S, default=0.0)
    after_events = _int(raw, "after_events", lo=0, default=1 if where == "mid_stream" else 0)
    if after_events and where != "mid_stream":
        raise HookSpecInvalid("'after_events' counts events already sent, so it applies only at mid_stream, not at "
                              f"{where}")
    return TimeoutSpec(where=where, fraction=fraction, every_n=every_n, after=after, seed=seed, ttl=ttl,
                       after_events=after_events, type=kind)


def _no_extra(raw: Mapping[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(raw) - allowed)
    if extra:
        raise HookSpecInvalid(f"unknown key(s) {', '.join(map(repr, extra))}; allowed: {', '.join(sorted(allowed))}")


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop
        return None


class Pausable(Protocol):
    def pause(self) -> None: ...
    def resume(self) -> None: ...


class NagleSwitch(Protocol):
    """What a ``nagle`` fault needs of the stack's connections (``sockets.Connections``)."""

    def set_nagle(self, on: bool) -> int: ...
    def census(self) -> dict[str, Any]: ...


@dataclass
class _Installed:
    name: str
    spec: Spec
    installed_at: float
    renewed_at: float  # the lease runs ttl seconds from here
    seen: int = 0  # requests this fault has met (the k of the docstring)
    matched: int = 0
    fired: int = 0
    stalls: int = 0
    decisions: dict[str, bool] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None

    def expired(self, now: float) -> bool:
        return now - self.renewed_at >= self.spec.ttl

    def describe(self, now: float) -> dict[str, Any]:
        return {
            "spec": asdict(self.spec),
            "age_s": round(now - self.installed_at, 3),
            "expires_in_s": round(max(0.0, self.spec.ttl - (now - self.renewed_at)), 3),
            "requests_seen": self.seen,
            "requests_matched": self.matched,
            "fired": self.fired,
            "stalls": self.stalls,
        }


class Hooks:
    """The hook faults in force and the checks the request path calls at each hook point."""

    def __init__(self, engine: Pausable | None, clock: Callable[[], float] = time.monotonic,
                 connections: NagleSwitch | None = None) -> None:
        self._engine = engine
        self._connections = connections
        self._clock = clock
        self._faults: dict[str, _Installed] = {}
        self._arrivals: dict[str, float] = {}  # request id → arrival time, for ``after``
        # The engine thread reads faults and arrivals in engine_step while the loop mutates them.
        self._lock = threading.Lock()

    # -- management (event loop) -------------------------------------------------------------

    def install(self, name: str, spec: Spec) -> dict[str, Any]:
        """Install (or replace) a hook fault; stall faults start their task in the running loop."""
        if isinstance(spec, NagleSpec) and self._connections is None:
            raise HookSpecInvalid("a nagle fault needs the stack's connection registry, and this stack has none")
        if isinstance(spec, StallSpec) and spec.where == "engine" and self._engine is None:
            raise HookSpecInvalid("an engine stall pauses the builtin engine's thread, and this server has none; "
                                  "use where: event_loop")
        if isinstance(spec, TimeoutSpec) and spec.where in ENGINE_WHERE and self._engine is None:
            raise HookSpecInvalid(f"timeout at {spec.where} is a point inside the builtin stack; this server has "
                                  f"only the ASGI points {', '.join(ASGI_WHERE)}")
        self.remove(name)
        now = self._clock()
        entry = _Installed(name=name, spec=spec, installed_at=now, renewed_at=now)
        if isinstance(spec, StallSpec):
            runner = self._stall_loop if spec.where == "event_loop" else self._stall_engine
            entry.task = asyncio.get_running_loop().create_task(runner(entry), name=f"hook-stall-{name}")
        elif isinstance(spec, NagleSpec):
            entry.task = asyncio.get_running_loop().create_task(self._expire(entry), name=f"hook-nagle-{name}")
        with self._lock:
            self._faults[name] = entry
        self._apply_nagle()
        return self._describe(entry, self._clock())

    def remove(self, name: str) -> bool:
        with self._lock:
            entry = self._faults.pop(name, None)
        if entry is None:
            return False
        if entry.task is not None and entry.task is not _current_task():
            entry.task.cancel()  # its finally resumes a paused engine
        if isinstance(entry.spec, NagleSpec):
            self._apply_nagle()
        return True

    def renew(self, name: str) -> dict[str, Any] | None:
        """Restart the lease of an installed, unexpired fault; None if there is none by that name."""
        now = self._clock()
        with self._lock:
            entry = self._faults.get(name)
            if entry is None or entry.expired(now):
                return None
            entry.renewed_at = now
        return self._describe(entry, now)

    def _apply_nagle(self) -> None:
        """Nagle on while any nagle fault is installed, off (TCP_NODELAY) otherwise."""
        if self._connections is None:
            return
        with self._lock:
            wanted = any(isinstance(f.spec, NagleSpec) for f in self._faults.values())
        self._connections.set_nagle(wanted)

    def _describe(self, entry: _Installed, now: float) -> dict[str, Any]:
        out = entry.describe(now)
        if isinstance(entry.spec, NagleSpec) and self._connections is not None:
            out["connections"] = self._connections.census()  # read back from the sockets
        return out

    def clear(self) -> int:
        names = list(self._faults)
        for name in names:
            self.remove(name)
        return len(names)

    def describe(self) -> dict[str, Any]:
        self._purge()
        now = self._clock()
        with self._lock:
            entries = sorted(self._faults.items())
        return {name: self._describe(f, now) for name, f in entries}

    async def aclose(self) -> None:
        """Remove every fault and wait for stall tasks to finish (the engine is resumed)."""
        tasks = [f.task for f in self._faults.values() if f.task is not None]
        self.clear()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _purge(self) -> None:
        now = self._clock()
        for name in [n for n, f in list(self._faults.items()) if f.expired(now)]:
            self.remove(name)

    # -- request lifecycle ---------------------------------------------------------------------

    def asgi_armed(self) -> bool:
        """Whether a fault at an ASGI point is installed now. A request that arrives while none is
        can never be hit (a fault installed later spares the requests already under way), so the
        middleware passes it through untouched."""
        with self._lock:
            return any(isinstance(f.spec, TimeoutSpec) and f.spec.where in ASGI_WHERE for f in self._faults.values())

    def begin(self, request_id: str) -> None:
        with self._lock:
            self._arrivals[request_id] = self._clock()

    def end(self, request_id: str) -> None:
        with self._lock:
            self._arrivals.pop(request_id, None)
            for f in self._faults.values():
                f.decisions.pop(request_id, None)

    # -- hook points ---------------------------------------------------------------------------

    def selects(self, request_id: str, where: str) -> int | None:
        """Whether a timeout or abort at ``where`` can still hit this request: None when none can, else
        the fewest SSE events (``after_events``) that must have gone out before one may fire.

        It decides the request's match for each such fault now, as the first ``due`` check would (the
        same k-th request is matched), so a caller told None need not check ``where`` again for this
        request: a fault installed later spares the requests already under way. This is how the ASGI
        middleware checks ``mid_stream`` once a request instead of once a chunk."""
        now = self._clock()
        fewest: int | None = None
        with self._lock:
            arrival = self._arrivals.get(request_id)
            if arrival is None:
                return None
            for f in self._faults.values():
                spec = f.spec
                if (not isinstance(spec, TimeoutSpec) or spec.where != where or f.expired(now)
                        or arrival < f.installed_at or not self._matches(f, spec, request_id)):
                    continue
                fewest = spec.after_events if fewest is None else min(fewest, spec.after_events)
        return fewest

    def check(self, request_id: str, where: str) -> None:
        """Event-loop hook points (detokenize, send): raise ``asyncio.TimeoutError`` when due."""
        due = self.due(request_id, where)
        if due is not None:
            raise TimeoutError(due.message)

    def due(self, request_id: str, where: str, events: int = 0) -> Due | None:
        """The timeout or abort that fires for this request at ``where`` now (``events``: SSE events
        already sent), or None. Each fires once per request: its decision is then spent."""
        return self._due(request_id, where, events)

    def engine_step(self, running: list[str]) -> dict[str, str]:
        """``Engine.step_hook``: the running ids to fail, with the message (engine thread)."""
        out: dict[str, str] = {}
        for rid in running:
            due = self._due(rid, "engine_step")
            if due is not None:
                out[rid] = due.message
        return out

    def _due(self, request_id: str, where: str, events: int = 0) -> Due | None:
        now = self._clock()
        with self._lock:
            arrival = self._arrivals.get(request_id)
            if arrival is None or not self._faults:
                return None
            for f in self._faults.values():
                spec = f.spec
                if not isinstance(spec, TimeoutSpec) or spec.where != where or f.expired(now):
                    continue
                if arrival < f.installed_at:  # requests already under way belong to the phase before
                    continue
                if not self._matches(f, spec, request_id):
                    continue
                if now - arrival >= spec.after and events >= spec.after_events:
                    f.fired += 1
                    f.decisions[request_id] = False  # fired: a request is hit once, however often it is checked
                    what = "abort (error event, stream ended)" if spec.type == "abort" else "asyncio.TimeoutError"
                    after = f" after {events} events" if where == "mid_stream" else ""
                    return Due(f"{what} injected at {where}{after} by fault {f.name!r} "
                               f"(request {now - arrival:.3f}s old)",
                               abort=spec.type == "abort")
        return None

    @staticmethod
    def _matches(f: _Installed, spec: TimeoutSpec, request_id: str) -> bool:
        decided = f.decisions.get(request_id)
        if decided is None:
            k = f.seen
            f.seen += 1
            if spec.every_n is not None:
                decided = k % spec.every_n == spec.every_n - 1
            else:
                decided = random.Random(f"{spec.seed}:{k}").random() < (spec.fraction or 0.0)
            f.matched += decided
            f.decisions[request_id] = decided
        return decided

    # -- stall tasks ---------------------------------------------------------------------------

    async def _stall_loop(self, entry: _Installed) -> None:
        spec = entry.spec
        assert isinstance(spec, StallSpec)
        await asyncio.sleep(0.01)  # let the admin response that installed us go out first
        while not entry.expired(self._clock()):
            end = time.perf_counter() + spec.duration
            while time.perf_counter() < end:  # CPU work on the loop thread, as a slow tokenizer would
                pass
            entry.stalls += 1
            await asyncio.sleep(spec.every - spec.duration)
        self.remove(entry.name)

    async def _expire(self, entry: _Installed) -> None:
        """A fault with no work of its own (nagle) still ends when its lease runs out unrenewed."""
        while not entry.expired(self._clock()):
            await asyncio.sleep(max(0.001, entry.spec.ttl - (self._clock() - entry.renewed_at)))
        self.remove(entry.name)

    async def _stall_engine(self, entry: _Installed) -> None:
        spec, engine = entry.spec, self._engine
        assert isinstance(spec, StallSpec) and engine is not None  # install refuses an engine stall without one
        await asyncio.sleep(0.01)
        while not entry.expired(self._clock()):
            await asyncio.to_thread(engine.pause)
            try:
                entry.stalls += 1
                await asyncio.sleep(spec.duration)
            finally:
                engine.resume()  # also on cancel: a removed fault never leaves the engine paused
            await asyncio.sleep(spec.every - spec.duration)
        self.remove(entry.name)
