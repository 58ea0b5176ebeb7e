"""The observation model: everything a verifier may look at, and what the run journal stores.

A leaf module (imports nothing of ours). All times are integers in nanoseconds from one monotonic
clock (``time.monotonic_ns()`` of the runner's host); ``Observations.wall_t0`` maps them to wall
time for reports. Every record round-trips losslessly through one JSON object per line.

Records:
- ``StreamRecord``: one request as the load generator saw it, timestamp by timestamp.
- ``MetricSample``: one value of one series scraped from the target's Prometheus endpoint.
- ``FaultEvent``: a fault being planned, injected, reverted, failing or rolled back, with evidence.
- ``PhaseWindow``: when a phase of the timeline started and ended.
- ``Note``: anything else worth keeping (the load generator's own event-loop lag, target facts).
- ``TapRecord``: one request as a stream hop of the path relayed it: what it received from upstream
  and what it forwarded downstream, event by event (the ``relay`` and ``abort_path`` verifiers).
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any, ClassVar, Literal

import orjson

__all__ = [
    "ABSENT_AFTER",
    "ABSENT_STATUSES",
    "END_RULE_TOPIC",
    "RECORD_TYPES",
    "RUN_SERIES",
    "STRICT_END",
    "EndRule",
    "ErrorInfo",
    "FaultEvent",
    "FaultSpan",
    "IN_FLIGHT",
    "PHASE_SCOPE",
    "Hangup",
    "MetricSample",
    "Note",
    "Observations",
    "PhaseWindow",
    "StreamRecord",
    "TAP_EVENT_KINDS",
    "TapRecord",
    "foreign_content_type",
    "from_json",
    "iter_journal",
    "read_jsonl",
    "to_json",
    "write_jsonl",
]

NS = 1_000_000_000


@dataclass(frozen=True)
class EndRule:
    """What a complete stream ends with, for the engine measured (its profile's end-of-stream rule).

    OpenAI's wire format ends a stream with a ``finish_reason`` and then ``data: [DONE]``; some
    engines never send ``[DONE]`` (``transformers serve``), and judging them by it would call every
    stream cut. The run records its rule in the journal (``Note(topic=END_RULE_TOPIC)``), so a
    re-judged run (``streamchaos verify``) applies the same one.
    """

    finish_reason: bool = True  # a non-null finish_reason must arrive
    done: bool = True  # data: [DONE] must arrive

    def as_dict(self) -> dict[str, bool]:
        return {"finish_reason": self.finish_reason, "done": self.done}

    @classmethod
    def from_dict(cls, data: Any) -> EndRule:
        """The rule a note recorded; anything unreadable is the strict rule."""
        if not isinstance(data, dict):
            return STRICT_END
        return cls(finish_reason=data.get("finish_reason") is not False, done=data.get("done") is not False)


STRICT_END = EndRule()
END_RULE_TOPIC = "engine_profile"  # the note that carries the run's rule under data["end"]
# "No metrics endpoint there": the scraper's rule (chaos.targets.scraper backs off after it) and the
# verifiers' (sla.engine_series: such evidence cannot exist), one definition for both. This many
# answers in a row with one of these statuses: 404, no such route; 501, llama.cpp's answer for an
# endpoint it was started without (``--metrics``, ``--no-slots``).
ABSENT_AFTER = 10
ABSENT_STATUSES = (404, 501)


@dataclass(frozen=True)
class ErrorInfo:
    """Why a stream failed: ``kind`` is one of http, connect, read, timeout, protocol, in_band,
    cancelled (still running when the run ended and the drain timed out).

    ``cause`` tells a ``read`` failure's ways apart, as the socket showed them: ``bare_eof`` (the
    peer closed the connection cleanly in the middle of a framed body: a truncated 200),
    ``reset`` (a TCP reset), ``no_response`` (closed before any response head), ``stale_connection``
    (a reset or EOF before any byte of the answer on a kept-alive connection that had served a
    response before: the server closed it after that response, which the message names by status
    and request id, so the loss is that response's, not a new failure). A ``timeout``'s cause says
    which: ``connect_timeout`` (the TCP connect's own limit: the request never reached the server),
    ``no_connection`` (the request timeout ran out before a connection was had: never sent), or
    ``request_timeout`` (sent, and no complete response within the request timeout: the client left
    a request the server may still serve). A ``protocol`` error's cause ``content_overflow``: the stream
    carried more than its ``max_tokens`` allows (events, body bytes or content characters, the bounds
    of ``chaos.load.limits``) and was cut; ``header_overflow``: the response head passed 64 KiB or 100
    fields. None where the client could not tell, and in journals written before it existed."""

    kind: str
    message: str
    status: int | None = None
    cause: str | None = None


@dataclass(frozen=True)
class Hangup:
    """The client ended the stream on purpose (a client fault): which fault and why."""

    fault: str
    reason: str  # after_tokens | after_time | while_queued | read_timeout | stopped (background load ended)
    t: int  # when the client hung up


@dataclass
class StreamRecord:
    """One streaming request, stamped from the generator's monotonic ns clock."""

    type: ClassVar[str] = "stream"

    id: str
    phase: str
    endpoint: str = "completions"  # completions | chat
    prompt_chars: int = 0
    max_tokens: int = 0
    expected_text: str | None = None  # a reference text to compare with (integrity)
    background: bool = False  # load a fault generates (kv.pressure hog): outside the SLA population
    t_scheduled: int | None = None  # when the arrival process wanted it sent (open loop)
    t_sent: int | None = None
    t_headers: int | None = None
    t_first_byte: int | None = None
    t_first_event: int | None = None
    t_first_content: int | None = None
    t_content: list[int] = field(default_factory=list)  # one stamp per event carrying content
    t_end: int | None = None  # terminal event ([DONE]), or when the stream closed/failed
    status: int | None = None  # HTTP status
    server: str | None = None  # the response's Server header: who answered (nginx names itself; see sla.proxy_fix)
    via: str | None = None  # its Via header (Caddy and other gateways add one)
    content_encoding: str | None = None  # its Content-Encoding (gzip: a compressing hop, which may hold the stream)
    # its Content-Type as sent ("" when the response had none; None: no response, or a journal from before)
    content_type: str | None = None
    x_accel_buffering: str | None = None  # its X-Accel-Buffering ("no": nginx's proxy buffering is off for it)
    finish_reason: str | None = None
    done_seen: bool = False
    in_band_error: str | None = None  # an {"error": ...} event inside the stream
    error: ErrorInfo | None = None
    hangup: Hangup | None = None
    bytes_received: int = 0
    events: int = 0
    text: str = ""
    usage: dict[str, Any] | None = None
    utf8_errors: int = 0  # bytes that did not decode as UTF-8
    json_errors: int = 0  # data payloads that were not valid JSON
    sse_errors: int = 0  # malformed SSE framing (e.g. data after [DONE])
    read_count: int = 0  # network reads that delivered bytes
    split_chars: int = 0  # multibyte characters that arrived split across reads
    repeated_events: int = 0  # content events whose whole payload (data, SSE id) repeated the one before
    # production-shaped load (chaos.load.workloads; docs/workloads.md): which conversation and turn (1-based)
    # a request is, the workload kind that made it, and the prompt's planned length in the target's tokens
    # where a tokenizer made it to measure (trace replay, shared prefixes); None for single-turn load
    session: str | None = None
    turn: int | None = None
    workload: str | None = None  # single | sessions | shared_prefix | trace; None: single (older journals)
    prompt_tokens: int | None = None
    prefix_group: int | None = None  # shared_prefix: which of the P shared prefixes it began with
    # reasoning streams (vLLM's delta.reasoning_content / delta.reasoning): one stamp per event carrying
    # reasoning text, and that text; t_content and t_first_content stay the visible output's
    t_reasoning: list[int] = field(default_factory=list)
    reasoning_text: str = ""
    # streamed tool calls (delta.tool_calls): one stamp per event carrying a tool-call fragment; what they
    # assembled to, by index: {"0": {"id": ..., "name": ..., "arguments": "<the concatenated fragments>"}};
    # fragments that broke the protocol (a name sent twice, a fragment with no index) are counted
    t_tool_calls: list[int] = field(default_factory=list)
    tool_calls: dict[str, Any] | None = None
    tool_call_errors: int = 0
    # the connection under the request (chaos.load.http1 / http2): its protocol ("http/1.1" | "h2"), which
    # connection of the client's it was ("c7": the 7th it opened; HTTP/2 streams of one connection share it)
    # and the HTTP/2 stream id, whether it was reused (False: opened for this request), and on a new one the
    # ends of the TCP connect (``t_connected``) and of the TLS handshake (``t_tls``); ``t_request``: when the
    # request's bytes were written (``t_sent``, on a new connection, is when its connect began)
    protocol: str | None = None
    connection: str | None = None
    stream_id: int | None = None
    reused: bool | None = None
    t_connected: int | None = None
    t_tls: int | None = None
    t_request: int | None = None

    @property
    def complete(self) -> bool:
        """Finished properly by the strict rule: a finish_reason, ``[DONE]`` and no error of any kind.

        Verifiers and reports judge by the run's rule instead: ``Observations.complete(stream)``.
        """
        return self.is_complete(STRICT_END)

    def is_complete(self, rule: EndRule = STRICT_END) -> bool:
        """Finished properly by ``rule``: what it requires arrived, and no error of any kind did.

        A stream whose rule does not require ``[DONE]`` must still have ended cleanly: an HTTP
        status below 400 and no transport, protocol or in-band error (a cut connection is a
        ``read`` error, a body that ends cleanly is not).
        """
        return (
            (self.finish_reason is not None or not rule.finish_reason)
            and (self.done_seen or not rule.done)
            and self.in_band_error is None
            and self.error is None
            and (self.status is None or self.status < 400)
        )

    @property
    def t_first_token(self) -> int | None:
        """The first event that carried a token of any kind: reasoning, visible content or a tool-call
        fragment (AIPerf's and GuideLLM's first token; for a stream without reasoning or tool calls,
        ``t_first_content``)."""
        firsts = [t for t in (self.t_first_content, _first(self.t_reasoning), _first(self.t_tool_calls))
                  if t is not None]
        return min(firsts) if firsts else None

    @property
    def t_first_output(self) -> int | None:
        """The first event that carried visible output: content text or a tool-call fragment, not
        reasoning (AIPerf's first output token, TTFO)."""
        firsts = [t for t in (self.t_first_content, _first(self.t_tool_calls)) if t is not None]
        return min(firsts) if firsts else None

    @property
    def t_tokens(self) -> list[int]:
        """Every event stamp that carried a token of any kind, merged in time order (content alone for
        a stream without reasoning or tool calls)."""
        if not self.t_reasoning and not self.t_tool_calls:
            return self.t_content
        return sorted(self.t_content + self.t_reasoning + self.t_tool_calls)

    @property
    def token_events(self) -> int:
        """Events that carried a token of any kind (content, reasoning, tool-call fragments)."""
        return len(self.t_content) + len(self.t_reasoning) + len(self.t_tool_calls)

    @property
    def ttft_ns(self) -> int | None:
        """Time to the first token of any kind (reasoning counts): ``t_first_token - t_sent``."""
        first = self.t_first_token
        if self.t_sent is None or first is None:
            return None
        return first - self.t_sent

    @property
    def ttfo_ns(self) -> int | None:
        """Time to the first visible output (content or a tool call, not reasoning): ``t_first_output -
        t_sent``; equal to ``ttft_ns`` for a stream without reasoning."""
        first = self.t_first_output
        if self.t_sent is None or first is None:
            return None
        return first - self.t_sent

    @property
    def ttfb_ns(self) -> int | None:
        if self.t_sent is None or self.t_first_byte is None:
            return None
        return self.t_first_byte - self.t_sent

    @property
    def gaps_ns(self) -> list[int]:
        """Gaps between consecutive token events of any kind (``t_tokens``): the content gaps of a stream
        without reasoning or tool calls, as vLLM bench's ITL and AIPerf's inter-chunk latency time them."""
        return _gaps(self.t_tokens)

    def stamps_within(self, kind: str) -> list[int]:
        """The event stamps of one kind: ``all`` (every token event, ``t_tokens``), ``content`` (visible text
        only) or ``reasoning`` (reasoning text only)."""
        if kind == "all":
            return self.t_tokens
        if kind == "content":
            return self.t_content
        if kind == "reasoning":
            return self.t_reasoning
        raise ValueError(f"gaps within all, content or reasoning, not {kind!r}")

    def gaps_within(self, kind: str) -> list[int]:
        """Gaps between consecutive events of one kind (``stamps_within``)."""
        return _gaps(self.stamps_within(kind))


def _first(stamps: list[int]) -> int | None:
    return stamps[0] if stamps else None


def _gaps(stamps: list[int]) -> list[int]:
    return [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


@dataclass(frozen=True)
class MetricSample:
    """One scraped value: series name, its labels, the value, when it was scraped."""

    type: ClassVar[str] = "metric"

    name: str
    labels: dict[str, str]
    value: float
    t: int


@dataclass(frozen=True)
class FaultEvent:
    """A step in a fault's life. ``action``: plan | inject | revert | error | rollback.

    ``plan`` is written (and fsync'd) before an inject and carries ``undo``: what will be changed
    and how a later process can undo it. ``evidence`` proves the fault took effect (a toxic as the
    proxy lists it, a clock read back) or says what was undone. ``scope`` (on ``plan``): whom the
    fault can touch, ``in_flight`` (every stream alive while it is in force) or ``phase`` (only
    streams sent in its own phase: a client fault's rule is drawn, a stream hop's rules are taken,
    when a request is sent); a journal
    written before it existed reads by its kind (``_old_scope``).
    """

    type: ClassVar[str] = "fault"

    fault: str  # the fault's name in the experiment
    kind: str  # its registered kind, e.g. network.latency
    action: Literal["plan", "inject", "revert", "error", "rollback"]
    t: int
    phase: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    undo: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    t_started: int | None = None  # inject, revert: when the step began (``t`` is when it returned)
    scope: str = "in_flight"  # IN_FLIGHT | PHASE_SCOPE: whom it can touch (``Observations.population``)


@dataclass(frozen=True)
class PhaseWindow:
    type: ClassVar[str] = "phase"

    """A phase: ``t_start`` when its streams began to join it, before its injects; ``t_in_force`` when
    its last inject returned (its clock starts then); ``t_end`` when it was over, its faults reverted."""

    name: str
    t_start: int
    t_end: int | None = None
    t_in_force: int | None = None
    # a phase that runs until its verdicts decide (``duration: {min, max}``): how many sequential looks
    # it made (0: a phase of fixed length), and what ended it: "decided" (every verdict judged on it
    # was) or "max" (its longest allowed time); None for a fixed phase. ``chaos.execution.sequential``
    looks: int = 0
    stopped_by: str | None = None
    # when the look that ended it was taken: its verdicts judge the streams that had ended by then, the
    # data that look decided on (a stream still running then is left out: ``sequential_view``)
    t_decided: int | None = None


@dataclass(frozen=True)
class Note:
    """Free-form facts: ``topic`` says what (client_lag, target, gpu, proxy, run)."""

    type: ClassVar[str] = "note"

    topic: str
    t: int
    data: dict[str, Any] = field(default_factory=dict)


# the kinds of SSE event a tap records: a ``data:`` payload (``usage`` when it carries a usage record,
# ``finish`` when it carries a non-null finish_reason, ``error`` when it is an {"error": ...} object),
# ``done`` (``data: [DONE]``), ``comment`` (``: ...``, a keep-alive)
TAP_EVENT_KINDS = ("data", "usage", "finish", "error", "done", "comment")


@dataclass(frozen=True)
class TapRecord:
    """One request through one stream hop: both sides of it, stamped on the host's monotonic clock.

    ``up`` is what the hop received from its upstream (the next hop or the engine), ``down`` what it
    wrote to its downstream (the previous hop or the load): each a list of ``[t_ns, kind, digest]``
    per SSE event, ``digest`` the first 16 hex digits of the SHA-256 of the event's payload bytes
    (after any Content-Encoding was undone), so two taps around a gateway compare event by event.
    A hop keeps at most a bounded number of events per side (``dropped_*`` counts the rest).

    Ends (``up_end``): ``done`` (the body ended after ``[DONE]``), ``eof`` (the body ended cleanly
    without ``[DONE]``), ``bare_eof`` (the connection closed mid-body), ``reset`` (a TCP reset),
    ``timeout``, ``cut`` (a fault at this hop ended it), ``closed`` (this hop closed it because its
    client left), ``none`` (never opened). ``down_end``: ``done``, ``eof``, ``bare_eof``, ``reset``,
    ``error_event``, ``deadline``, ``status`` (answered with a fault's status), ``client_gone``.
    """

    type: ClassVar[str] = "tap"

    hop: str  # the stream hop's name in ``path``
    seq: int  # the hop's own request counter (from 1)
    # the request's X-Request-Id as it reached the hop (None: something dropped it); read back from a taps file
    # (chaos.execution.path.read_taps), one of the load's UUID-shaped ids is the record id it stands for
    # (chaos.model.request_ids.record_id_of), so taps pair with StreamRecord.id, and ``wire_id`` keeps it as sent
    request_id: str | None
    target: str  # request target, e.g. /v1/completions
    t_accept: int  # the downstream connection's request head parsed
    t_upstream_open: int | None = None  # the upstream connection made
    t_upstream_head: int | None = None  # the upstream response's head parsed
    t_end: int | None = None  # the downstream response ended (or was abandoned)
    t_client_gone: int | None = None  # the downstream client closed before the response ended
    t_upstream_closed: int | None = None  # the hop closed (or lost) its upstream connection
    status_up: int | None = None
    status_down: int | None = None
    headers_up: dict[str, str] = field(default_factory=dict)  # a fixed subset, lower-case names
    headers_down: dict[str, str] = field(default_factory=dict)
    up: list[list[Any]] = field(default_factory=list)  # [t_ns, kind, digest] per event received upstream
    down: list[list[Any]] = field(default_factory=list)  # [t_ns, kind, digest] per event written downstream
    dropped_up: int = 0
    dropped_down: int = 0
    bytes_up: int = 0  # body bytes as received (encoded)
    bytes_down: int = 0  # body bytes as written
    reads_up: int = 0  # socket reads that delivered body bytes from upstream
    up_end: str = "none"
    down_end: str = "none"
    faults: list[str] = field(default_factory=list)  # the names of the rules that acted on this request
    wire_id: str | None = None  # the X-Request-Id as sent, where ``request_id`` is the record id it stood for
    traceparent: str | None = None  # the request's W3C traceparent as it reached the hop (``--otlp``; None: none)


Record = StreamRecord | MetricSample | FaultEvent | PhaseWindow | Note | TapRecord
_TYPES: dict[str, type[Record]] = {
    cls.type: cls for cls in (StreamRecord, MetricSample, FaultEvent, PhaseWindow, Note, TapRecord)}
RECORD_TYPES = frozenset(_TYPES)  # the "type" values of journal lines that are observation records
_NESTED: dict[str, type] = {"error": ErrorInfo, "hangup": Hangup}
_STREAM_FIELDS = tuple(f.name for f in fields(StreamRecord))


_LINE_BREAKS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def _stream_body(record: StreamRecord) -> dict[str, Any]:
    """``asdict`` of a stream record without its deep copies: what the journal writes once per
    request (``asdict`` copied each of the 64 stamps of a request one by one: 0.6 ms a record, the
    runner's largest cost at 1,000 streams turning over). Read from the instance's ``__dict__``:
    a third of the cost of a ``getattr`` per field."""
    attrs = record.__dict__
    body = {name: attrs[name] for name in _STREAM_FIELDS}
    for key in _NESTED:
        if body[key] is not None:
            body[key] = asdict(body[key])
    return body


def _dumps(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


def _dumps_stream(body: dict[str, Any]) -> str:
    """A stream record's body as ``_dumps`` writes it, by orjson: its 64 stamps and text in a quarter
    of ``json.dumps``'s time (the runner's largest cost per request at 1,000 streams turning over).
    Only for stream records: orjson writes a float NaN as null where ``json`` keeps it, which a
    scraped metric may be. ``json`` again for what orjson refuses (an int over 64 bits, a lone
    surrogate, a key that is not a str)."""
    try:
        return orjson.dumps(body).decode("utf-8")
    except TypeError:  # orjson.JSONEncodeError is one
        return _dumps(body)


def to_json(record: Record) -> str:
    """One record → one JSON line (no newline)."""
    if type(record) is StreamRecord:
        body = _stream_body(record)
        body["type"] = record.type
        line = _dumps_stream(body)
    elif type(record) is MetricSample:  # four per host sample: ``asdict``'s recursion was most of their cost
        line = _dumps({"name": record.name, "labels": dict(record.labels), "value": record.value, "t": record.t,
                       "type": record.type})
    else:
        body = asdict(record)
        body["type"] = record.type
        line = _dumps(body)
    # Keep one record per line for any line splitter: escape the Unicode line breaks JSON allows raw.
    # Looked for first: translate() maps the line char by char (a third of this function's time).
    if "\x85" in line or "\u2028" in line or "\u2029" in line:
        line = line.translate(_LINE_BREAKS)
    return line


def foreign_content_type(content_type: str | None) -> bool:
    """Whether a response's Content-Type says it is not an event stream: one was sent and its media
    type (case-insensitive, parameters such as ``; charset=utf-8`` aside) is not ``text/event-stream``.
    A missing one ("" or None) is not: a homemade server or a proxy may drop the header and still
    stream valid SSE, which is parsed and judged as such. Pure."""
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() != "text/event-stream"


# fault kinds whose rule a request takes when it is sent (``Fault.scope`` = "phase"): what a journal
# written before ``FaultEvent.scope`` existed meant for them (this module imports no fault to ask)
_PHASE_KINDS = ("client.", "stream.")


def _old_scope(kind: str) -> str:
    """A fault event's scope when its line has none (a journal from before it): by its kind. Pure."""
    return PHASE_SCOPE if kind.startswith(_PHASE_KINDS) else IN_FLIGHT


def from_json(line: str | dict[str, Any]) -> Record:
    """One JSON line (or its parsed dict) → the record it came from."""
    body = dict(json.loads(line) if isinstance(line, str) else line)
    cls = _TYPES[body.pop("type")]
    names = {f.name for f in fields(cls)}
    kwargs = {k: v for k, v in body.items() if k in names}
    if cls is FaultEvent and "scope" not in kwargs:
        # re-verifying an old journal must judge its client and stream faults' streams as they were
        kwargs["scope"] = _old_scope(str(kwargs.get("kind", "")))
    for key, nested in _NESTED.items():
        if cls is StreamRecord and isinstance(kwargs.get(key), dict):
            kwargs[key] = nested(**kwargs[key])
    return cls(**kwargs)


def iter_journal(path: str | Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a journal file, skipping a line a killed writer left half-written."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                body = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(body, dict):
                yield body


def write_jsonl(records: Iterable[Record], out: IO[str]) -> None:
    for record in records:
        out.write(to_json(record) + "\n")


def read_jsonl(lines: Iterable[str]) -> Iterator[Record]:
    """Records from JSON lines; lines of other types (``run``, ...) are skipped."""
    for line in lines:
        line = line.strip()
        if not line:
            continue
        body = json.loads(line)
        if body.get("type") in _TYPES:
            yield from_json(body)


IN_FLIGHT = "in_flight"  # a fault's scope: it touches every stream alive while it is in force
PHASE_SCOPE = "phase"  # a fault's scope: it touches only streams sent in its own phase (client, stream faults)
_NEVER = 1 << 63  # an end not recorded (a fault never reverted, a stream cut by a killed run): the run's end


@dataclass(frozen=True)
class FaultSpan:
    """One fault's time in force, as its events recorded it: from its inject's ``t_started`` (else its
    plan) to its revert's ``t`` (else its last error or rollback; ``end`` None: the run's end)."""

    fault: str
    phase: str
    scope: str
    start: int
    end: int | None

    def touches(self, stream: StreamRecord) -> bool:
        """Whether ``stream`` is this fault's: its life [t_sent, t_end or the run's end] overlaps the
        span (an ``in_flight`` fault), or it was sent in the fault's phase while it was in force (a
        ``phase`` one: its rule is drawn when a request is sent)."""
        sent, end = stream.t_sent, self.end if self.end is not None else _NEVER
        if sent is None:
            return False
        if self.scope == PHASE_SCOPE:
            return stream.phase == self.phase and self.start <= sent < end
        return sent < end and (stream.t_end if stream.t_end is not None else _NEVER) > self.start


def _merged(spans: list[FaultSpan]) -> list[tuple[int, int]]:
    """The spans as disjoint [start, end) intervals in order (an open end: ``_NEVER``)."""
    out: list[tuple[int, int]] = []
    for start, end in sorted((w.start, w.end if w.end is not None else _NEVER) for w in spans):
        if out and start < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _spans(events: Iterable[FaultEvent]) -> list[FaultSpan]:
    """Every fault's time in force (``FaultSpan``), in order of start; each ``plan`` opens one."""
    open_: dict[str, dict[str, Any]] = {}
    done: list[dict[str, Any]] = []
    for event in sorted(events, key=lambda e: e.t):
        span = open_.get(event.fault)
        if span is None and event.action not in ("plan", "inject"):
            continue  # nothing in force to end (a rollback after the revert)
        if event.action == "plan" or span is None:  # an inject without a plan: a journal cut at its head
            span = {"fault": event.fault, "phase": event.phase, "scope": event.scope, "start": event.t, "end": None,
                    "fallback": None}
            open_[event.fault] = span
            done.append(span)
        if event.action == "inject":
            span["start"] = event.t_started if event.t_started is not None else span["start"]
        elif event.action == "revert":
            span["end"] = event.t
            del open_[event.fault]  # a later event of this name (another run's rollback) opens its own
        elif event.action in ("error", "rollback"):
            span["fallback"] = event.t
    spans = [FaultSpan(d["fault"], d["phase"], d["scope"], d["start"],
                       d["end"] if d["end"] is not None else d["fallback"]) for d in done]
    return sorted(spans, key=lambda w: w.start)


# Series the run records about its own GPU and host (chaos.execution.telemetry, chaos.host.contention),
# not scraped from the target: "did the target export any metrics?" must leave them out (a run with
# host samples against an engine without /metrics read as one whose series were merely missing).
RUN_SERIES = frozenset({
    "gpu_sm_clock_mhz", "gpu_clock_event_reasons", "gpu_memory_used_bytes", "gpu_power_watts",
    "host_busy_cores", "host_run_cores", "host_neighbour_cores", "host_run_wait_cores",
})


@dataclass
class Observations:
    """What one run observed; the verifiers' only input."""

    experiment: str = ""
    wall_t0: float = 0.0  # wall-clock seconds at monotonic ``t0``
    t0: int = 0
    streams: list[StreamRecord] = field(default_factory=list)
    metrics: list[MetricSample] = field(default_factory=list)
    faults: list[FaultEvent] = field(default_factory=list)
    phases: list[PhaseWindow] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    taps: list[TapRecord] = field(default_factory=list)
    # an SLA entry's ``turns:`` (chaos.model.turns.turn_view): ``population`` judges only the streams of those
    # turns, while ``streams`` stays whole for what a verdict reads around them (a turn's turn before, the
    # run's busy periods)
    turns: Container[int] | None = None

    def add(self, record: Record) -> None:
        if isinstance(record, StreamRecord):
            self.streams.append(record)
        elif isinstance(record, MetricSample):
            self.metrics.append(record)
        elif isinstance(record, FaultEvent):
            self.faults.append(record)
        elif isinstance(record, PhaseWindow):
            # a phase is written when it starts and again when it ends: keep the latest
            self.phases = [p for p in self.phases if p.name != record.name] + [record]
        elif isinstance(record, Note):
            self.notes.append(record)
        elif isinstance(record, TapRecord):
            self.taps.append(record)

    def records(self) -> Iterator[Record]:
        yield from self.phases
        yield from self.streams
        yield from self.metrics
        yield from self.faults
        yield from self.notes
        yield from self.taps

    def taps_at(self, hop: str) -> list[TapRecord]:
        """The requests one stream hop relayed, in its own order."""
        return sorted((t for t in self.taps if t.hop == hop), key=lambda t: t.seq)

    @property
    def end_rule(self) -> EndRule:
        """The run's end-of-stream rule: the last one its notes recorded, else the strict one."""
        for note in reversed(self.notes):
            if note.topic == END_RULE_TOPIC and isinstance(note.data.get("end"), dict):
                return EndRule.from_dict(note.data["end"])
        return STRICT_END

    def complete(self, stream: StreamRecord) -> bool:
        """Whether ``stream`` finished properly by this run's end-of-stream rule."""
        return stream.is_complete(self.end_rule)

    def population(self, phase: str | None = None) -> list[StreamRecord]:
        """The streams an SLA judges (``_phase_population``), of the ``turns`` it judges where it names some (a
        request outside any conversation is its own first turn)."""
        judged = self._phase_population(phase)
        if self.turns is None:
            return judged
        return [s for s in judged if (s.turn if s.turn is not None else 1) in self.turns]

    def _phase_population(self, phase: str | None) -> list[StreamRecord]:
        """Never background load; for ``phase``, the streams sent in it that
        no ``in_flight`` fault of another phase touched, and the streams sent elsewhere that one of its
        own touched (``FaultSpan.touches``). A stream is judged by the fault it lived through, not by
        when it was sent: on a slow engine a stream sent just before a kill outlives its phase and ends
        in the kill's error, which is the kill's, not the baseline's. ``phase`` None: the whole run."""
        if phase is None:
            return [s for s in self.streams if not s.background]
        spans = [w for w in self.fault_spans() if w.scope == IN_FLIGHT]
        if not spans:
            return [s for s in self.streams if not s.background and s.phase == phase]
        own = _merged([w for w in spans if w.phase == phase])
        other = _merged([w for w in spans if w.phase != phase])
        # inlined, not a call per stream, and the envelope first (most streams lie outside every span):
        # a journal holds up to 100k streams, and this runs once per verdict
        sides = {True: (other[0][0], other[-1][1], other) if other else (_NEVER, -1, other),
                 False: (own[0][0], own[-1][1], own) if own else (_NEVER, -1, own)}
        out = []
        for s in self.streams:
            if s.background:
                continue
            mine = s.phase == phase
            lo, hi, windows = sides[mine]
            sent, touched = s.t_sent, False
            if sent is not None and sent < hi:
                end = s.t_end if s.t_end is not None else _NEVER
                if end > lo:
                    for a, b in windows:
                        if sent < b and end > a:
                            touched = True
                            break
            if touched is not mine:
                out.append(s)
        return out

    def fault_spans(self) -> list[FaultSpan]:
        """Each fault's time in force, in order of start (``FaultSpan``)."""
        return _spans(self.faults)

    def touched(self) -> dict[str, list[str]]:
        """``{fault: [stream ids]}``: the streams (background load left out) each fault touched, every
        fault the journal names listed (an empty list: it touched none)."""
        spans = self.fault_spans()
        out: dict[str, list[str]] = {w.fault: [] for w in spans}
        for s in self.streams:
            if s.background or s.t_sent is None:
                continue
            for w in spans:
                if w.touches(s) and (not out[w.fault] or out[w.fault][-1] != s.id):
                    out[w.fault].append(s.id)
        return out

    def moves(self) -> dict[str, dict[str, dict[str, int]]]:
        """Per phase, the streams ``population`` moved: ``{phase: {"moved_in": {fault: n}, "moved_out":
        {fault: n}}}`` — sent elsewhere and touched by a fault of the phase, or sent in it and touched by
        a fault of another; each stream counted once per phase, under the first fault (by start) that
        took it. Phases that gained or lost none are left out."""
        spans = [w for w in self.fault_spans() if w.scope == IN_FLIGHT]
        out: dict[str, dict[str, dict[str, int]]] = {}
        if not spans:
            return out
        merged = _merged(spans)
        lo, hi = merged[0][0], merged[-1][1]
        for s in self.streams:
            if s.background or s.t_sent is None or s.t_sent >= hi or (s.t_end is not None and s.t_end <= lo):
                continue  # outside every span: most streams, skipped without a call per span
            first: dict[str, str] = {}  # phase -> the first of its faults that touched the stream
            for w in spans:
                if w.phase != s.phase and w.phase not in first and w.touches(s):
                    first[w.phase] = w.fault
            for phase, fault in first.items():
                _count(out, phase, "moved_in", fault)
            if first:
                _count(out, s.phase, "moved_out", next(iter(first.values())))
        return out

    def phase(self, name: str) -> PhaseWindow | None:
        return next((p for p in self.phases if p.name == name), None)

    def series(self, name: str, labels: dict[str, str] | None = None) -> list[MetricSample]:
        """Samples of one series (all label sets unless ``labels`` filters), in time order."""
        out = [
            m
            for m in self.metrics
            if m.name == name and (labels is None or all(m.labels.get(k) == v for k, v in labels.items()))
        ]
        return sorted(out, key=lambda m: m.t)

    def target_metrics(self) -> list[MetricSample]:
        """The samples scraped from the target (and its pods): every series but the run's own (``RUN_SERIES``)."""
        return [m for m in self.metrics if m.name not in RUN_SERIES]

    def notes_on(self, topic: str) -> list[Note]:
        return [n for n in self.notes if n.topic == topic]

    @classmethod
    def load(cls, path: str | Path) -> Observations:
        """Read a run journal (``journal.jsonl``), also one cut short by a killed run."""
        obs = cls()
        for body in iter_journal(path):
            if body.get("type") == "run":
                obs.experiment = body.get("experiment", obs.experiment)
                obs.wall_t0 = body.get("wall_t0", obs.wall_t0)
                obs.t0 = body.get("t0", obs.t0)
            elif body.get("type") in _TYPES:
                obs.add(from_json(body))
        return obs

    def dump(self, path: str | Path) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps({"type": "run", "experiment": self.experiment, "wall_t0": self.wall_t0,
                                "t0": self.t0}) + "\n")
            write_jsonl(self.records(), f)


def _count(moves: dict[str, dict[str, dict[str, int]]], phase: str, way: str, fault: str) -> None:
    counts = moves.setdefault(phase, {"moved_in": {}, "moved_out": {}})[way]
    counts[fault] = counts.get(fault, 0) + 1
