"""Stream faults: rules on a stream hop of the experiment's ``path:``, acting on the SSE events it relays.

A stream hop (``path: [{kind: stream}]``, ``chaos/hops/streamhop``) is a proxy that parses the event
stream between the load (or the hop before it) and the engine (or the hop after it). Each kind here
is one of its rule kinds: ``inject`` sets the rule over the hop's control API (``PUT /rules/<fault
name>``, seeded from the run's seed and the fault's name, acting on ``share`` of the requests) and
returns the rule as the hop lists it; ``revert`` deletes it and returns what the hop says it did
(how many requests it acted on, their ids, counts per kind). A rule acting on a request when it is
deleted keeps acting on that request until it ends (a hold being served finishes as planned),
except a ``deadline``, which stops at once.

Which hop: ``hop:`` names it; without it, the path's only stream hop. Both are checked at load time,
so a stream fault on a path with no stream hop, or one naming a gateway, is a located error.

Rollback: the hop is a child of the runner and dies with it, and its rules with it, so after a
killed run there is usually nothing to undo; the plan says so and records the hop's pid and start
time. When the hop still runs, ``rollback`` deletes the rule by name with the control token from
``STREAMCHAOS_HOP_TOKEN`` (the token is never journaled).

In YAML durations carry their unit (``seconds: 7s``, ``keepalive: 2s``); on the wire the hop takes
float seconds (``seconds``, ``keepalive_s``, ``retry_after_s``), which ``rule_params`` writes.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar
from urllib.parse import urlsplit

from chaos.hops.client import StreamHopAPI
from chaos.hops.streamhop import TOKEN_ENV
from chaos.hops.streamhop.rules import (
    CUT_HOWS,
    DEADLINE_HOWS,
    MAX_GZIP_BUFFER,
    MAX_NAME,
    MAX_SECONDS,
    MIN_KEEPALIVE_S,
    SILENCE_DURING,
    STATUS_CODES,
)
from chaos.host.procs import start_time
from chaos.model.context import FaultAccount, HopInfo, RunContext, Scene
from chaos.model.errors import FaultError, FaultUnsupported
from chaos.model.observations import PHASE_SCOPE
from chaos.model.params import Param, Schema, suggest
from chaos.model.request_ids import record_id_of
from chaos.model.units import format_duration
from faults.base import Fault, Injection, register

if TYPE_CHECKING:
    from chaos.model.experiment import Experiment

__all__ = ["HOP_TOKEN_ENV", "StreamFault"]

# The hop's own limits (chaos.hops.streamhop.rules) are checked here too, so a rule the hop would refuse
# at the phase's start is a located error at load time instead.
HOP_TOKEN_ENV = TOKEN_ENV  # the stream hop's control token, as the hop itself reads it
STREAM_KIND = "stream"  # HopSpec.kind / HopInfo.kind of the hop these faults act on
SEED_RANGE = 1 << 31

HOP = Param("hop", "str", None, doc="the stream hop's name in `path:` (default: the path's only stream hop)")
SHARE = Param("share", "fraction", 1.0, doc="share of requests the rule acts on, drawn per request from the run's seed")
KEEPALIVE = Param("keepalive", "duration", None, max=MAX_SECONDS,
                  doc="write an SSE comment `: keep-alive` this often while holding back (default: none)")
SHARE_EVENTS = Param("share_events", "fraction", 0.1, doc="probability per data event (never the [DONE])")

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_HEADER_VALUE = 1024  # characters of a rewritten header value (the hop's limit)
MAX_REMOVED = 64  # header names one rewrite may remove (the hop's limit)


class _Hop(Protocol):
    """What hop lookup reads of a hop: a ``HopSpec`` at load time, a ``HopInfo`` in a run or a dry run."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...


H = TypeVar("H", bound=_Hop)


def _hop_list(hops: Sequence[_Hop]) -> str:
    return ", ".join(f"{h.name} ({h.kind})" for h in hops) or "none"


def pick_hop(kind: str, wanted: str | None, hops: Sequence[H]) -> tuple[H | None, tuple[str, str] | None]:
    """The stream hop a fault of ``kind`` acts on among ``hops`` (load side first), or ``(key, why not)``."""
    streams = [h for h in hops if h.kind == STREAM_KIND]
    if wanted is not None:
        named = next((h for h in hops if h.name == wanted), None)
        if named is None:
            return None, ("hop", f"no hop named {wanted!r} in `path:`{suggest(wanted, [h.name for h in hops])}; "
                                 f"its hops: {_hop_list(hops)}")
        if named.kind != STREAM_KIND:
            others = ", ".join(h.name for h in streams) or "none: add `- kind: stream` where the fault should act"
            return None, ("hop", f"hop {wanted!r} is a {named.kind} hop; {kind} acts only on a hop of kind stream "
                                 f"(the path's stream hops: {others})")
        return named, None
    if not streams:
        where = f"the path's hops: {_hop_list(hops)}" if hops else "the experiment has no `path:`"
        return None, ("kind", f"{kind} acts on a stream hop and there is none ({where}); add one where the fault "
                              "should act, e.g. `path: [{kind: stream}]`")
    if len(streams) > 1:
        return None, ("hop", f"the path has {len(streams)} stream hops ({', '.join(h.name for h in streams)}): "
                             f"say which one {kind} acts on with `hop:`")
    return streams[0], None


@dataclass(frozen=True, kw_only=True)
class StreamFault(Fault):
    """A rule on a stream hop of the path: its kind, its parameters on the wire, and what it does."""

    rule_kind: ClassVar[str]
    stops_at_once: ClassVar[bool] = False  # deleting the rule also ends its effect on running requests
    # the hop takes a request's rules when the request arrives (``RequestRules``): a rule installed later
    # never acts on a stream already running, so it touches only the streams sent in its own phase
    scope: ClassVar[str] = PHASE_SCOPE

    hop: str | None
    share: float

    def rule_params(self) -> dict[str, Any]:
        """The rule's ``params`` as the hop's control API takes them (float seconds, ints, strings)."""
        raise NotImplementedError

    def effect(self) -> str:
        """What an affected response looks like at the client, in words (for the dry run)."""
        raise NotImplementedError

    def param_problems(self) -> list[tuple[str, str]]:
        """The checks of the parameters among themselves that the schema cannot state."""
        return []

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        _, why = pick_hop(self.kind, self.hop, experiment.path)
        out = [why] if why else []
        if not (1 <= len(self.name) <= MAX_NAME and self.name.isprintable() and "/" not in self.name):
            out.append(("name", f"the hop names its rule after the fault: 1 to {MAX_NAME} printable characters "
                                f"without '/', found {self.name!r}"))
        return out + self.param_problems()

    def activate(self, ctx: RunContext) -> Injection:
        hop, why = pick_hop(self.kind, self.hop, ctx.hops)
        if hop is None:
            raise FaultUnsupported(why[1] if why else f"{self.kind}: no stream hop in this run")
        if not hop.control_url:
            raise FaultUnsupported(f"{self.kind}: stream hop {hop.name!r} has no control API in this run")
        return _Rule(self, ctx, hop)

    def describe(self, scene: Scene) -> FaultAccount:
        hop, why = pick_hop(self.kind, self.hop, scene.hops)
        where = (f"stream hop {hop.name!r} (control API {hop.control_url or 'on a loopback port'})" if hop
                 else f"stream hop {self.hop!r}" if self.hop else "the path's stream hop (none found)")
        share = "every request" if self.share >= 1 else f"{self.share * 100:g}% of requests (seeded, per request id)"
        return FaultAccount(
            changes=f"sets rule {self.name!r} ({self.rule_kind}) on {where} for {share}: {self.effect()}",
            undo=(f"deletes rule {self.name!r} from the hop when the phase ends ("
                  + ("requests it is acting on are released at once" if self.stops_at_once
                     else "a request it is already acting on finishes as planned")
                  + "); the hop is the run's child process and the rule dies with it, so nothing outlives the run; "
                    "`streamchaos rollback` deletes it by name if the hop still runs"),
            refused=why[1] if why else None,
        )

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        url, rule, hop = undo.get("hop_control"), undo.get("rule"), undo.get("hop")
        if not url or not rule:
            return {"skipped": "no stream hop recorded"}
        if not _loopback(str(url)):
            return {"skipped": f"the journal names {url} for stream hop {hop!r}: a stream hop listens on "
                               "loopback only, so this journal is not one a run wrote; nothing contacted"}
        if _hop_gone(undo.get("pid"), undo.get("start_time"), str(url)):
            return {"skipped": f"stream hop {hop!r} is gone (it ends with the run): rule {rule!r} died with it"}
        token = os.environ.get(HOP_TOKEN_ENV)
        if not token:
            return {"skipped": f"stream hop {hop!r} still runs, but its control token is never journaled and "
                               f"{HOP_TOKEN_ENV} is not set: rule {rule!r} lasts until the hop ends (its process "
                               "group is rolled back with the run's resources)"}
        body = StreamHopAPI(str(url), token).delete_rule_sync(str(rule))
        return {"removed": bool(body.get("removed")), "acted_on": body.get("acted_on"), "hop": hop}


def _hop_gone(pid: object, started: object, url: str) -> bool:
    """The hop's process has exited (its pid no longer has the recorded start time) or its control port
    refuses connections: either way its rules went with it."""
    return (isinstance(pid, int) and started is not None and start_time(pid) != started) or not _listening(url)


def _loopback(url: str) -> bool:
    """Whether ``url`` is an http URL of this host's loopback (where every stream hop listens)."""
    parts = urlsplit(url)
    try:
        return parts.scheme == "http" and ipaddress.ip_address(parts.hostname or "").is_loopback
    except ValueError:
        return False


def _listening(url: str) -> bool:
    """Whether something accepts connections at ``url``'s host and port (a dead hop's port refuses)."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout=2.0):
            return True
    except OSError:
        return False


class _Rule(Injection):
    """One stream fault's rule on one hop, for one run: set by ``inject``, deleted by ``revert``."""

    def __init__(self, fault: StreamFault, ctx: RunContext, hop: HopInfo) -> None:
        super().__init__(fault, ctx)
        self.spec = fault
        self.hop = hop
        self.control_url = str(hop.control_url)
        self.seed = ctx.rng(fault.name).randrange(SEED_RANGE)  # the hop's per-request draws replay with the run
        self.api = StreamHopAPI(self.control_url, hop.control_token or "")
        self.started = start_time(hop.pid) if hop.pid is not None else None  # with the pid, the hop's identity

    def plan(self) -> dict[str, Any]:
        # not a ``*_url`` key: rollback contacts only a loopback address (a stream hop listens nowhere
        # else), so it needs no allow-list entry, which a watchdog started before the hops cannot have
        return {"hop_control": self.control_url, "hop": self.hop.name, "rule": self.name,
                "rule_kind": self.spec.rule_kind, "pid": self.hop.pid, "start_time": self.started,
                "seed": self.seed, "share": self.spec.share,
                "outlives": "no: the hop is the run's child and the rule dies with it"}

    async def inject(self) -> dict[str, Any]:
        answer = await self.api.put_rule(self.name, self.spec.rule_kind, self.spec.rule_params(),
                                         seed=self.seed, share=self.spec.share)
        listed = _listed(await self.api.status(), self.name)
        if listed is None:
            raise FaultError(f"{self.kind}: stream hop {self.hop.name!r} accepted rule {self.name!r} but does not "
                             "list it")
        return {"hop": self.hop.name, "rule": listed, "t_active": answer.get("t_active")}

    async def revert(self) -> dict[str, Any]:
        try:
            body = await self.api.delete_rule(self.name)
        except FaultError:
            if await asyncio.to_thread(_hop_gone, self.hop.pid, self.started, self.control_url):
                return {"hop": self.hop.name, "removed": False,
                        "skipped": f"stream hop {self.hop.name!r} is gone: rule {self.name!r} died with it"}
            raise
        sent = [str(i) for i in body.get("request_ids") or []]
        ids = [record_id_of(i) for i in sent]  # the streams' own ids, as taps are read back (chaos.model.request_ids)
        out = {"hop": self.hop.name, "removed": bool(body.get("removed")), "t_removed": body.get("t_removed"),
               "acted_on": body.get("acted_on", 0), "request_ids": ids, "details": body.get("details", {})}
        if ids != sent:
            out["wire_ids"] = sent  # as they went out: what a gateway's log shows
        return out


def _listed(status: Mapping[str, Any], rule: str) -> dict[str, Any] | None:
    """The rule called ``rule`` among those the hop's ``/status`` lists."""
    for item in status.get("rules") or []:
        if isinstance(item, Mapping) and rule in (item.get("rule"), item.get("name")):
            return dict(item)
    return None


def _keepalive_problems(keepalive: float | None, hold: float, what: str) -> list[tuple[str, str]]:
    """A keep-alive interval that is zero, or no shorter than the hold it fills (no comment would go out)."""
    if keepalive is None:
        return []
    if keepalive < MIN_KEEPALIVE_S:
        return [("keepalive", f"must be at least {format_duration(MIN_KEEPALIVE_S)}, e.g. 2s (a shorter period is "
                              "a flood of comments); leave it out for no keep-alive comments")]
    if keepalive >= hold:
        return [("keepalive", f"{format_duration(keepalive)} is not shorter than the {what} "
                              f"({format_duration(hold)}): no comment would be written; shorten it or leave it out")]
    return []


def _keepalive_words(keepalive: float | None) -> str:
    return (f"an SSE comment `: keep-alive` every {format_duration(keepalive)} meanwhile" if keepalive
            else "no byte meanwhile")


def _header_value_problems(key: str, value: str | None) -> list[tuple[str, str]]:
    if value is not None and (not value.strip() or _CONTROL.search(value) or len(value) > MAX_HEADER_VALUE):
        return [(key, f"expected a header value of one line, at most {MAX_HEADER_VALUE} characters without control "
                      f"characters, found {value!r}")]
    return []


@register
@dataclass(frozen=True, kw_only=True)
class Hold(StreamFault):
    kind = "stream.hold"
    rule_kind = "hold"
    summary = ("hold the first event of each response (and with headers: hold, the response head) for a time, "
               "with or without SSE keep-alive comments: a long prefill or a reasoning pause before the first token")
    schema = Schema((
        Param("seconds", "duration", required=True, max=MAX_SECONDS,
              doc="how long the first event is held after the upstream sent it"),
        KEEPALIVE,
        Param("headers", "choice", "send", choices=("send", "hold"),
              doc="send: the response head passes at once; hold: it is held too (nothing at all reaches the client)"),
        HOP, SHARE,
    ))

    seconds: float
    keepalive: float | None
    headers: str

    def param_problems(self) -> list[tuple[str, str]]:
        if self.headers == "hold" and self.keepalive is not None:
            return [("keepalive", "needs headers: send: a comment cannot go before the response head")]
        return _keepalive_problems(self.keepalive, self.seconds, "hold")

    def rule_params(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "keepalive_s": self.keepalive, "headers": self.headers}

    def effect(self) -> str:
        head = "the response head is held too" if self.headers == "hold" else "the response head passes at once"
        return (f"the first event reaches the client {format_duration(self.seconds)} after the upstream sent it "
                f"({head}), with {_keepalive_words(self.keepalive)}")


@register
@dataclass(frozen=True, kw_only=True)
class Silence(StreamFault):
    kind = "stream.silence"
    rule_kind = "silence"
    summary = ("after N events, nothing for a time (events queue, then flow), with or without SSE keep-alive "
               "comments: a mid-stream pause, or one inside the reasoning phase only")
    schema = Schema((
        Param("after_events", "int", 1, min=0,
              doc="events relayed before the silence (comments not counted); with during: reasoning, reasoning "
                  "events"),
        Param("seconds", "duration", required=True, max=MAX_SECONDS, doc="how long nothing is written"),
        Param("during", "choice", "any", choices=SILENCE_DURING,
              doc="any: after after_events events of any kind; reasoning: after after_events reasoning events "
                  "(delta.reasoning_content or delta.reasoning), before the next one, so the silence lies inside "
                  "the reasoning phase (a stream whose reasoning ends first is not silenced)"),
        KEEPALIVE, HOP, SHARE,
    ))

    after_events: int
    seconds: float
    during: str
    keepalive: float | None

    def param_problems(self) -> list[tuple[str, str]]:
        return _keepalive_problems(self.keepalive, self.seconds, "silence")

    def rule_params(self) -> dict[str, Any]:
        return {"after_events": self.after_events, "seconds": self.seconds, "keepalive_s": self.keepalive,
                "during": self.during}

    def effect(self) -> str:
        if self.during == "reasoning":
            return (f"after {self.after_events} reasoning events, before the next one, no event reaches the client "
                    f"for {format_duration(self.seconds)} (later events queue at the hop, then flow), with "
                    f"{_keepalive_words(self.keepalive)}; a stream with no more reasoning events than that is not "
                    "silenced")
        return (f"after {self.after_events} events, no event reaches the client for {format_duration(self.seconds)} "
                f"(later events queue at the hop, then flow), with {_keepalive_words(self.keepalive)}")


CUT_WORDS = {
    "bare_eof": "the connection closes mid-body, without the chunked terminator (a truncated HTTP 200)",
    "reset": "a TCP reset (RST)",
    "error_event": 'an error event `data: {"error": {...}}` then `data: [DONE]`, and the body ends cleanly',
    "fake_done": "`data: [DONE]` with no finish_reason event, and the body ends cleanly (it looks complete)",
}


@register
@dataclass(frozen=True, kw_only=True)
class Cut(StreamFault):
    kind = "stream.cut"
    rule_kind = "cut"
    summary = ("end the response after N events: a bare EOF, a TCP reset, an error event then [DONE], or a "
               "clean-looking [DONE] with no finish_reason")
    schema = Schema((
        Param("after_events", "int", 1, min=0, doc="events relayed whole before the cut (comments not counted)"),
        Param("how", "choice", "bare_eof", choices=CUT_HOWS,
              doc="bare_eof: closed mid-body (a truncated 200); reset: TCP RST; error_event: an error event, then "
                  "[DONE]; fake_done: [DONE] with no finish_reason"),
        HOP, SHARE,
    ))

    after_events: int
    how: str

    def rule_params(self) -> dict[str, Any]:
        return {"after_events": self.after_events, "how": self.how}

    def effect(self) -> str:
        return (f"after {self.after_events} events the response ends: {CUT_WORDS[self.how]}; the hop closes its "
                "upstream connection at once")


@register
@dataclass(frozen=True, kw_only=True)
class Status(StreamFault):
    kind = "stream.status"
    rule_kind = "status"
    summary = ("answer with an error status (429, 503, ...) and a JSON error body instead of forwarding, with "
               "Retry-After; or as a storm only while more than K requests are in flight at the hop")
    schema = Schema((
        Param("code", "int", 503, doc="429, 500, 502, 503 or 504"),
        Param("retry_after", "duration", None, max=MAX_SECONDS,
              doc="send Retry-After (whole seconds, rounded up) (default: none)"),
        Param("storm_above", "int", None, min=0,
              doc="act only while more than this many requests are in flight at the hop (default: always)"),
        HOP, SHARE,
    ))

    code: int
    retry_after: float | None
    storm_above: int | None

    def param_problems(self) -> list[tuple[str, str]]:
        if self.code not in STATUS_CODES:
            what = "not an error" if self.code < 400 else "not one the hop answers with"
            return [("code", f"expected one of {', '.join(map(str, STATUS_CODES))}, found {self.code} ({what})")]
        return []

    def rule_params(self) -> dict[str, Any]:
        return {"code": self.code, "retry_after_s": self.retry_after, "storm_above": self.storm_above}

    def effect(self) -> str:
        retry = f", Retry-After {format_duration(self.retry_after)}" if self.retry_after is not None else ""
        storm = (f", only while more than {self.storm_above} requests are in flight at the hop"
                 if self.storm_above is not None else "")
        return f"the request is answered with HTTP {self.code} (a JSON error body{retry}) and never forwarded{storm}"


@dataclass(frozen=True, kw_only=True)
class _EventShare(StreamFault):
    """drop / duplicate: each data event after the first few, with a probability."""

    verb: ClassVar[str]
    schema = Schema((
        SHARE_EVENTS,
        Param("skip_first", "int", 0, min=0, doc="events left alone first"),
        HOP, SHARE,
    ))

    share_events: float
    skip_first: int

    def rule_params(self) -> dict[str, Any]:
        return {"share_events": self.share_events, "skip_first": self.skip_first}

    def effect(self) -> str:
        return (f"each data event after the first {self.skip_first} is {self.verb} with probability "
                f"{self.share_events * 100:g}% (never the [DONE])")


@register
@dataclass(frozen=True, kw_only=True)
class Drop(_EventShare):
    kind = "stream.drop"
    rule_kind = "drop"
    verb = "dropped"
    summary = "drop data events (never the [DONE]) with a probability, after the first N: tokens silently lost"


@register
@dataclass(frozen=True, kw_only=True)
class Duplicate(_EventShare):
    kind = "stream.duplicate"
    rule_kind = "duplicate"
    verb = "written twice"
    summary = "write data events twice with a probability, after the first N: a retrying or replaying relay"


@register
@dataclass(frozen=True, kw_only=True)
class Split(StreamFault):
    kind = "stream.split"
    rule_kind = "split"
    summary = ("write events in two or more writes at seeded byte offsets (inside a multibyte UTF-8 character "
               "when asked), 1 ms apart so they arrive as separate reads")
    schema = Schema((
        Param("share_events", "fraction", 1.0, doc="probability per event"),
        Param("inside_utf8", "bool", False, doc="split inside a multibyte UTF-8 character where the event has one"),
        HOP, SHARE,
    ))

    share_events: float
    inside_utf8: bool

    def rule_params(self) -> dict[str, Any]:
        return {"share_events": self.share_events, "inside_utf8": self.inside_utf8}

    def effect(self) -> str:
        inside = ", inside a multibyte UTF-8 character where the event has one" if self.inside_utf8 else ""
        return (f"{self.share_events * 100:g}% of events are written in two or more pieces at seeded byte offsets"
                f"{inside}, 1 ms apart (the bytes are unchanged)")


DEFAULT_GZIP_BUFFER = 8192  # bytes nginx's `gzip on` gathers before it flushes (its default gzip_buffers)


@register
@dataclass(frozen=True, kw_only=True)
class Rewrite(StreamFault):
    kind = "stream.rewrite"
    rule_kind = "rewrite"
    summary = ("rewrite the response headers: Content-Type, Content-Encoding: gzip with buffering (what nginx's "
               "`gzip on` does to an event stream), X-Accel-Buffering, or headers removed")
    schema = Schema((
        Param("content_type", "str", None, doc="the Content-Type to send instead (default: unchanged)"),
        Param("gzip", "bool", False, doc="gzip the body, flushing only every gzip_buffer bytes and at the end"),
        Param("gzip_buffer", "size", DEFAULT_GZIP_BUFFER, min=1,
              doc="with gzip: bytes gathered before a flush (at most 1MiB)"),
        Param("x_accel_buffering", "str", None, doc="the X-Accel-Buffering value to send (default: unchanged)"),
        Param("remove", "str_list", (), doc="response header names to remove"),
        HOP, SHARE,
    ))

    content_type: str | None
    gzip: bool
    gzip_buffer: float
    x_accel_buffering: str | None
    remove: tuple[str, ...]

    def param_problems(self) -> list[tuple[str, str]]:
        out = _header_value_problems("content_type", self.content_type)
        out += _header_value_problems("x_accel_buffering", self.x_accel_buffering)
        out += [("remove", f"{name!r} is not a header name") for name in self.remove
                if not _TOKEN.match(name) or len(name) > 128]
        if len(self.remove) > MAX_REMOVED:
            out.append(("remove", f"at most {MAX_REMOVED} header names, found {len(self.remove)}"))
        if self.gzip_buffer > MAX_GZIP_BUFFER:
            out.append(("gzip_buffer", f"must be at most 1MiB ({MAX_GZIP_BUFFER} B): the hop holds no more"))
        if not self.gzip and self.gzip_buffer != DEFAULT_GZIP_BUFFER:
            out.append(("gzip_buffer", "applies only with gzip: true"))
        if self.content_type is None and not self.gzip and self.x_accel_buffering is None and not self.remove:
            out.append(("", "stream.rewrite changes nothing: give content_type, gzip, x_accel_buffering or remove"))
        return out

    def rule_params(self) -> dict[str, Any]:
        return {"content_type": self.content_type, "gzip": self.gzip, "gzip_buffer_bytes": int(self.gzip_buffer),
                "x_accel_buffering": self.x_accel_buffering, "remove": list(self.remove)}

    def effect(self) -> str:
        changes = []
        if self.content_type is not None:
            changes.append(f"Content-Type becomes {self.content_type!r}")
        if self.gzip:
            changes.append(f"the body is gzipped and flushed only every {int(self.gzip_buffer)} bytes and at the end "
                           "(events arrive in bunches)")
        if self.x_accel_buffering is not None:
            changes.append(f"X-Accel-Buffering becomes {self.x_accel_buffering!r}")
        if self.remove:
            changes.append(f"{', '.join(self.remove)} removed")
        return "; ".join(changes)


DEADLINE_WORDS = {
    "clean": "the chunked body ends as if complete (as Envoy's route timeout does)",
    "bare_eof": "the connection closes mid-body (a truncated HTTP 200)",
    "reset": "a TCP reset (RST)",
    "status": "the connection closes mid-body (a 504 is the point of it: a deadline that comes before the "
              "response head, e.g. with a stream.hold of headers: hold, answers 504 whatever the how)",
}


@register
@dataclass(frozen=True, kw_only=True)
class Deadline(StreamFault):
    kind = "stream.deadline"
    rule_kind = "deadline"
    stops_at_once = True
    summary = ("a total-duration limit per request, as a gateway's route timeout: at the limit the response ends "
               "(clean, bare EOF, reset), or a 504 before its head")
    schema = Schema((
        Param("seconds", "duration", required=True, max=MAX_SECONDS,
              doc="the limit, from the request's arrival at the hop"),
        Param("how", "choice", "clean", choices=DEADLINE_HOWS,
              doc="clean: the body ends as if complete (Envoy); bare_eof: closed mid-body; reset: TCP RST; "
                  "status: closed mid-body too (before the response head every how answers 504)"),
        HOP, SHARE,
    ))

    seconds: float
    how: str

    def param_problems(self) -> list[tuple[str, str]]:
        if self.seconds <= 0:
            return [("seconds", "must be longer than 0s, e.g. 15s")]
        return []

    def rule_params(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "how": self.how}

    def effect(self) -> str:
        return (f"a response still running {format_duration(self.seconds)} after its request reached the hop is "
                f"ended: {DEADLINE_WORDS[self.how]}; before the response head, a 504")
