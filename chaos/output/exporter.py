"""The run's own QoS figures as Prometheus metrics, live: a run listener over prometheus-client.

Metrics live in a private ``CollectorRegistry`` (never the process-wide default: two runs in one
process, or the builtin stack in-process, must not collide). They are served on a loopback
``/metrics`` endpoint for the life of the run (``--metrics-port``; 0 picks a free port) and/or
pushed to a Pushgateway (``--push-metrics URL``): every ``push_interval_s`` from a thread of its
own, and once more when the run finishes, so the verdicts reach it. Exporting never stops a run:
a failed push is reported on stderr and kept in ``push_errors``.

Metric names (``manifests/grafana-dashboard.json`` reads them; a test checks it names no other):
``METRICS`` below. Every series carries ``experiment``; stream series carry ``phase``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from chaos.execution.events import RunEvent, RunFinished, RunStarted, VerdictsReady
from chaos.model.errors import UsageError
from chaos.model.observations import (
    END_RULE_TOPIC,
    NS,
    STRICT_END,
    EndRule,
    FaultEvent,
    Note,
    PhaseWindow,
    StreamRecord,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["CAPACITY_METRICS", "METRICS", "PrometheusExporter"]

# Buckets in seconds: TTFT and gaps as vLLM's (chaos.stack.metrics), lifetimes to 10 minutes.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0)
GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
LIFETIME_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)

# name (as exposed, without _total/_bucket suffixes) → what it is
METRICS = {
    "streamchaos_ttft_seconds": "time from request sent to first content, per stream (histogram)",
    "streamchaos_token_gap_seconds": "gaps between consecutive content events (histogram)",
    "streamchaos_stream_lifetime_seconds": "from request sent to the stream's end (histogram)",
    "streamchaos_streams": "finished streams by outcome: complete, early_close, error, hung_up (counter)",
    "streamchaos_stream_errors": "failed streams by error kind (counter)",
    "streamchaos_early_closes": "streams that ended without finish_reason and [DONE], not hung up on purpose (counter)",
    "streamchaos_content_events": "content events received (counter)",
    "streamchaos_active_faults": "faults in force now (gauge)",
    "streamchaos_fault_active": "1 while this fault is in force (gauge)",
    "streamchaos_phase_active": "1 while this phase runs (gauge)",
    "streamchaos_verdict": "1 for the status each SLA verdict reached, at the end of the run (gauge)",
    "streamchaos_verdict_ok": "1 when the verdict is what the experiment expected (gauge)",
    "streamchaos_verdict_figure": "the verdict's figure, in the unit label's unit (gauge)",
    "streamchaos_run_exit_code": "the run's exit code once it finished (gauge)",
}

# `streamchaos capacity` (chaos.capacity): each case's interval, updated after every probe; every
# series carries ``experiment`` and ``case``, the levels ``unit`` (streams or requests/s).
CAPACITY_METRICS = {
    "streamchaos_capacity_passing": "a case's highest level that met every SLA so far, in the unit label's unit "
                                    "(gauge)",
    "streamchaos_capacity_failing": "a case's lowest level that did not meet them so far (gauge)",
    "streamchaos_capacity_lost_ratio": "the share of the baseline's capacity a fault case lost: point, at_least, "
                                       "at_most (gauge)",
    "streamchaos_capacity_resolved": "1 once a case's interval is as narrow as asked, or pinned at a bound (gauge)",
    "streamchaos_capacity_probes": "a case's probes so far, by outcome (gauge)",
    "streamchaos_capacity_exit_code": "the capacity search's exit code once it finished (gauge)",
}
PROBE_OUTCOMES = ("pass", "fail", "inconclusive", "error")


class PrometheusExporter:
    """Run listener: updates the metrics from run events; serves and/or pushes them.

    Use as a context manager (or call ``close``) so the endpoint and push thread never outlive it.
    Raises ``UsageError`` when the port cannot be bound or the push URL is not http(s).
    """

    def __init__(self, *, port: int | None = None, push_url: str | None = None, host: str = "127.0.0.1",
                 push_interval_s: float = 10.0, job: str = "streamchaos") -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        push_auth: tuple[str, str] | None = None
        if push_url is not None:
            push_url, push_auth = _push_target(push_url)
        self.registry: CollectorRegistry = CollectorRegistry(auto_describe=True)
        r, stream_labels = self.registry, ("experiment", "phase")
        self.ttft = Histogram("streamchaos_ttft_seconds", METRICS["streamchaos_ttft_seconds"], stream_labels,
                              buckets=TTFT_BUCKETS, registry=r)
        self.gap = Histogram("streamchaos_token_gap_seconds", METRICS["streamchaos_token_gap_seconds"], stream_labels,
                             buckets=GAP_BUCKETS, registry=r)
        self.lifetime = Histogram("streamchaos_stream_lifetime_seconds", METRICS["streamchaos_stream_lifetime_seconds"],
                                  stream_labels,
                                  buckets=LIFETIME_BUCKETS, registry=r)
        self.streams = Counter("streamchaos_streams", METRICS["streamchaos_streams"], (*stream_labels, "outcome"),
                               registry=r)
        self.errors = Counter("streamchaos_stream_errors", METRICS["streamchaos_stream_errors"],
                              (*stream_labels, "kind"), registry=r)
        self.early = Counter("streamchaos_early_closes", METRICS["streamchaos_early_closes"], stream_labels, registry=r)
        self.content = Counter("streamchaos_content_events", METRICS["streamchaos_content_events"], stream_labels,
                               registry=r)
        self.active = Gauge("streamchaos_active_faults", METRICS["streamchaos_active_faults"], ("experiment",),
                            registry=r)
        self.fault = Gauge("streamchaos_fault_active", METRICS["streamchaos_fault_active"],
                           ("experiment", "fault", "kind"), registry=r)
        self.phase = Gauge("streamchaos_phase_active", METRICS["streamchaos_phase_active"], stream_labels, registry=r)
        verdict_labels = ("experiment", "sla", "phase")
        self.verdict = Gauge("streamchaos_verdict", METRICS["streamchaos_verdict"], (*verdict_labels, "status"),
                             registry=r)
        self.verdict_ok = Gauge("streamchaos_verdict_ok", METRICS["streamchaos_verdict_ok"], verdict_labels, registry=r)
        self.verdict_figure = Gauge("streamchaos_verdict_figure", METRICS["streamchaos_verdict_figure"],
                                    (*verdict_labels, "unit"), registry=r)
        self.exit_code = Gauge("streamchaos_run_exit_code", METRICS["streamchaos_run_exit_code"], ("experiment",),
                               registry=r)
        self._capacity: dict[str, Gauge] = {}  # made by the first capacity figures: a run exports none
        self.experiment = ""
        self.end_rule: EndRule = STRICT_END
        self.push_url, self.job, self.push_interval_s = push_url, job, push_interval_s  # push_url: no userinfo
        self._push_auth = push_auth
        self.push_errors: list[str] = []
        self._in_force: set[str] = set()
        self._stop = threading.Event()
        self._pusher: threading.Thread | None = None
        self._server: Any = None
        self._server_thread: threading.Thread | None = None
        self.port: int | None = None
        if port is not None:
            self._serve(host, port)

    # -- serving and pushing -----------------------------------------------------------------
    def _serve(self, host: str, port: int) -> None:
        from chaos.host.metrics_http import (
            serve_metrics,  # timeouts and a connection cap (start_http_server has neither)
        )

        try:
            self._server, self._server_thread = serve_metrics(self.registry, host, port)
        except OSError as exc:
            raise UsageError(f"--metrics-port {port}: cannot listen on {host}:{port} ({exc.strerror})") from None
        self.port = int(self._server.server_port)

    @property
    def url(self) -> str | None:
        """The ``/metrics`` URL while it is served."""
        return None if self.port is None else f"http://127.0.0.1:{self.port}/metrics"

    def push(self) -> bool:
        """Push every metric now (replacing this job's group); False, with the error kept, when it failed."""
        if self.push_url is None:
            return False
        from prometheus_client import push_to_gateway

        try:
            push_to_gateway(self.push_url, job=self.job, registry=self.registry,
                            grouping_key={"experiment": self.experiment or "unknown"}, timeout=5.0,
                            handler=_direct_handler(self._push_auth))
            return True
        except Exception as exc:  # noqa: BLE001 - a Pushgateway that is down must not stop the run
            message = f"push to {self.push_url} failed: {exc}"
            self.push_errors.append(message)
            print(f"streamchaos: metrics {message}", file=sys.stderr)
            return False

    def _push_loop(self) -> None:
        while not self._stop.wait(self.push_interval_s):
            self.push()

    def close(self) -> None:
        """Stop pushing and serving; idempotent."""
        self._stop.set()
        if self._pusher is not None:
            self._pusher.join(timeout=10.0)
            self._pusher = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
            self.port = None

    def __enter__(self) -> PrometheusExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- a capacity search ---------------------------------------------------------------------
    def capacity(self, body: dict[str, Any], *, final: bool = False) -> None:
        """Set the capacity figures from a capacity.json body (``chaos.capacity.run.as_dict``), then
        push them: after every probe, and once ``final`` with the search's exit code."""
        from prometheus_client import Gauge

        if not self._capacity:
            labels = {"streamchaos_capacity_passing": ("experiment", "case", "unit"),
                      "streamchaos_capacity_failing": ("experiment", "case", "unit"),
                      "streamchaos_capacity_lost_ratio": ("experiment", "case", "bound"),
                      "streamchaos_capacity_resolved": ("experiment", "case"),
                      "streamchaos_capacity_probes": ("experiment", "case", "outcome"),
                      "streamchaos_capacity_exit_code": ("experiment",)}
            self._capacity = {name: Gauge(name, CAPACITY_METRICS[name], labels[name], registry=self.registry)
                              for name in CAPACITY_METRICS}
        g, name, unit = self._capacity, str(body.get("experiment", "")), str(body.get("unit", ""))
        self.experiment = name
        for case in body.get("cases", []):
            who = (name, str(case["case"]))
            for end in ("passing", "failing"):
                level = case["capacity"][end]  # None: open at that end (nothing passed, or nothing failed)
                g[f"streamchaos_capacity_{end}"].labels(*who, unit).set(float("nan") if level is None else level)
            for bound, share in (case.get("lost") or {}).items():
                g["streamchaos_capacity_lost_ratio"].labels(*who, bound).set(float("nan") if share is None else share)
            g["streamchaos_capacity_resolved"].labels(*who).set(1 if case.get("resolved") else 0)
            outcomes = [p["outcome"] for p in case.get("probes", [])]
            for outcome in PROBE_OUTCOMES:
                g["streamchaos_capacity_probes"].labels(*who, outcome).set(outcomes.count(outcome))
        if final:
            g["streamchaos_capacity_exit_code"].labels(name).set(int(body["exit_code"]))
        self.push()

    # -- the listener ------------------------------------------------------------------------
    def on_event(self, event: RunEvent) -> None:
        if isinstance(event, StreamRecord):
            self._stream(event)
        elif isinstance(event, FaultEvent):
            self._fault(event)
        elif isinstance(event, Note) and event.topic == END_RULE_TOPIC and isinstance(event.data.get("end"), dict):
            self.end_rule = EndRule.from_dict(event.data["end"])  # the engine's end-of-stream rule
        elif isinstance(event, PhaseWindow):
            self.phase.labels(self.experiment, event.name).set(1 if event.t_end is None else 0)
        elif isinstance(event, RunStarted):
            self.experiment = event.experiment
            self.active.labels(self.experiment).set(0)
            if self.push_url is not None and self._pusher is None:
                self._pusher = threading.Thread(target=self._push_loop, name="streamchaos-push", daemon=True)
                self._pusher.start()
        elif isinstance(event, VerdictsReady):
            self._verdicts(event.verdicts)
        elif isinstance(event, RunFinished):
            self.exit_code.labels(self.experiment).set(event.result.exit_code)
            self._stop.set()
            if self._pusher is not None:
                self._pusher.join(timeout=10.0)
                self._pusher = None
            self.push()  # the final figures and the verdicts

    def _stream(self, st: StreamRecord) -> None:
        if st.background:
            return
        labels = (self.experiment, st.phase)
        self._timings(st, labels)
        kinds = _error_kinds(st)
        self.streams.labels(*labels, self._outcome(st, kinds)).inc()
        for kind in kinds:
            self.errors.labels(*labels, kind).inc()
        if st.hangup is None and not st.is_complete(self.end_rule):
            self.early.labels(*labels).inc()  # as `early_close` counts: errors included, hang-ups not

    def _timings(self, st: StreamRecord, labels: tuple[str, str]) -> None:
        """The stream's time to first token, its gaps, its content count and its lifetime."""
        if st.ttft_ns is not None:
            self.ttft.labels(*labels).observe(st.ttft_ns / NS)
        gap = self.gap.labels(*labels)
        for g in st.gaps_ns:
            gap.observe(g / NS)
        if st.t_content:
            self.content.labels(*labels).inc(len(st.t_content))
        end = st.t_end if st.t_end is not None else (st.hangup.t if st.hangup else None)
        if st.t_sent is not None and end is not None:
            self.lifetime.labels(*labels).observe(max(0, end - st.t_sent) / NS)

    def _outcome(self, st: StreamRecord, kinds: list[str]) -> str:
        if st.hangup is not None:
            return "hung_up"
        if kinds:
            return "error"
        if st.is_complete(self.end_rule):
            return "complete"
        return "early_close"

    def _fault(self, event: FaultEvent) -> None:
        if event.action == "inject":
            self._in_force.add(event.fault)
            self.fault.labels(self.experiment, event.fault, event.kind).set(1)
        elif event.action in ("revert", "rollback", "error"):
            self._in_force.discard(event.fault)
            self.fault.labels(self.experiment, event.fault, event.kind).set(0)
        self.active.labels(self.experiment).set(len(self._in_force))

    def _verdicts(self, verdicts: Sequence[Any]) -> None:
        for v in verdicts:
            labels = (self.experiment, v.name or v.sla, v.phase or "run")
            for status in ("pass", "fail", "inconclusive", "unobservable"):
                self.verdict.labels(*labels, status).set(1 if v.status == status else 0)
            self.verdict_ok.labels(*labels).set(1 if v.ok else 0)
            if v.figure is not None:
                self.verdict_figure.labels(*labels, v.unit).set(v.figure)


def _error_kinds(st: StreamRecord) -> list[str]:
    """How a stream failed, in the `errors` verifier's words (http, a transport error kind, in_band)."""
    from sla.stream_errors import error_kinds

    return error_kinds(st)


def _push_target(url: str) -> tuple[str, tuple[str, str] | None]:
    """The ``--push-metrics`` URL without its userinfo, and the userinfo as (user, password).

    The credentials then go only in an ``Authorization: Basic`` header to the Pushgateway itself: a
    URL's ``user:password@`` is written into the request line an HTTP proxy reads, and into every
    message that quotes the URL. ``UsageError`` for a URL that is not http(s) or has a bad port."""
    from urllib.parse import unquote, urlsplit, urlunsplit

    if not url.startswith(("http://", "https://")):
        shown = url.rsplit("@", 1)[-1] if "@" in url else url
        raise UsageError(f"--push-metrics {shown}: expected an http:// or https:// Pushgateway URL")
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise UsageError(f"--push-metrics: the URL's port is not a port number ({parts.hostname})") from None
    if parts.username is None and parts.password is None:
        return url, None
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname or ""
    netloc = host if port is None else f"{host}:{port}"
    auth = (unquote(parts.username or ""), unquote(parts.password or ""))
    return urlunsplit(parts._replace(netloc=netloc)), auth


def _direct_handler(auth: tuple[str, str] | None) -> Any:
    """prometheus-client's push handler, over httpx straight to the Pushgateway.

    ``trust_env=False``, as every other HTTP client of ours: an ``HTTP(S)_PROXY`` set for downloads
    must not carry the push (nor, over plain http, read its Basic credentials in clear), and the
    same TLS trust as the rest of the run. Redirects are not followed, so the credentials reach the
    URL's own host and no other."""

    def handler(url: str, method: str, timeout: float | None, headers: Sequence[tuple[str, str]],
                data: bytes) -> Any:
        def handle() -> None:
            import httpx

            from chaos.host.tls import tls_context

            response = httpx.request(method, url, content=data, headers=list(headers), auth=auth, timeout=timeout,
                                     trust_env=False, verify=tls_context(), follow_redirects=False)
            if response.status_code >= 300:
                raise OSError(f"the Pushgateway answered {response.status_code} {response.reason_phrase}")

        return handle

    return handler
