"""``run --otlp``: a real run against the builtin stack through a stream hop, its metrics and spans received
by an OTLP/HTTP receiver of the tests' own (``otlp_receiver.py``, a child process decoding the protobufs):
the GenAI semantic-convention names, units and bucket advice; a trace of run, phases, faults and streams
whose times are the journal's; and the stream hop's taps show the target was sent exactly the span ids
exported. Without ``--otlp`` no traceparent is sent; an OTLP endpoint that is down leaves the exit code."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaos.model.errors import UsageError
from chaos.model.observations import iter_journal
from chaos.model.trace_ids import span_id_of, trace_id_of, traceparent
from chaos.output.otel import DURATION_BUCKETS, FIRST_TOKEN_EVENT, TOKEN_BUCKETS, require_otel
from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(120)

RECEIVER = Path(__file__).with_name("otlp_receiver.py")
UNITS = {"gen_ai.client.operation.duration": "s", "gen_ai.client.operation.time_to_first_chunk": "s",
         "gen_ai.client.operation.time_per_output_chunk": "s", "gen_ai.client.token.usage": "{token}"}
CUT = {"kind": "stream.cut", "name": "cut", "after_events": 3, "how": "bare_eof"}


@pytest.fixture(scope="module")
def stack() -> Iterator[str]:
    process = StackProcess.start("--port", "0")
    try:
        yield process.url
    finally:
        process.close()


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    out = tmp_path / "received.jsonl"
    process = subprocess.Popen([sys.executable, str(RECEIVER), str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}", out
    finally:
        process.terminate()
        process.wait(timeout=10)


def _experiment(tmp_path: Path, stack: str, phases: list[dict[str, Any]], sla: list[dict[str, Any]]) -> Path:
    body = {"name": "otel-run", "seed": 1, "target": {"kind": "builtin", "url": stack}, "path": [{"kind": "stream"}],
            "load": {"concurrency": 2, "max_tokens": 8, "request_timeout": "20s"}, "phases": phases, "sla": sla,
            "safety": {"max_duration": "60s", "drain_timeout": "5s", "cleanup_window": "100ms"}}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
    return path


def _cli(*args: str, endpoint: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if endpoint is not None:
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_TIMEOUT="1")
    return subprocess.run([sys.executable, "-m", "chaos", *args], capture_output=True, text=True, timeout=100,
                          env=env)


def _hex(b64: str) -> str:
    return base64.b64decode(b64).hex()


def _attrs(item: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values()), None) for a in item.get("attributes", [])}


def _received(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(spans, metrics) of every request the receiver decoded."""
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    spans = [s for line in lines if line["path"] == "/v1/traces" for rs in line["body"]["resourceSpans"]
             for ss in rs["scopeSpans"] for s in ss["spans"]]
    metrics = [m for line in lines if line["path"] == "/v1/metrics" for rm in line["body"]["resourceMetrics"]
               for sm in rm["scopeMetrics"] for m in sm["metrics"]]
    return spans, metrics


def _journal(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    lines = list(iter_journal(run_dir / "journal.jsonl"))
    head = next(line for line in lines if line.get("type") == "run")
    return (head, [line for line in lines if line.get("type") == "stream"],
            [line for line in lines if line.get("type") == "tap"])


def test_trace_ids_are_derived_never_zero_and_a_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    assert trace_id_of("6400c3af97d4192a") == trace_id_of("6400c3af97d4192a") != trace_id_of("6400c3af97d4192b")
    assert len(trace_id_of("r")) == 32 and len(span_id_of("x")) == 16 and int(span_id_of("x"), 16) != 0
    assert traceparent("a" * 32, "b" * 16) == f"00-{'a' * 32}-{'b' * 16}-01"
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk", None)  # as if the extra were not installed
    with pytest.raises(UsageError, match=re.escape("pip install -e '.[otel]'")):
        require_otel()


@pytest.mark.slow
def test_a_run_exports_semconv_metrics_and_a_trace_whose_span_ids_the_target_was_sent(
        tmp_path: Path, stack: str, receiver: tuple[str, Path]) -> None:
    endpoint, received = receiver
    run_dir = tmp_path / "run"
    exp = _experiment(tmp_path, stack, [{"name": "baseline", "duration": "1s"},
                                        {"name": "cut", "duration": "1s", "faults": [CUT]}],
                      [{"kind": "errors", "budget": "100%"}])
    done = _cli("run", str(exp), "--out", str(run_dir), "--quiet", "--otlp", endpoint=endpoint)
    assert done.returncode == 0, done.stderr
    spans, metrics = _received(received)
    head, streams, taps = _journal(run_dir)
    report = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))

    # metrics: the conventions' names and units exactly, their bucket advice, our attributes
    assert {m["name"]: m["unit"] for m in metrics} == UNITS
    for m in metrics:
        points = m["histogram"]["dataPoints"]
        bounds = TOKEN_BUCKETS if m["unit"] == "{token}" else DURATION_BUCKETS
        assert all(p["explicitBounds"] == [float(b) for b in bounds] for p in points), m["name"]
        assert all(_attrs(p)["gen_ai.operation.name"] == "text_completion" and _attrs(p)["server.port"]
                   and _attrs(p)["streamchaos.run_id"] == head["run_id"] for p in points)
    duration = next(m for m in metrics if m["name"] == "gen_ai.client.operation.duration")
    by_phase: dict[str, int] = {}
    faulted_points = False
    for p in duration["histogram"]["dataPoints"]:
        a = _attrs(p)
        by_phase[a["streamchaos.phase"]] = by_phase.get(a["streamchaos.phase"], 0) + int(p["count"])
        assert a["streamchaos.phase"] == "cut" or "streamchaos.fault" not in a, a
        faulted_points = faulted_points or a.get("streamchaos.fault") == "cut"
    assert by_phase == {"baseline": sum(s["phase"] == "baseline" for s in streams),
                        "cut": sum(s["phase"] == "cut" for s in streams)}
    assert faulted_points  # the cut phase's streams sent while the cut was in force
    assert any("error.type" in _attrs(p) for p in duration["histogram"]["dataPoints"])  # the cut streams failed

    # the trace: run → phases → faults and streams, one trace id, the journal's times
    (trace_id,) = {_hex(s["traceId"]) for s in spans}
    by_id = {_hex(s["spanId"]): s for s in spans}
    (root,) = [s for s in spans if "parentSpanId" not in s]
    phases = {_attrs(s)["streamchaos.phase"]: _hex(s["spanId"]) for s in spans if s["name"].startswith("phase ")}
    assert set(phases) == {"baseline", "cut"}
    assert all(by_id[sid]["parentSpanId"] == root["spanId"] for sid in phases.values())
    clients = [s for s in spans if s["kind"] == "SPAN_KIND_CLIENT"]
    assert len(clients) == len(streams) and len(spans) == len(streams) + 4  # root, 2 phases, 1 fault
    for s in clients:
        assert _hex(s["parentSpanId"]) == phases[_attrs(s)["streamchaos.phase"]]
        assert s["name"] == "text_completion tiny" or s["name"].startswith("text_completion ")
    wall0 = int(head["wall_t0"] * 1e9) - head["t0"]
    (fault,) = [s for s in spans if s["name"] == "fault cut"]
    assert _hex(fault["parentSpanId"]) == phases["cut"] and _attrs(fault)["streamchaos.fault.kind"] == "stream.cut"
    (faulted,) = report["faults"]
    t0_ns = int(head["wall_t0"] * 1e9)
    assert abs((int(fault["startTimeUnixNano"]) - t0_ns) / 1e9 - faulted["injected_at"]) < 0.001
    assert abs((int(fault["endTimeUnixNano"]) - t0_ns) / 1e9 - faulted["reverted_at"]) < 0.001
    events = [line for line in iter_journal(run_dir / "journal.jsonl") if line.get("type") == "fault"]
    # in force (chaos.model.observations.FaultSpan) from when its inject began to when its revert returned
    fault_t0 = next(e["t_started"] for e in events if e["action"] == "inject")
    fault_t1 = next(e["t"] for e in events if e["action"] == "revert")
    by_request = {_attrs(s)["streamchaos.record_id"]: s for s in clients}
    for st in streams:
        span = by_request[st["id"]]
        assert int(span["startTimeUnixNano"]) == wall0 + st["t_sent"]
        first = [e for e in span.get("events", []) if e["name"] == FIRST_TOKEN_EVENT]
        if st["t_content"]:
            assert [int(e["timeUnixNano"]) - int(span["startTimeUnixNano"]) for e in first] == \
                [st["t_content"][0] - st["t_sent"]]
        touched = st["phase"] == "cut" and st["t_sent"] >= fault_t0 and st["t_sent"] < fault_t1
        assert _attrs(span).get("streamchaos.fault") == ("cut" if touched else None), st["id"]
        assert any(e["name"] == "streamchaos.fault" for e in span.get("events", [])) == touched
    assert any(s.get("status", {}).get("code") == "STATUS_CODE_ERROR" for s in clients)

    # what the target was sent: the stream hop's taps hold each request's traceparent, exactly the ids exported
    sent = {tap["traceparent"] for tap in taps}
    assert sent == {f"00-{trace_id}-{_hex(s['spanId'])}-01" for s in clients}
    assert json.loads((run_dir / "otlp.json").read_text())["ok"] is True

    # exported again from the run directory: the same trace, the same span ids
    received.unlink()
    again = _cli("report", str(run_dir), "--otlp", endpoint=endpoint)
    assert again.returncode == 0, again.stderr
    spans_again, _ = _received(received)
    assert {(_hex(s["traceId"]), _hex(s["spanId"])) for s in spans_again} == \
        {(_hex(s["traceId"]), _hex(s["spanId"])) for s in spans}


@pytest.mark.slow
def test_without_otlp_no_traceparent_is_sent_and_a_dead_endpoint_keeps_the_exit_code(
        tmp_path: Path, stack: str) -> None:
    exp = _experiment(tmp_path, stack, [{"name": "baseline", "duration": "500ms"},
                                        {"name": "cut", "duration": "500ms", "faults": [CUT]}],
                      [{"kind": "errors", "budget": "0%"}])  # the cut fails it: exit 1
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # the two runs side by side: half the wall time
        off_run = pool.submit(_cli, "run", str(exp), "--out", str(tmp_path / "off"), "--quiet")
        down_run = pool.submit(_cli, "run", str(exp), "--out", str(tmp_path / "down"), "--quiet", "--otlp",
                               endpoint=dead)
        off, down = off_run.result(), down_run.result()
    assert off.returncode == 1, off.stderr
    _, streams, taps = _journal(tmp_path / "off")
    assert streams and len(taps) == len(streams) and all(tap["traceparent"] is None for tap in taps)
    assert not (tmp_path / "off" / "otlp.json").exists()

    assert down.returncode == 1, down.stderr
    lines = [line for line in down.stderr.splitlines() if "OTLP export" in line]
    assert len(lines) == 1 and f"{dead}/v1/traces failed" in lines[0] and "exit code is unchanged" in lines[0], \
        down.stderr
    outcome = json.loads((tmp_path / "down" / "otlp.json").read_text())
    assert outcome["ok"] is False and outcome["errors"]
    _, _, taps = _journal(tmp_path / "down")
    assert taps and all(tap["traceparent"] for tap in taps)
