"""The path between the load and the target (``path:``): its hops brought up target-outward, taken
down load side first, and what the stream hops tapped handed to the run's event bus.

Each hop's upstream is the root of the hop after it, the last one's the target's, so the hops start
from the target outward: a hop that starts knows where it forwards to. A stream hop and a gateway
are processes of their own (``chaos.hops.process``: own session, parent-death signal, journaled
as a ``process.group`` before anything waits on it, so the watchdog and ``streamchaos rollback``
end one a killed runner left); a toxiproxy hop is the run's Toxiproxy (``chaos.execution.proxy``)
pointed at the next hop; a url hop is a gateway the user runs, reached, never started.

On exit the hops are stopped outermost first (the load has stopped by then), and then every stream
hop's taps file is read, bounded, into ``TapRecord``s on the event bus, so they are journaled
before the verdicts and ``streamchaos verify`` re-judges from the journal alone. A tap's request id is
read back there, the one place taps files are read, from the load's UUID-shaped id to the record id it
stood for (``chaos.model.request_ids``; the id as sent kept in ``wire_id``): taps pair with streams by it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from chaos.host.redact import redact, register_secret
from chaos.model.allowlist import credentials_allowed
from chaos.model.context import HopInfo, ProxyInfo, TargetInfo
from chaos.model.errors import TargetNotAllowed
from chaos.model.experiment import Experiment, HopSpec
from chaos.model.observations import Note, TapRecord, from_json
from chaos.model.request_ids import RUN_OWN, record_id_of

if TYPE_CHECKING:
    from chaos.execution.proxy import RunOwner

__all__ = ["MAX_TAP_RECORDS", "PathHandle", "read_taps", "running_path", "start_allowance_s"]

# How long each kind of hop may take to start, seconds: the run's deadline grows by the path's sum,
# as it does by the target's startup_timeout, so a slow start never eats the phases. A gateway's is
# its own ``startup_timeout_s`` (spawn to answering) plus GATEWAY_TOOLS_S for its version and its
# configuration check, which run first (each well under a second here).
START_ALLOWANCE_S: dict[str, float] = {"stream": 15.0, "toxiproxy": 20.0, "url": 0.0}
GATEWAY_TOOLS_S = 10.0
MAX_TAP_RECORDS = 50_000  # per stream hop: what a run journals of its taps; the rest is counted in a note
# per stream hop: the events (``up`` + ``down`` entries) the runner keeps, about 300 bytes each in memory:
# above it, requests are sampled by their sequence number (every 2nd, 4th, ... keeps its events; the
# others keep their stamps, ends and counts, and count as capped for `relay`), so a long game-day's
# 1,000-token streams cost tens of MB, not GB, and the sample stays spread over the whole run
MAX_TAP_EVENTS = 250_000
MAX_TAP_LINE = 4 * 1024 * 1024  # one tap record's line; a longer one is counted, not parsed
MAX_CONFIG_CHARS = 64 * 1024  # of a hop's effective configuration kept in the report


def start_allowance_s(experiment: Experiment) -> float:
    """The whole path's start allowance, seconds (the hops start one after the other)."""
    return sum(_allowance(hop.kind) for hop in experiment.path)


def _allowance(kind: str) -> float:
    if kind in START_ALLOWANCE_S:
        return START_ALLOWANCE_S[kind]
    from chaos.hops.gateways.base import gateway_class

    return gateway_class(kind).startup_timeout_s + GATEWAY_TOOLS_S


@dataclass(frozen=True)
class PathHandle:
    """The path as the runner brought it up: its hops (load side first), where the load sends, the
    toxiproxy hop's proxy (the network faults act on it), and the facts of the ``path`` note."""

    hops: tuple[HopInfo, ...]
    load_base_url: str
    proxy: ProxyInfo | None
    facts: dict[str, Any]
    proxy_facts: dict[str, Any] | None = None  # the ``proxy`` note: which Toxiproxy and why


@dataclass
class _Hop:
    """One started hop: what the runner and the faults see, how it stops, and its report facts."""

    info: HopInfo
    facts: dict[str, Any]
    taps: Path | None = None  # a stream hop's taps file
    proxy: ProxyInfo | None = None
    proxy_facts: dict[str, Any] | None = None


@contextlib.asynccontextmanager
async def running_path(experiment: Experiment, target_info: TargetInfo, run_dir: Path,
                       record: Callable[[dict[str, Any]], None], *, owner: RunOwner,
                       emit: Callable[[Any], None] | None = None) -> AsyncIterator[PathHandle]:
    """The path while entered; on exit every hop stopped (outermost first) and the taps emitted."""
    _check_allowed(experiment)
    hops: list[_Hop] = []  # innermost first
    try:
        async with contextlib.AsyncExitStack() as stack:
            upstream = target_info.base_url
            for spec in reversed(experiment.path):
                hop = await _start(stack, spec, experiment, target_info, upstream, run_dir, record, owner)
                hops.append(hop)
                upstream = hop.info.base_url
            yield _handle(hops, target_info)
    finally:  # the hops have stopped: their taps files are whole
        if emit is not None:
            for hop in reversed(hops):
                if hop.taps is not None:
                    _emit_taps(hop.info.name, hop.taps, emit)


def _handle(hops: list[_Hop], target_info: TargetInfo) -> PathHandle:
    outward = list(reversed(hops))  # load side first
    toxi = next((h for h in outward if h.proxy is not None), None)
    return PathHandle(hops=tuple(h.info for h in outward),
                      load_base_url=outward[0].info.base_url if outward else target_info.base_url,
                      proxy=None if toxi is None else toxi.proxy,
                      facts={"hops": [h.facts for h in outward]},
                      proxy_facts=None if toxi is None else toxi.proxy_facts)


def _check_allowed(experiment: Experiment) -> None:
    """A url hop is acted on like a remote target: loopback, or a host ``safety.allowed_targets`` names."""
    for hop in experiment.path:
        if hop.kind == "url" and hop.url and not credentials_allowed(hop.url, experiment.safety.allowed_targets):
            raise TargetNotAllowed(f"path hop {hop.name!r} (url {hop.url}) is neither on this host's loopback nor "
                                   "allowed by safety.allowed_targets.hosts")


async def _start(stack: contextlib.AsyncExitStack, spec: HopSpec, experiment: Experiment, target: TargetInfo,
                 upstream: str, run_dir: Path, record: Callable[[dict[str, Any]], None], owner: RunOwner) -> _Hop:
    """One hop, started (or reached) in front of ``upstream`` and entered into ``stack`` to stop it."""
    if spec.kind == "toxiproxy":
        return await _start_toxiproxy(stack, spec, experiment, target, upstream, run_dir, owner)
    if spec.kind == "url":
        return _reach_url(spec)
    from chaos.hops import process  # the hop processes: only a run with a path loads them

    root, api_path = _root(upstream)
    run_dir = run_dir.resolve()  # a hop process runs in a directory of its own: every path it is told is absolute
    if spec.kind == "stream":
        info, started = await process.start_stream_hop(spec.name, root, run_dir, taps=spec.tap, record=record,
                                                       api_path=api_path, http=str(spec.option("http", "1.1")),
                                                       tls=bool(spec.option("tls", False)))
    else:
        info, started = await process.start_gateway(
            spec.name, spec.kind, root, run_dir, record=record, options=dict(spec.options),
            config=None if spec.config is None else Path(spec.config), api_path=api_path)
    stack.push_async_callback(started.stop)
    register_secret(info.control_token)  # registered where it was made too: redacted from all the run writes
    facts = {**_info_facts(info), "config": _bounded(started.config_text) or None, "log": str(started.log_path)}
    if spec.kind == "stream":  # what it speaks to its client
        facts.update(http=str(spec.option("http", "1.1")), tls=bool(spec.option("tls", False)))
    return _Hop(info=info, facts=facts, taps=started.taps_path)


def _root(base_url: str) -> tuple[str, str]:
    """``http://host:port`` and the API path of a base URL: a hop forwards each request's path as it is,
    so it is pointed at the root, and its own base URL is its root plus the same path."""
    parts = urlsplit(base_url)
    host = parts.hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    port = parts.port or (443 if parts.scheme == "https" else 80)  # userinfo left out: hops take no credentials
    return f"{parts.scheme}://{host}:{port}", parts.path.rstrip("/")


def _bounded(config: str) -> str:
    """A hop's effective configuration for the report: secrets redacted, at most MAX_CONFIG_CHARS."""
    text = redact(config[:MAX_CONFIG_CHARS])
    return text + ("\n... (cut)" if len(config) > MAX_CONFIG_CHARS else "")


async def _start_toxiproxy(stack: contextlib.AsyncExitStack, spec: HopSpec, experiment: Experiment,
                           target: TargetInfo, upstream: str, run_dir: Path, owner: RunOwner) -> _Hop:
    """The run's Toxiproxy with its proxy in front of ``upstream`` (the next hop, or the target)."""
    from chaos.execution import proxy  # network faults only: a plain run does not load Toxiproxy's client

    assert spec.proxy is not None
    handle = await stack.enter_async_context(proxy.running_proxy(
        replace(experiment, proxy=spec.proxy), replace(target, base_url=upstream), run_dir, owner))
    process = getattr(getattr(handle, "server", None), "process", None)
    info = HopInfo(name=spec.name, kind="toxiproxy", listen=handle.info.listen, upstream=_root(upstream)[0],
                   base_url=handle.client_base_url, pid=None if process is None else process.pid)
    embedded = handle.info.server == "embedded"
    facts = {**_info_facts(info), "config": _bounded(json.dumps(handle.facts(), sort_keys=True)),
             "log": str(run_dir / "toxiproxy.log") if embedded else None}
    return _Hop(info=info, facts=facts, proxy=handle.info, proxy_facts=handle.facts())


def _reach_url(spec: HopSpec) -> _Hop:
    """A gateway the user runs: reached at its URL; what it forwards to is its own configuration's."""
    assert spec.url is not None
    parts = urlsplit(spec.url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    info = HopInfo(name=spec.name, kind="url", listen=f"{parts.hostname}:{port}", upstream="", base_url=spec.url)
    return _Hop(info=info, facts={**_info_facts(info), "config": None, "log": None})


def _info_facts(info: HopInfo) -> dict[str, Any]:
    return {"name": info.name, "kind": info.kind, "listen": info.listen, "upstream": info.upstream,
            "base_url": info.base_url, "version": info.version, "pid": info.pid}


# -- taps --------------------------------------------------------------------------------------------


@dataclass
class TapsRead:
    records: list[TapRecord] = field(default_factory=list)
    over_cap: int = 0  # records past MAX_TAP_RECORDS: counted, not read
    unreadable: int = 0  # lines that were not a tap record (a killed hop's half line, say)
    error: str | None = None
    stride: int = 1  # requests whose seq is a multiple of it kept their events (MAX_TAP_EVENTS)
    events: int = 0  # events kept
    events_sampled_out: int = 0  # events of the requests the sampling stripped

    def add(self, tap: TapRecord, event_cap: int) -> None:
        """Keep ``tap``; above ``event_cap`` events, double the stride and strip the requests off it."""
        if tap.seq % self.stride:
            tap = self._stripped(tap)
        self.records.append(tap)
        self.events += len(tap.up) + len(tap.down)
        while self.events > event_cap and self.stride < 1 << 30:
            self.stride *= 2
            self.records = [r if r.seq % self.stride == 0 else self._stripped(r) for r in self.records]
            self.events = sum(len(r.up) + len(r.down) for r in self.records)

    def _stripped(self, tap: TapRecord) -> TapRecord:
        if not tap.up and not tap.down:
            return tap
        self.events_sampled_out += len(tap.up) + len(tap.down)
        return replace(tap, up=[], down=[], dropped_up=tap.dropped_up + len(tap.up),
                       dropped_down=tap.dropped_down + len(tap.down))


def read_taps(path: Path, hop: str, cap: int = MAX_TAP_RECORDS, event_cap: int = MAX_TAP_EVENTS) -> TapsRead:
    """A stream hop's taps file: at most ``cap`` records (the rest counted) and ``event_cap`` events
    (requests sampled above it); never through a link."""
    out = TapsRead()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        out.error = f"{path.name}: {exc.strerror or exc}"
        return out
    with os.fdopen(fd, "rb") as f:
        for line in iter(lambda: f.readline(MAX_TAP_LINE + 1), b""):
            if len(out.records) >= cap:
                out.over_cap += 1
                continue
            tap = _tap(line, hop)
            if tap is None:
                out.unreadable += 1 if line.strip() else 0
            elif tap.request_id not in RUN_OWN:  # the run's own probes (keep-alive) are not the load's streams
                out.add(tap, event_cap)
    return out


def _tap(line: bytes, hop: str) -> TapRecord | None:
    if len(line) > MAX_TAP_LINE or not line.strip():
        return None
    try:
        body = json.loads(line)
        if not isinstance(body, dict) or body.get("type") != TapRecord.type:
            return None
        record = from_json({**body, "hop": hop})  # the path's name for it, whatever the file says
    except (ValueError, TypeError):
        return None
    if not isinstance(record, TapRecord):
        return None
    return _by_record_id(record)


def _by_record_id(tap: TapRecord) -> TapRecord:
    """The tap under the record id its request was sent for (``StreamRecord.id``), its UUID-shaped id as sent
    kept beside it: every tap is paired by what it is read back as here (``chaos.model.request_ids``)."""
    sent = tap.request_id
    if not isinstance(sent, str) or (rid := record_id_of(sent)) == sent:
        return tap
    return replace(tap, request_id=rid, wire_id=sent)


def _emit_taps(hop: str, path: Path, emit: Callable[[Any], None]) -> None:
    """Each tap record on the bus (journaled: ``Observations.taps``), and a ``taps`` note of how many."""
    import time

    found = read_taps(path, hop)
    for record in found.records:
        emit(record)
    data: dict[str, Any] = {"hop": hop, "records": len(found.records), "over_cap": found.over_cap,
                            "unreadable": found.unreadable, "cap": MAX_TAP_RECORDS, "events": found.events,
                            "event_cap": MAX_TAP_EVENTS, "sampling_stride": found.stride,
                            "events_sampled_out": found.events_sampled_out}
    if found.error is not None:
        data["error"] = found.error
    emit(Note(topic="taps", t=time.monotonic_ns(), data=data))
