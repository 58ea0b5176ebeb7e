"""A run's streams as OpenTelemetry metrics and spans, exported over OTLP/HTTP (``run --otlp``,
``report RUN_DIR --otlp``, ``chaos.run(..., otlp=True)``).

Pure core, thin edge: ``plan_spans`` and ``plan_points`` turn the observations into plain values
(``SpanPlan``, ``Point``) under the GenAI client semantic conventions; ``export`` turns those into
SDK objects and hands them to the SDK's OTLP/HTTP exporters, which read ``OTEL_EXPORTER_OTLP_*``
themselves (endpoint, headers, timeout, TLS, compression). The resource is the SDK's own
(``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``) with ``service.name`` ``streamchaos`` unless set.

Metrics (histograms, the semantic conventions' bucket advice applied by Views):
``gen_ai.client.operation.duration`` (s, request sent to stream end),
``gen_ai.client.operation.time_to_first_chunk`` (s),
``gen_ai.client.operation.time_per_output_chunk`` (s, one point per chunk after the first: the gap
since the chunk before, as the convention defines it), ``gen_ai.client.token.usage`` ({token}, from the
stream's ``usage`` when it has one). Their points carry the export's time, not the stream's.

Spans, one trace per run (ids from ``chaos.model.trace_ids``): the run; under it a span per phase; under
a phase a span per fault (inject to revert) and a CLIENT span per stream (request sent to stream end),
whose span id is the one the request's ``traceparent`` named. Built after the run from the journal,
with the recorded times.

OpenTelemetry is an optional extra (in the streamchaos clone, ``pip install -e '.[otel]'``); without it ``require_otel``
raises a ``UsageError`` that says so. An export that fails never changes the run's exit code: it is
printed once and written to ``otlp.json`` in the run directory.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from chaos.execution.events import RunEvent, RunFinished
from chaos.model.errors import UsageError
from chaos.model.observations import NS, FaultEvent, Observations, StreamRecord, iter_journal
from chaos.model.request_ids import RequestIds, run_tag
from chaos.model.trace_ids import span_id_of, trace_id_of

if TYPE_CHECKING:
    from chaos.execution.result import Result

__all__ = ["INSTALL_HINT", "OTLP_FILE", "ExportOutcome", "OtlpExporter", "Point", "RunFacts", "SpanPlan", "export",
           "export_run_dir", "facts_from_result", "facts_from_run_dir", "plan_points", "plan_spans", "require_otel"]

INSTALL_HINT = "in the streamchaos clone, pip install -e '.[otel]'"
OTLP_FILE = "otlp.json"  # in the run directory: what the export sent, or why it failed
SCOPE = "streamchaos"
DEFAULT_SERVICE = "streamchaos"
FIRST_TOKEN_EVENT = "streamchaos.first_token"  # the conventions name no event for it (only an attribute)
FAULT_EVENT = "streamchaos.fault"
SPAN_BATCH = 512  # spans per OTLP request: far below the exporter's 64 MiB request limit


def _timeout_s(signal: str) -> float:
    """The export timeout the SDK reads for ``signal`` (TRACES, METRICS), in seconds (default 10)."""
    for name in (f"OTEL_EXPORTER_OTLP_{signal}_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        try:
            return float(os.environ[name])
        except (KeyError, ValueError):
            continue
    return 10.0
# the semantic conventions' ExplicitBucketBoundaries advice for these metrics (gen-ai-metrics.md)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
PROVIDER = "openai"  # gen_ai.provider.name: the API flavour the load speaks (OpenAI-compatible), not who serves it

Attr = str | bool | int | float | tuple[str, ...]


def require_otel(what: str = "--otlp") -> None:
    """Raise ``UsageError`` naming the extra when the OpenTelemetry SDK or its OTLP/HTTP exporter is missing."""
    try:
        import opentelemetry.exporter.otlp.proto.http  # noqa: F401
        import opentelemetry.sdk  # noqa: F401
        import opentelemetry.semconv  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"{what} needs the OpenTelemetry SDK and its OTLP/HTTP exporter ({exc.name} is not "
                         f"installed): {INSTALL_HINT}") from None


# ---- what is exported, as plain values -------------------------------------------------------------

@dataclass(frozen=True)
class RunFacts:
    """What a run's export needs beyond its observations."""

    run_id: str
    experiment: str
    status: str
    exit_code: int
    model: str
    base_url: str  # the target's API root: server.address and server.port
    started: float  # wall seconds
    ended: float
    request_ids: RequestIds  # how the load named its requests on the wire: the streams' span ids
    fault_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    error: str | None = None

    @property
    def trace_id(self) -> str:
        return trace_id_of(self.run_id)


@dataclass(frozen=True)
class EventPlan:
    name: str
    t_ns: int  # Unix epoch ns
    attributes: Mapping[str, Attr] = field(default_factory=dict)


@dataclass(frozen=True)
class SpanPlan:
    """One span: ids as hex, times as Unix epoch ns; ``error`` set: status ERROR with it."""

    name: str
    span_id: str
    parent_id: str | None
    client: bool  # SpanKind.CLIENT (a stream), else INTERNAL
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Attr]
    events: tuple[EventPlan, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class Point:
    """One histogram measurement."""

    metric: str
    value: float
    attributes: Mapping[str, Attr]


def _names() -> Any:
    """The semantic-convention constants (``opentelemetry-semantic-conventions``), imported on first use."""
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as ga
    from opentelemetry.semconv._incubating.metrics import gen_ai_metrics as gm
    from opentelemetry.semconv.attributes import error_attributes, http_attributes, server_attributes

    class N:
        OPERATION, PROVIDER, REQUEST_MODEL = ga.GEN_AI_OPERATION_NAME, ga.GEN_AI_PROVIDER_NAME, ga.GEN_AI_REQUEST_MODEL
        TOKEN_TYPE, MAX_TOKENS, STREAM = ga.GEN_AI_TOKEN_TYPE, ga.GEN_AI_REQUEST_MAX_TOKENS, ga.GEN_AI_REQUEST_STREAM
        FINISH, INPUT_TOKENS, OUTPUT_TOKENS = (ga.GEN_AI_RESPONSE_FINISH_REASONS, ga.GEN_AI_USAGE_INPUT_TOKENS,
                                               ga.GEN_AI_USAGE_OUTPUT_TOKENS)
        TTFC = ga.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK
        CHAT, TEXT = ga.GenAiOperationNameValues.CHAT.value, ga.GenAiOperationNameValues.TEXT_COMPLETION.value
        INPUT, OUTPUT = ga.GenAiTokenTypeValues.INPUT.value, ga.GenAiTokenTypeValues.OUTPUT.value
        ADDRESS, PORT = server_attributes.SERVER_ADDRESS, server_attributes.SERVER_PORT
        ERROR_TYPE, STATUS = error_attributes.ERROR_TYPE, http_attributes.HTTP_RESPONSE_STATUS_CODE
        DURATION, TTFC_METRIC = gm.GEN_AI_CLIENT_OPERATION_DURATION, gm.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK
        TPOC, TOKENS = gm.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK, gm.GEN_AI_CLIENT_TOKEN_USAGE
        metrics = gm

    return N


def _server(base_url: str) -> dict[str, Attr]:
    parts = urlsplit(base_url)
    out: dict[str, Attr] = {}
    if parts.hostname:
        out["server.address"] = parts.hostname
        try:
            port = parts.port
        except ValueError:
            port = None
        out["server.port"] = port if port is not None else (443 if parts.scheme == "https" else 80)
    return out


def _fault_names(obs: Observations) -> dict[str, list[str]]:
    """{stream id: [fault names]} for every stream a fault's time in force touched (background load too)."""
    spans = obs.fault_spans()
    out: dict[str, list[str]] = {}
    for s in obs.streams:
        for w in spans:
            if w.touches(s) and w.fault not in out.setdefault(s.id, []):
                out[s.id].append(w.fault)
    return out


def _error_type(st: StreamRecord, complete: bool) -> str | None:
    """error.type of a failed stream: the HTTP status, the transport error's kind, ``in_band``, or
    ``early_close`` for one that ended short of its end without an error; None when it did not fail
    (a hang-up the load made on purpose is not a failure)."""
    from sla.stream_errors import error_kinds

    kinds = error_kinds(st)
    if kinds:
        return str(st.status) if kinds[0] == "http" and st.status is not None else kinds[0]
    if st.hangup is None and not complete:
        return "early_close"
    return None


def _stream_end(st: StreamRecord) -> int | None:
    return st.t_end if st.t_end is not None else (st.hangup.t if st.hangup is not None else None)


def _common(n: Any, facts: RunFacts, st: StreamRecord, faults: list[str], error: str | None) -> dict[str, Attr]:
    attrs: dict[str, Attr] = {n.OPERATION: n.CHAT if st.endpoint == "chat" else n.TEXT, n.PROVIDER: PROVIDER}
    if facts.model:
        attrs[n.REQUEST_MODEL] = facts.model
    attrs.update(_server(facts.base_url))
    if error is not None:
        attrs[n.ERROR_TYPE] = error
    attrs["streamchaos.phase"] = st.phase
    if faults:
        attrs["streamchaos.fault"] = ",".join(faults)
    attrs["streamchaos.experiment"] = facts.experiment
    attrs["streamchaos.run_id"] = facts.run_id
    return attrs


def _usage(st: StreamRecord) -> tuple[int | None, int | None]:
    usage = st.usage or {}

    def count(key: str) -> int | None:
        value = usage.get(key)
        return value if type(value) is int and value >= 0 else None

    return count("prompt_tokens"), count("completion_tokens")


def plan_points(obs: Observations, facts: RunFacts) -> list[Point]:
    """The metrics' measurements: per stream its duration, time to first chunk, each later chunk's gap and
    its token usage (input and output, where its usage says)."""
    n, rule, touched = _names(), obs.end_rule, _fault_names(obs)
    out: list[Point] = []
    for st in obs.streams:
        end = _stream_end(st)
        attrs = _common(n, facts, st, touched.get(st.id, []), _error_type(st, st.is_complete(rule)))
        if st.t_sent is not None and end is not None:
            out.append(Point(n.DURATION, max(0, end - st.t_sent) / NS, attrs))
        if st.ttft_ns is not None:
            out.append(Point(n.TTFC_METRIC, st.ttft_ns / NS, attrs))
        out.extend(Point(n.TPOC, gap / NS, attrs) for gap in st.gaps_ns)
        for kind, count in zip((n.INPUT, n.OUTPUT), _usage(st), strict=True):
            if count is not None:
                out.append(Point(n.TOKENS, count, {**attrs, n.TOKEN_TYPE: kind}))
    return out


def plan_spans(obs: Observations, facts: RunFacts) -> list[SpanPlan]:
    """The run's trace: run, phases, faults, streams (see the module docstring)."""
    n, rule = _names(), obs.end_rule
    wall0 = int(obs.wall_t0 * NS) - obs.t0

    def epoch(t: int) -> int:
        return wall0 + t

    run_start, run_end = int(facts.started * NS), int(facts.ended * NS)
    root = span_id_of(f"run:{facts.run_id}")
    ours = {"streamchaos.experiment": facts.experiment, "streamchaos.run_id": facts.run_id}
    spans = [SpanPlan(f"streamchaos run {facts.experiment}", root, None, False, run_start, max(run_start, run_end),
                      {**ours, "streamchaos.status": facts.status, "streamchaos.exit_code": facts.exit_code},
                      error=(facts.error or facts.status) if facts.status not in ("completed", "") else None)]
    phase_ids: dict[str, str] = {}
    for p in sorted(obs.phases, key=lambda p: p.t_start):
        phase_ids[p.name] = sid = span_id_of(f"run:{facts.run_id}:phase:{p.name}")
        end = epoch(p.t_end) if p.t_end is not None else run_end
        attrs: dict[str, Attr] = {**ours, "streamchaos.phase": p.name}
        if p.stopped_by:
            attrs["streamchaos.phase.stopped_by"] = p.stopped_by
        spans.append(SpanPlan(f"phase {p.name}", sid, root, False, epoch(p.t_start), max(epoch(p.t_start), end), attrs))
    spans.extend(_fault_spans(obs, facts, phase_ids, root, epoch, run_end))
    touched = _fault_names(obs)
    in_force = {w.fault: w for w in obs.fault_spans()}
    for st in obs.streams:
        spans.append(_stream_span(n, st, facts, touched.get(st.id, []), in_force, phase_ids.get(st.phase, root),
                                  epoch, st.is_complete(rule)))
    return spans


def _fault_spans(obs: Observations, facts: RunFacts, phase_ids: dict[str, str], root: str, epoch: Any,
                 run_end: int) -> Iterator[SpanPlan]:
    """One span per fault: its inject to its revert, as report.json's injected_at / reverted_at read them."""
    events: dict[str, list[FaultEvent]] = {}
    for event in sorted(obs.faults, key=lambda e: e.t):
        events.setdefault(event.fault, []).append(event)
    for name, seq in events.items():
        inject = next((e for e in seq if e.action == "inject"), None)
        end = next((e for e in seq if e.action in ("revert", "rollback")), None)
        errors = [e.message for e in seq if e.action == "error" and e.message]
        first = inject or seq[0]
        start = epoch(first.t)
        stop = epoch(end.t) if end is not None else (epoch(seq[-1].t) if errors else run_end)
        attrs: dict[str, Attr] = {"streamchaos.fault.name": name, "streamchaos.fault.kind": first.kind,
                                  "streamchaos.phase": first.phase, "streamchaos.experiment": facts.experiment,
                                  "streamchaos.run_id": facts.run_id}
        params = facts.fault_params.get(name)
        if params is not None:
            attrs["streamchaos.fault.params"] = json.dumps(params, sort_keys=True, default=str)
        if inject is None:
            attrs["streamchaos.fault.injected"] = False
        yield SpanPlan(f"fault {name}", span_id_of(f"run:{facts.run_id}:fault:{name}"),
                       phase_ids.get(first.phase, root), False, start, max(start, stop), attrs,
                       error="; ".join(errors)[:500] if errors else None)


def _stream_span(n: Any, st: StreamRecord, facts: RunFacts, faults: list[str], in_force: Mapping[str, Any],
                 parent: str, epoch: Any, complete: bool) -> SpanPlan:
    error = _error_type(st, complete)
    wire = facts.request_ids.wire(st.id)
    attrs = {**_common(n, facts, st, faults, error), **_stream_attributes(n, st, wire)}
    sent = st.t_sent if st.t_sent is not None else (st.t_scheduled if st.t_scheduled is not None else st.t_end)
    start = epoch(sent) if sent is not None else int(facts.started * NS)
    end_t = _stream_end(st)
    end = max(start, epoch(end_t)) if end_t is not None else start
    events: list[EventPlan] = []
    if st.t_first_token is not None:
        events.append(EventPlan(FIRST_TOKEN_EVENT, epoch(st.t_first_token)))
    for name in faults:
        w = in_force.get(name)
        at = max(start, epoch(w.start)) if w is not None else start  # in force already when sent: at the send
        events.append(EventPlan(FAULT_EVENT, at, {"streamchaos.fault.name": name}))
    message = None
    if error is not None:
        message = (st.error.message if st.error is not None else st.in_band_error or error)[:500]
    return SpanPlan(f"{attrs[n.OPERATION]} {facts.model or 'unknown'}", span_id_of(wire), parent, True, start, end,
                    attrs, tuple(sorted(events, key=lambda e: e.t_ns)), message)


def _stream_attributes(n: Any, st: StreamRecord, wire: str) -> dict[str, Attr]:
    """A stream span's own attributes: its ids, what it asked, how it ended."""
    attrs: dict[str, Attr] = {"streamchaos.request_id": wire, "streamchaos.record_id": st.id, n.STREAM: True,
                              "streamchaos.content_events": len(st.t_content)}
    if st.max_tokens:
        attrs[n.MAX_TOKENS] = st.max_tokens
    if st.finish_reason:
        attrs[n.FINISH] = (st.finish_reason,)
    prompt_tokens, output_tokens = _usage(st)
    if prompt_tokens is not None:
        attrs[n.INPUT_TOKENS] = prompt_tokens
    if output_tokens is not None:
        attrs[n.OUTPUT_TOKENS] = output_tokens
    if st.status is not None:
        attrs[n.STATUS] = st.status
    if st.ttft_ns is not None:
        attrs[n.TTFC] = st.ttft_ns / NS
    if st.hangup is not None:
        attrs["streamchaos.hangup"] = st.hangup.reason
    if st.background:
        attrs["streamchaos.background"] = True
    return attrs


# ---- the facts, from a live run or a run directory ---------------------------------------------

def _request_ids(obs: Observations, seed: int | None, run_id: str) -> RequestIds:
    """How the load named its requests: the ``request_ids`` note, else UUID-shaped under the run's tag."""
    for note in obs.notes:
        if note.topic == "request_ids":
            try:
                return RequestIds(str(note.data.get("format", "uuid")), int(str(note.data.get("run_tag")), 16))
            except ValueError:
                break
    return RequestIds("uuid", run_tag(seed or 0, run_id))


def _run_id(run_dir: Path) -> str:
    journal = run_dir / "journal.jsonl"
    for body in iter_journal(journal):
        if body.get("type") == "run":
            return str(body.get("run_id", ""))
    return ""


def facts_from_result(result: Result, run_id: str) -> RunFacts:
    exp, target = result.experiment, result.target
    params = {f.name: dict(f.params) for p in exp.phases for f in p.faults}
    return RunFacts(run_id=run_id, experiment=exp.name, status=result.status, exit_code=result.exit_code,
                    model=exp.load.model or (target.model if target is not None else ""),
                    base_url=target.base_url if target is not None else "", started=result.started,
                    ended=result.ended, request_ids=_request_ids(result.observations, exp.seed, run_id),
                    fault_params=params, error=result.error)


def facts_from_run_dir(run_dir: Path, obs: Observations) -> RunFacts:
    """A finished run's facts from its directory (report.json, the journal's run id)."""
    report = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    run_id = _run_id(run_dir)
    target = report.get("target") or {}
    params = {str(f.get("name")): f["params"] for f in report.get("faults", []) if isinstance(f.get("params"), dict)}
    return RunFacts(run_id=run_id, experiment=str(report.get("experiment", obs.experiment)),
                    status=str(report.get("status", "")), exit_code=int(report.get("exit_code", 0)),
                    model=str(target.get("model") or ""), base_url=str(target.get("base_url") or ""),
                    started=float(report.get("start", obs.wall_t0)), ended=float(report.get("end", obs.wall_t0)),
                    request_ids=_request_ids(obs, report.get("seed"), run_id), fault_params=params,
                    error=report.get("error"))


# ---- the edge: SDK objects, the OTLP/HTTP exporters --------------------------------------------

@dataclass
class ExportOutcome:
    spans: int = 0
    points: int = 0
    endpoints: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "spans": self.spans, "points": self.points, "endpoints": self.endpoints,
                "errors": self.errors}


def _resource() -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.semconv.attributes.service_attributes import SERVICE_NAME

    resource = Resource.create()  # OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE}))
    return resource


def _scope() -> Any:
    from importlib.metadata import PackageNotFoundError, version

    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.semconv.schemas import Schemas

    try:
        ours = version("streamchaos")
    except PackageNotFoundError:
        ours = None
    return InstrumentationScope(SCOPE, ours, schema_url=list(Schemas)[-1].value)


def to_readable(plans: Sequence[SpanPlan], trace_id: str, resource: Any) -> list[Any]:
    """The plans as SDK ``ReadableSpan``s of trace ``trace_id``, their ids and times as planned."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

    tid, scope, sampled = int(trace_id, 16), _scope(), TraceFlags(TraceFlags.SAMPLED)

    def ctx(span_id: str) -> SpanContext:
        return SpanContext(tid, int(span_id, 16), is_remote=False, trace_flags=sampled)

    out = []
    for p in plans:
        out.append(ReadableSpan(
            name=p.name, context=ctx(p.span_id), parent=ctx(p.parent_id) if p.parent_id else None, resource=resource,
            attributes=dict(p.attributes), events=[Event(e.name, dict(e.attributes), e.t_ns) for e in p.events],
            kind=SpanKind.CLIENT if p.client else SpanKind.INTERNAL, instrumentation_scope=scope,
            status=Status(StatusCode.ERROR, p.error) if p.error is not None else Status(StatusCode.UNSET),
            start_time=p.start_ns, end_time=p.end_ns))
    return out


def metrics_data(points: Sequence[Point], resource: Any) -> Any:
    """The points recorded into the conventions' histograms (their bucket advice as Views); the ``MetricsData``."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    gm = _names().metrics
    views = [View(instrument_name=name, aggregation=ExplicitBucketHistogramAggregation(buckets))
             for name, buckets in ((gm.GEN_AI_CLIENT_OPERATION_DURATION, DURATION_BUCKETS),
                                   (gm.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK, DURATION_BUCKETS),
                                   (gm.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK, DURATION_BUCKETS),
                                   (gm.GEN_AI_CLIENT_TOKEN_USAGE, TOKEN_BUCKETS))]
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], resource=resource, views=views)
    try:
        scope = _scope()
        meter = provider.get_meter(scope.name, scope.version, schema_url=scope.schema_url)
        instruments = {gm.GEN_AI_CLIENT_OPERATION_DURATION: gm.create_gen_ai_client_operation_duration(meter),
                       gm.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK:
                           gm.create_gen_ai_client_operation_time_to_first_chunk(meter),
                       gm.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK:
                           gm.create_gen_ai_client_operation_time_per_output_chunk(meter),
                       gm.GEN_AI_CLIENT_TOKEN_USAGE: gm.create_gen_ai_client_token_usage(meter)}
        for point in points:
            instruments[point.metric].record(point.value, dict(point.attributes))
        return reader.get_metrics_data()
    finally:
        provider.shutdown()


class _Captured(logging.Handler):
    """The SDK exporters' own log lines during one export: kept for the one message we print."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def export(spans: Sequence[SpanPlan], points: Sequence[Point], trace_id: str, *, span_exporter: Any = None,
           metric_exporter: Any = None) -> ExportOutcome:
    """Send the spans and the metrics over OTLP/HTTP (exporters made from ``OTEL_EXPORTER_OTLP_*`` unless
    given); never raises for an export that failed: the outcome says what did."""
    require_otel()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics.export import MetricExportResult
    from opentelemetry.sdk.trace.export import SpanExportResult

    outcome = ExportOutcome()
    sdk_log = logging.getLogger("opentelemetry.exporter")
    captured, propagate = _Captured(), sdk_log.propagate
    sdk_log.addHandler(captured)
    sdk_log.propagate = False  # its retries and errors are summed up in one line of ours
    try:
        resource = _resource()
        span_exporter = span_exporter or OTLPSpanExporter()
        metric_exporter = metric_exporter or OTLPMetricExporter()
        outcome.endpoints = {"traces": str(getattr(span_exporter, "_endpoint", "")),
                             "metrics": str(getattr(metric_exporter, "_endpoint", ""))}
        readable = to_readable(spans, trace_id, resource)
        # one deadline for all the span batches (each batch alone may take the exporter's whole timeout)
        budget_s = _timeout_s("TRACES")
        started = time.monotonic()
        for i in range(0, len(readable), SPAN_BATCH):
            if i and time.monotonic() - started > budget_s:
                outcome.errors.append(f"spans: stopped after {outcome.spans} of {len(readable)}: the export took "
                                      f"longer than {budget_s:g}s (OTEL_EXPORTER_OTLP_TIMEOUT)")
                break
            if span_exporter.export(readable[i:i + SPAN_BATCH]) is not SpanExportResult.SUCCESS:
                outcome.errors.append(_failure("spans", outcome.endpoints["traces"], captured.lines))
                break
            outcome.spans += len(readable[i:i + SPAN_BATCH])
        data = metrics_data(points, resource)
        if metric_exporter.export(data) is MetricExportResult.SUCCESS:
            outcome.points = len(points)
        else:
            outcome.errors.append(_failure("metrics", outcome.endpoints["metrics"], captured.lines))
        span_exporter.shutdown()
        metric_exporter.shutdown()
    except Exception as exc:  # noqa: BLE001 - an exporter's own bug must not cost the run its exit code
        outcome.errors.append(f"OTLP export failed: {type(exc).__name__}: {exc}"[:500])
    finally:
        sdk_log.removeHandler(captured)
        sdk_log.propagate = propagate
    return outcome


def _failure(what: str, endpoint: str, lines: list[str]) -> str:
    why = lines[-1] if lines else "the exporter gave up"
    return f"OTLP export of {what} to {endpoint or '?'} failed: {why}"[:500]


def _record(outcome: ExportOutcome, run_dir: Path | None, trace_id: str) -> None:
    """Print a failure once (stderr) and write the outcome to the run directory's ``otlp.json``."""
    if outcome.errors:
        print(f"streamchaos: {outcome.errors[0]} (the run's exit code is unchanged)", file=sys.stderr, flush=True)
    if run_dir is None or not run_dir.is_dir():
        return
    try:
        (run_dir / OTLP_FILE).write_text(json.dumps({**outcome.as_dict(), "trace_id": trace_id}, indent=2) + "\n",
                                         encoding="utf-8")
    except OSError as exc:
        print(f"streamchaos: cannot write {run_dir / OTLP_FILE}: {exc.strerror}", file=sys.stderr)


def export_run_dir(run_dir: Path) -> ExportOutcome:
    """``report RUN_DIR --otlp``: a finished run exported again (the same trace and span ids as at its end)."""
    require_otel("report --otlp")
    obs = Observations.load(run_dir / "journal.jsonl")
    facts = facts_from_run_dir(run_dir, obs)
    outcome = export(plan_spans(obs, facts), plan_points(obs, facts), facts.trace_id)
    _record(outcome, run_dir, facts.trace_id)
    return outcome


class OtlpExporter:
    """Run listener: on ``RunFinished``, the run's streams as metrics and spans over OTLP/HTTP.

    Made before the run, so a missing extra is a usage error (exit 2) before anything starts. The
    run must send ``traceparent`` for the target's spans to join the trace (``Runner(traceparent=True)``;
    ``chaos.run(..., otlp=True)`` does both)."""

    def __init__(self, *, span_exporter: Any = None, metric_exporter: Any = None) -> None:
        require_otel()
        self._span_exporter, self._metric_exporter = span_exporter, metric_exporter
        self.outcome: ExportOutcome | None = None

    def on_event(self, event: RunEvent) -> None:
        if not isinstance(event, RunFinished):
            return
        result = event.result
        trace_id = ""
        try:
            facts = facts_from_result(result, _run_id(result.out_dir))
            trace_id = facts.trace_id
            obs = result.observations
            self.outcome = export(plan_spans(obs, facts), plan_points(obs, facts), trace_id,
                                  span_exporter=self._span_exporter, metric_exporter=self._metric_exporter)
        except Exception as exc:  # noqa: BLE001 - a listener that raises would fail the run
            self.outcome = ExportOutcome(errors=[f"OTLP export failed: {type(exc).__name__}: {exc}"[:500]])
        _record(self.outcome, result.out_dir, trace_id)
