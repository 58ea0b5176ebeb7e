"""The stream hop's rules: their kinds and params (checked, with a one-line reason when wrong), which
requests each acts on, and what it does to each event of one request. Pure and seeded: the same rule,
seed and requests give the same decisions in every run.

A rule acts on a request with probability ``share``, decided by
``random.Random(f"{seed}:{rule}:{request_id or seq}")``; its per-event draws (drop, duplicate, split)
come from a second generator seeded by the same string plus ``:events``. A request id of the load's
UUID-shaped layout (``RRRRRRRR-WWWW-4FFF-8XXX-NNNNNNNNNNNN``, the first group the run's tag) is drawn by
without its run's tag, so two runs of one seed draw alike. The rules in force are read
once, when a request's head arrives: a rule put later acts on later requests, and a rule deleted
meanwhile keeps acting on the requests it was already acting on (a ``deadline`` excepted: the relay
asks ``removed`` when its timer fires).

Of the kinds that do one thing to a request (hold, cut, status, rewrite, deadline, and the HTTP/2
request kinds) the first rule put that selects the request acts and any other of that kind is ignored
for it; silences and the event kinds (drop, duplicate, split) all act, in the order they were put.

The HTTP/2 kinds (``h2_*``, ``H2_KINDS``) act on a hop that speaks HTTP/2 to its client (``--http 2``,
``h2front``) and only on its HTTP/2 streams. ``h2_rst_stream``, ``h2_header_leak`` and ``h2_window`` act
per request like the others (``h2_window`` also sets the initial window of every connection while in
force); ``h2_goaway`` and ``h2_max_streams`` act on connections (``CONNECTION_KINDS``), never chosen per
request: their ``share`` picks connections, drawn by the connection's label (``c3``) in place of a request id.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .sse import utf8_inner_offsets

__all__ = ["CONNECTION_KINDS", "CUT_HOWS", "DEADLINE_HOWS", "H2_ERRORS", "H2_KINDS", "H2_LEAK_HOWS", "KINDS",
           "MAX_H2_STREAMS", "MAX_H2_WINDOW", "MAX_RULES", "SILENCE_DURING", "SPLIT_PAUSE_S", "STATUS_CODES",
           "Acting",
           "RequestRules", "Rule", "RuleError", "check_name", "parse_rule", "request_key"]

CUT_HOWS = ("bare_eof", "reset", "error_event", "fake_done")
# a silence's phase: any (after N events of any kind) or reasoning (after N reasoning events, before the
# next one: inside the reasoning phase, never shifted past it)
SILENCE_DURING = ("any", "reasoning")
DEADLINE_HOWS = ("clean", "bare_eof", "reset", "status")
STATUS_CODES = (429, 500, 502, 503, 504)
SPLIT_PAUSE_S = 0.001  # between the writes of a split event, so they leave as separate segments
MAX_RULES = 64
MAX_NAME = 128  # characters of a rule name
MAX_SECONDS = 86_400.0  # the longest duration a rule may ask for (a day)
MIN_KEEPALIVE_S = 0.01  # a shorter period would be a flood of comments, not a keep-alive
MAX_GZIP_BUFFER = 1 << 20  # bytes a gzip rewrite may hold before it flushes
MAX_REQUEST_IDS = 50  # request ids a rule remembers for its evidence
# the load's UUID-shaped request ids (chaos.model.request_ids, which the hop may not import): the run's tag, the rest
_RUN_TAGGED = re.compile(r"[0-9a-f]{8}-([0-9a-f]{4}-4[0-9a-f]{3}-8[0-9a-f]{3}-[0-9a-f]{12})")
# HTTP/2 error codes (RFC 9113 7), lower-case, in code order: the index is the code on the wire
H2_ERRORS = ("no_error", "protocol_error", "internal_error", "flow_control_error", "settings_timeout",
             "stream_closed", "frame_size_error", "refused_stream", "cancel", "compression_error", "connect_error",
             "enhance_your_calm", "inadequate_security", "http_1_1_required")
# how h2_header_leak spoils a stream's head: its content-type dropped, or a neighbour stream's put in its place
H2_LEAK_HOWS = ("drop", "neighbour")
MAX_H2_STREAMS = 1000  # SETTINGS_MAX_CONCURRENT_STREAMS a rule may advertise (the hop's default is 100)
# h2_window's largest: HTTP/2's default initial window. The fault starves; a window above the default would be
# advertised to the client while h2 keeps counting each stream against its own 65,535, and a client that
# trusts the larger window past 64 KiB would trip h2's flow-control error, which ends the whole connection
MAX_H2_WINDOW = 65_535

_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,128}$")


class RuleError(ValueError):
    """A rule the hop cannot take; the message is the one-line reason the control API answers."""


_REQUIRED = object()
_Check = Callable[[str, Any], Any]


def _number(what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RuleError(f"{what} must be a number, got {value!r}")
    return float(value)


def _seconds(what: str, value: Any) -> float:
    seconds = _number(what, value)
    if not 0 <= seconds <= MAX_SECONDS:
        raise RuleError(f"{what} must be between 0 and {MAX_SECONDS:g} seconds, got {value!r}")
    return seconds


def _positive_seconds(what: str, value: Any) -> float:
    seconds = _seconds(what, value)
    if seconds <= 0:
        raise RuleError(f"{what} must be more than 0 seconds, got {value!r}")
    return seconds


def _keepalive(what: str, value: Any) -> float | None:
    if value is None:
        return None
    seconds = _seconds(what, value)
    if seconds < MIN_KEEPALIVE_S:
        raise RuleError(f"{what} must be null or at least {MIN_KEEPALIVE_S:g} seconds, got {value!r}")
    return seconds


def _optional(check: _Check) -> _Check:
    return lambda what, value: None if value is None else check(what, value)


def _count(what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1_000_000_000:
        raise RuleError(f"{what} must be a whole number from 0, got {value!r}")
    return value


def _fraction(what: str, value: Any) -> float:
    share = _number(what, value)
    if not 0 <= share <= 1:
        raise RuleError(f"{what} must be between 0 and 1, got {value!r}")
    return share


def _boolean(what: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise RuleError(f"{what} must be true or false, got {value!r}")
    return value


def _one_of(*options: Any) -> _Check:
    def check(what: str, value: Any) -> Any:
        if isinstance(value, bool) or value not in options:
            raise RuleError(f"{what} must be one of {', '.join(map(str, options))}; got {value!r}")
        return value
    return check


def _header_value(what: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 1024 or any(c in value for c in "\r\n\0"):
        raise RuleError(f"{what} must be null or a header value (one line, at most 1024 characters)")
    return value


def _header_names(what: str, value: Any) -> list[str]:
    if not isinstance(value, list) or len(value) > 64:
        raise RuleError(f"{what} must be a list of at most 64 header names")
    for name in value:
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            raise RuleError(f"{what}: {name!r} is not a header name")
    return [name.lower() for name in value]


def _ranged(low: int, high: int, unit: str) -> _Check:
    def check(what: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise RuleError(f"{what} must be a whole number of {unit} from {low} to {high}, got {value!r}")
        return value
    return check


def _buffer_bytes(what: str, value: Any) -> int:
    size = _count(what, value)
    if not 1 <= size <= MAX_GZIP_BUFFER:
        raise RuleError(f"{what} must be between 1 and {MAX_GZIP_BUFFER} bytes, got {value!r}")
    return size


_EVENTS: dict[str, tuple[_Check, Any]] = {"share_events": (_fraction, _REQUIRED), "skip_first": (_count, 0)}
KINDS: dict[str, dict[str, tuple[_Check, Any]]] = {
    "hold": {"seconds": (_seconds, _REQUIRED), "keepalive_s": (_keepalive, None),
             "headers": (_one_of("send", "hold"), "send")},
    "silence": {"after_events": (_count, 0), "seconds": (_seconds, _REQUIRED), "keepalive_s": (_keepalive, None),
                "during": (_one_of(*SILENCE_DURING), "any")},
    "cut": {"after_events": (_count, 0), "how": (_one_of(*CUT_HOWS), "bare_eof")},
    "status": {"code": (_one_of(*STATUS_CODES), _REQUIRED), "retry_after_s": (_optional(_seconds), None),
               "storm_above": (_optional(_count), None)},
    "drop": _EVENTS,
    "duplicate": _EVENTS,
    "split": {"share_events": (_fraction, _REQUIRED), "inside_utf8": (_boolean, False)},
    "rewrite": {"content_type": (_header_value, None), "gzip": (_boolean, False),
                "gzip_buffer_bytes": (_buffer_bytes, 8192), "x_accel_buffering": (_header_value, None),
                "remove": (_header_names, [])},
    "deadline": {"seconds": (_positive_seconds, _REQUIRED), "how": (_one_of(*DEADLINE_HOWS), "clean")},
    # HTTP/2 (h2front): after N events the stream is reset with this error code; its neighbours live
    "h2_rst_stream": {"after_events": (_count, 1), "error": (_one_of(*H2_ERRORS), "internal_error")},
    # a graceful GOAWAY: at once to the connections open when put, or to every connection once it has
    # taken after_streams streams (null: the first)
    "h2_goaway": {"after_streams": (_optional(_ranged(1, 1_000_000_000, "streams")), None)},
    "h2_max_streams": {"streams": (_ranged(0, MAX_H2_STREAMS, "streams"), _REQUIRED)},
    # request bodies: an initial window of ``bytes`` on every connection, the rest granted ``seconds``
    # after the stream opened on the streams chosen
    "h2_window": {"bytes": (_ranged(0, MAX_H2_WINDOW, "bytes"), _REQUIRED), "seconds": (_seconds, _REQUIRED)},
    "h2_header_leak": {"how": (_one_of(*H2_LEAK_HOWS), "drop")},
}
H2_KINDS = frozenset(kind for kind in KINDS if kind.startswith("h2_"))
CONNECTION_KINDS = frozenset({"h2_goaway", "h2_max_streams"})  # act on connections, never chosen per request


def _params(kind: str, given: Any) -> dict[str, Any]:
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise RuleError(f"params must be an object, got {type(given).__name__}")
    schema = KINDS[kind]
    unknown = sorted(set(given) - set(schema))
    if unknown:
        raise RuleError(f"{kind}: unknown param {unknown[0]!r} (known: {', '.join(schema)})")
    out: dict[str, Any] = {}
    for key, (check, default) in schema.items():
        if key in given:
            out[key] = check(f"{kind}.{key}", given[key])
        elif default is _REQUIRED:
            raise RuleError(f"{kind}: param {key!r} is required")
        else:
            out[key] = list(default) if isinstance(default, list) else default
    if kind == "hold" and out["headers"] == "hold" and out["keepalive_s"] is not None:
        raise RuleError("hold: keepalive_s needs headers: send (a comment cannot go before the response head)")
    return out


def check_name(name: str) -> str:
    if not 1 <= len(name) <= MAX_NAME or not name.isprintable() or "/" in name:
        raise RuleError(f"a rule name is 1 to {MAX_NAME} printable characters without '/'")
    return name


@dataclass(eq=False)
class Rule:
    """A rule in force at the hop, and what it has done since it was put (its evidence)."""

    name: str
    kind: str
    params: dict[str, Any]
    seed: int = 0
    share: float = 1.0
    t_active: int = 0  # monotonic ns when it was put
    acted_on: int = 0  # requests it changed
    request_ids: list[str] = field(default_factory=list)  # the first MAX_REQUEST_IDS of them
    details: dict[str, int] = field(default_factory=dict)  # kind-specific counts
    running: int = 0  # requests in flight that it selected
    removed: bool = False

    def selects(self, key: str) -> bool:
        """Whether it acts on the request ``key`` (the request id, or the hop's sequence number)."""
        if self.share >= 1.0:
            return True
        return self.share > 0.0 and random.Random(f"{self.seed}:{self.name}:{key}").random() < self.share

    def count(self, detail: str, n: int = 1) -> None:
        self.details[detail] = self.details.get(detail, 0) + n

    def listing(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "params": self.params, "seed": self.seed, "share": self.share,
                "t_active": self.t_active, "acted_on": self.acted_on, "running": self.running,
                "details": dict(self.details)}


def parse_rule(name: str, body: Any, now_ns: int) -> Rule:
    """A rule from the control API's ``PUT /rules/{name}`` body; ``RuleError`` with the reason if wrong."""
    check_name(name)
    if not isinstance(body, dict):
        raise RuleError("the body must be a JSON object with kind, params, seed and share")
    unknown = sorted(set(body) - {"kind", "params", "seed", "share"})
    if unknown:
        raise RuleError(f"unknown field {unknown[0]!r} (known: kind, params, seed, share)")
    kind = body.get("kind")
    if kind not in KINDS:
        raise RuleError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    seed = body.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise RuleError(f"seed must be a whole number, got {seed!r}")
    share = _fraction("share", body.get("share", 1.0))
    return Rule(name, kind, _params(kind, body.get("params")), seed=seed, share=share, t_active=now_ns)


def request_key(request_id: str | None, seq: int) -> str:
    """What share decisions are seeded by: the request id when the request carries one (a load's UUID-shaped
    id without its run's tag)."""
    if not request_id:
        return str(seq)
    tagged = _RUN_TAGGED.fullmatch(request_id)
    return tagged[1] if tagged else request_id


@dataclass(eq=False)
class Acting:
    """One rule acting on one request: its event draws, and whether it has changed the request yet."""

    rule: Rule
    rng: random.Random
    evidence_key: str
    acted: bool = False

    @property
    def params(self) -> dict[str, Any]:
        return self.rule.params

    def act(self, detail: str, n: int = 1) -> None:
        """Count a change it made; the first one also counts the request."""
        if not self.acted:
            self.acted = True
            self.rule.acted_on += 1
            if len(self.rule.request_ids) < MAX_REQUEST_IDS:
                self.rule.request_ids.append(self.evidence_key)
        self.rule.count(detail, n)


_SINGLE = ("hold", "cut", "status", "rewrite", "deadline", "h2_rst_stream", "h2_header_leak", "h2_window")


class RequestRules:
    """The rules one request is subject to, chosen when its head arrived (see the module's docstring);
    ``http2``: it came on an HTTP/2 stream (else the HTTP/2 kinds pass it by)."""

    def __init__(self, rules: Iterable[Rule], request_id: str | None, seq: int, in_flight: int,
                 http2: bool = False) -> None:
        key = request_key(request_id, seq)
        evidence = request_id if request_id else f"seq:{seq}"
        self.single: dict[str, Acting] = {}
        self.silences: list[Acting] = []  # during: any (after N events of any kind)
        self.reasoning_silences: list[Acting] = []  # during: reasoning (after N reasoning events)
        self.events: list[Acting] = []  # drop, duplicate, split
        self.all: list[Acting] = []
        for rule in rules:
            if rule.kind in CONNECTION_KINDS or (not http2 and rule.kind in H2_KINDS):
                continue
            if not rule.selects(key) or not _storm_applies(rule, in_flight):
                continue
            if rule.kind in _SINGLE and rule.kind in self.single:
                continue
            acting = Acting(rule, random.Random(f"{rule.seed}:{rule.name}:{key}:events"), evidence)
            rule.running += 1
            self.all.append(acting)
            if rule.kind in _SINGLE:
                self.single[rule.kind] = acting
            elif rule.kind == "silence":
                # parse_rule fills ``during`` (default any)
                (self.reasoning_silences if rule.params["during"] == "reasoning" else self.silences).append(acting)
            else:
                self.events.append(acting)
        # whether a silence waits for reasoning events (the relay then looks for them in each event)
        self.watches_reasoning = bool(self.reasoning_silences)

    def get(self, kind: str) -> Acting | None:
        return self.single.get(kind)

    def release(self) -> list[str]:
        """The request ended: the names of the rules that changed it (its tap's ``faults``)."""
        for acting in self.all:
            acting.rule.running -= 1
        return [a.rule.name for a in self.all if a.acted]

    def silence_after(self, events_relayed: int) -> list[Acting]:
        """The silences due once ``events_relayed`` events have been relayed."""
        return [s for s in self.silences if s.params["after_events"] == events_relayed]

    def silence_before_reasoning(self, reasoning_relayed: int) -> list[Acting]:
        """The reasoning silences due before the next reasoning event, ``reasoning_relayed`` relayed so far:
        the silence falls between two reasoning events."""
        return [s for s in self.reasoning_silences if s.params["after_events"] == reasoning_relayed]

    def decide(self, kind: str, raw: bytes, index: int) -> list[list[bytes]]:
        """How one event is written: a list of copies (none: dropped), each a list of writes (two or more:
        split). ``index`` counts the request's data events before this one (for ``skip_first``)."""
        copies = [[raw]]
        for acting in self.events:
            copies = _apply(acting, kind, index, copies)
            if not copies:
                break
        return copies


def _storm_applies(rule: Rule, in_flight: int) -> bool:
    above = rule.params.get("storm_above") if rule.kind == "status" else None
    return above is None or in_flight > above


def _apply(acting: Acting, kind: str, index: int, copies: list[list[bytes]]) -> list[list[bytes]]:
    rule, params = acting.rule, acting.params
    if rule.kind == "split":
        if kind == "comment" or kind == "":
            return copies
        return [_split(acting, writes) for writes in copies]
    # drop and duplicate act on data events only: never [DONE], never a comment
    if kind in ("done", "comment", "") or index < params["skip_first"]:
        return copies
    if acting.rng.random() >= params["share_events"]:
        return copies
    if rule.kind == "drop":
        acting.act("events_dropped")
        return []
    acting.act("events_duplicated")
    return copies + [list(writes) for writes in copies]


def _split(acting: Acting, writes: list[bytes]) -> list[bytes]:
    raw = b"".join(writes)
    if len(raw) < 2 or acting.rng.random() >= acting.params["share_events"]:
        return writes
    inner = utf8_inner_offsets(raw) if acting.params["inside_utf8"] else []
    if inner:
        at = acting.rng.choice(inner)
        acting.act("events_split_inside_utf8")
    else:
        at = acting.rng.randrange(1, len(raw))
    acting.act("events_split")
    return [raw[:at], raw[at:]]
