"""The Prometheus exporter: run events → metrics on a loopback /metrics (parsed with
prometheus-client's own parser) and pushed to a Pushgateway (a local HTTP server recording pushes);
the Grafana dashboard reads only metrics it exports."""

from __future__ import annotations

import http.server
import json
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chaos.execution.events import RunFinished, RunStarted, VerdictsReady
from chaos.model.errors import UsageError
from chaos.model.observations import ErrorInfo, FaultEvent, Hangup, PhaseWindow, StreamRecord
from chaos.output.exporter import METRICS, PrometheusExporter
from sla.base import Verdict

pytestmark = pytest.mark.timeout(60)

DASHBOARD = Path(__file__).resolve().parents[2] / "manifests" / "grafana-dashboard.json"
MS = 1_000_000


def stream(i: int, *, ttft_ms: int = 40, gaps: int = 5, error: bool = False, hangup: bool = False,
           cut: bool = False) -> StreamRecord:
    t = 10_000 * MS * i
    content = [t + ttft_ms * MS + k * 10 * MS for k in range(gaps + 1)]
    st = StreamRecord(id=f"0-{i}", phase="steady", t_sent=t, t_first_content=content[0], t_content=content,
                      t_end=content[-1] + MS, status=200, finish_reason="stop", done_seen=True)
    if error:
        st.error, st.finish_reason, st.done_seen = ErrorInfo("read", "reset"), None, False
    if hangup:  # the client left mid-stream: no finish_reason, no [DONE]
        st.hangup = Hangup("client.disconnect", "after_tokens", content[2])
        st.finish_reason, st.done_seen = None, False
    if cut:
        st.done_seen = False
    return st


def feed(exporter: PrometheusExporter) -> None:
    exporter.on_event(RunStarted("probe", "/tmp/x", 0, 0.0, (("steady", 4.0),)))
    exporter.on_event(PhaseWindow("steady", 0))
    exporter.on_event(FaultEvent("slow", "network.latency", "inject", 1, "steady"))
    for i in range(10):
        exporter.on_event(stream(i))
    exporter.on_event(stream(10, error=True))
    exporter.on_event(stream(11, hangup=True))
    exporter.on_event(stream(12, cut=True))


def parse(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """sample name → {sorted labels: value}."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def value(samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str, **labels: str) -> float:
    return sum(v for key, v in samples.get(name, {}).items() if all((k, labels[k]) in key for k in labels))


def test_the_endpoint_serves_the_runs_figures_while_it_runs() -> None:
    with PrometheusExporter(port=0) as exporter:
        feed(exporter)
        assert exporter.url is not None
        samples = parse(httpx.get(exporter.url, timeout=5).text)
        assert value(samples, "streamchaos_ttft_seconds_count", phase="steady") == 13
        assert value(samples, "streamchaos_ttft_seconds_bucket", le="0.04") == 13  # every TTFT was 40 ms
        assert value(samples, "streamchaos_token_gap_seconds_count") == 13 * 5
        assert value(samples, "streamchaos_stream_lifetime_seconds_count") == 13
        assert value(samples, "streamchaos_streams_total", outcome="complete") == 10
        assert value(samples, "streamchaos_streams_total", outcome="error") == 1
        assert value(samples, "streamchaos_streams_total", outcome="hung_up") == 1
        assert value(samples, "streamchaos_streams_total", outcome="early_close") == 1
        assert value(samples, "streamchaos_early_closes_total") == 2  # the error and the cut; not the hang-up
        assert value(samples, "streamchaos_stream_errors_total", kind="read") == 1
        assert value(samples, "streamchaos_content_events_total") == 13 * 6
        assert value(samples, "streamchaos_active_faults", experiment="probe") == 1
        assert value(samples, "streamchaos_fault_active", fault="slow") == 1
        exporter.on_event(FaultEvent("slow", "network.latency", "revert", 2, "steady"))
        exporter.on_event(VerdictsReady((Verdict("ttft", None, "fail", 0.3, 0.2, "s", 13, {}),)))
        samples = parse(httpx.get(exporter.url, timeout=5).text)
        assert value(samples, "streamchaos_active_faults") == 0
        assert value(samples, "streamchaos_verdict", sla="ttft", status="fail") == 1
        assert value(samples, "streamchaos_verdict", sla="ttft", status="pass") == 0
        assert value(samples, "streamchaos_verdict_ok", sla="ttft") == 0
        assert value(samples, "streamchaos_verdict_figure", sla="ttft", unit="s") == pytest.approx(0.3)
        url = exporter.url
    with pytest.raises(httpx.TransportError):  # closed with the exporter
        httpx.get(url, timeout=2)


def test_a_busy_port_is_a_usage_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UsageError, match=f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}"):
            PrometheusExporter(port=port)
    with pytest.raises(UsageError, match="expected an http:// or https:// Pushgateway URL"):
        PrometheusExporter(push_url="gateway:9091")


class _Recorder(http.server.BaseHTTPRequestHandler):
    pushes: list[tuple[str, str, bytes]] = []

    def do_PUT(self) -> None:  # noqa: N802 - the http.server naming
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.pushes.append(("PUT", self.path, body))
        self.send_response(200)
        self.end_headers()

    do_POST = do_PUT

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[tuple[str, list[tuple[str, str, bytes]]]]:
    _Recorder.pushes = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", _Recorder.pushes
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_metrics_are_pushed_to_a_pushgateway(gateway: tuple[str, list[tuple[str, str, bytes]]]) -> None:
    url, pushes = gateway
    with PrometheusExporter(push_url=url, push_interval_s=3600) as exporter:
        feed(exporter)
        assert exporter.push()
    method, path, body = pushes[-1]
    assert method == "PUT" and path == "/metrics/job/streamchaos/experiment/probe"
    assert value(parse(body.decode()), "streamchaos_ttft_seconds_count") == 13


def test_a_pushgateway_that_is_down_does_not_stop_anything(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with PrometheusExporter(push_url=f"http://127.0.0.1:{port}") as exporter:
        feed(exporter)
        assert exporter.push() is False
    assert exporter.push_errors and "push to" in capsys.readouterr().err


def exported_names() -> set[str]:
    """Every sample name the exporter can expose (histograms: _bucket/_sum/_count; counters: _total)."""
    with PrometheusExporter() as exporter:
        feed(exporter)
        exporter.on_event(VerdictsReady((Verdict("ttft", None, "pass", 0.1, 0.2, "s", 13, {}),)))
        exporter.on_event(RunFinished(SimpleNamespace(exit_code=0)))  # type: ignore[arg-type]  # all it reads
        from prometheus_client import generate_latest

        return {s.name for family in text_string_to_metric_families(generate_latest(exporter.registry).decode())
                for s in family.samples}


def dashboard_metrics(dashboard: dict[str, Any]) -> set[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v.get("type") == "query"]
    assert exprs
    return {m for e in exprs for m in re.findall(r"\b(streamchaos_[a-z_]+)", e)}


def test_every_metric_the_dashboard_reads_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    names = exported_names()
    missing = dashboard_metrics(dashboard) - names
    assert not missing, f"the dashboard reads metrics nobody exports: {sorted(missing)}"
    assert {re.sub(r"_(bucket|sum|count|total|created)$", "", n) for n in names} >= set(METRICS)


def test_the_dashboard_check_catches_a_misnamed_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    dashboard["panels"][0]["targets"][0]["expr"] = "histogram_quantile(0.99, rate(streamchaos_ttft_ms_bucket[1m]))"
    assert dashboard_metrics(dashboard) - exported_names() == {"streamchaos_ttft_ms_bucket"}


def test_the_endpoint_holds_under_300_half_open_connections_and_still_answers() -> None:
    """``start_http_server`` gave each half-open connection a thread with no timeout; ours caps the
    connections served at once (the rest get 503 and are closed), times each one out, and a scrape
    still gets through while the 300 are held."""
    import socket
    import threading
    import time

    import httpx

    from chaos.host.metrics_http import MAX_CONNECTIONS
    from chaos.output.exporter import PrometheusExporter

    with PrometheusExporter(port=0) as exporter:
        assert exporter.port is not None
        before = threading.active_count()
        held: list[socket.socket] = []
        try:
            for _ in range(300):
                s = socket.create_connection(("127.0.0.1", exporter.port), timeout=5)
                s.sendall(b"GET /metrics HTTP/1.1\r\n")  # half a request, never finished
                held.append(s)
            time.sleep(0.5)
            assert threading.active_count() - before <= MAX_CONNECTIONS + 2
            deadline = time.monotonic() + 30
            while True:
                try:
                    r = httpx.get(exporter.url or "", timeout=5)
                    if r.status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "no scrape was answered while the half-open connections were held"
                time.sleep(0.2)
            assert "streamchaos_" in r.text
            assert threading.active_count() - before <= MAX_CONNECTIONS + 2
        finally:
            for s in held:
                s.close()


def capacity_body() -> dict[str, Any]:
    """capacity.json of a two-case search, as the search writes it (chaos.capacity.run.as_dict)."""
    from chaos.capacity.probes import Case
    from chaos.capacity.run import CapacityResult, answer, as_dict
    from chaos.experiment.loader import parse_experiment
    from chaos.model.capacity import Probe

    exp = parse_experiment("name: cap\nphases:\n  - {name: steady, duration: 2s}\n  - name: slow\n    duration: 2s\n"
                           "    faults: [{kind: server.stall, where: event_loop, duration: 50ms, every: 200ms}]\n"
                           "sla:\n  - {kind: ttft, budget: 100ms}\ncapacity: {dimension: rate, max: 32}\n")
    assert exp.capacity is not None
    base = answer(exp.capacity, Case("baseline", ()), [Probe("baseline", 8, 6, "pass"),
                                                         Probe("baseline", 8.4, 6, "fail", ("ttft",))], "resolved")
    slow = answer(exp.capacity, Case("slow", ()), [Probe("slow", 4, 6, "pass"), Probe("slow", 8, 6, "fail", ("ttft",)),
                                                   Probe("slow", 6, 6, "inconclusive", ("ttft",))], "searching")
    return as_dict(CapacityResult(exp, exp.capacity, [base, slow], Path("."), 0.0, 1.0, 900.0, False))


def test_a_capacity_search_exports_each_case_interval_after_every_probe(
        gateway: tuple[str, list[tuple[str, str, bytes]]]) -> None:
    url, pushes = gateway
    body = capacity_body()
    with PrometheusExporter(port=0, push_url=url, push_interval_s=3600) as exporter:
        exporter.capacity(body)
        assert exporter.url is not None
        samples = parse(httpx.get(exporter.url, timeout=5).text)
        assert value(samples, "streamchaos_capacity_passing", case="baseline", unit="requests/s") == 8
        assert value(samples, "streamchaos_capacity_failing", case="baseline") == 8.4
        assert value(samples, "streamchaos_capacity_passing", case="slow") == 4
        # 1 - 4 / 8: half the baseline's capacity lost; at most 1 - 4 / 8.4
        assert value(samples, "streamchaos_capacity_lost_ratio", case="slow", bound="point") == pytest.approx(0.5)
        assert value(samples, "streamchaos_capacity_lost_ratio", case="slow", bound="at_most") == pytest.approx(
            1 - 4 / 8.4)
        assert value(samples, "streamchaos_capacity_resolved", case="baseline") == 1
        assert value(samples, "streamchaos_capacity_resolved", case="slow") == 0
        assert value(samples, "streamchaos_capacity_probes", case="slow", outcome="inconclusive") == 1
        assert value(samples, "streamchaos_capacity_probes", case="slow", outcome="fail") == 1
        assert "streamchaos_capacity_exit_code" not in samples  # not before the search has ended
        exporter.capacity(body, final=True)
        samples = parse(httpx.get(exporter.url, timeout=5).text)
        assert value(samples, "streamchaos_capacity_exit_code", experiment="cap") == body["exit_code"] == 3
    assert len(pushes) == 2 and pushes[-1][1] == "/metrics/job/streamchaos/experiment/cap"
    assert value(parse(pushes[-1][2].decode()), "streamchaos_capacity_passing", case="slow") == 4
