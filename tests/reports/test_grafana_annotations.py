"""Grafana annotations of a real run: one short run of the builtin stack (two phases, one client fault),
its windows as annotations, pushed by `streamchaos report RUN_DIR --grafana` and, Grafana being down,
by `streamchaos run --grafana` without changing the run's exit code.

Grafana cannot be installed here, so the receiver is ``GrafanaDouble``: a real HTTP server on loopback
implementing the legacy annotations API (``POST``/``GET /api/annotations``) as Grafana does: the body
bound the way Grafana's Go struct binds it (``time``/``timeEnd`` int64 milliseconds, ``tags`` a list of
strings, ``text`` a non-empty string, ``dashboardUID`` a string, ``panelId`` an integer), 401 without the
right bearer token, and ``GET`` filtering by overlap with ``from``/``to`` and by every tag given."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from chaos.model.errors import ReportWriteFailed
from chaos.output.grafana import annotations as make_annotations
from chaos.output.grafana import push_annotations

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]  # one whole run, then its annotations

ROOT = Path(__file__).parents[2]
TOKEN = "glsa_streamchaos-test-token-1234"  # the shape of a Grafana service-account token
EXPERIMENT = """
name: grafana-probe
seed: 3
target: {kind: builtin, model: tiny}
load: {concurrency: 2, max_tokens: 8}
phases:
  - name: baseline
    duration: 1s
  - name: slowed
    duration: 1s
    faults:
      - kind: client.slow_reader
        fraction: 50%
        read_delay: 20ms
sla:
  - kind: errors
    budget: 0%
safety: {max_duration: 60s, cleanup_window: 100ms, drain_timeout: 2s}
"""
_INT64 = "cannot unmarshal into int64"  # what Go's encoding/json makes of a float, a string or a bool there


class GrafanaDouble(ThreadingHTTPServer):
    """Grafana's legacy annotations API, as much of it as a client of it meets."""

    daemon_threads = True

    def __init__(self, token: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.token = token
        self.stored: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: GrafanaDouble

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {self.server.token}":
            return True
        self._answer(401, {"message": "Invalid API key", "traceID": ""})
        return False

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        if urlsplit(self.path).path != "/api/annotations":
            return self._answer(404, {"message": "Not found"})
        if not self._authorized():
            return None
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        except ValueError:
            return self._answer(400, {"message": "bad request data"})
        problem = _bind(body)
        if problem:
            return self._answer(400, {"message": "bad request data", "error": problem})
        if not body.get("text"):
            return self._answer(400, {"message": "Failed to save annotation",
                                      "error": "text field should not be empty"})
        now = int(time.time() * 1000)
        start = body.get("time") or now
        with self.server.lock:
            item = {"id": len(self.server.stored) + 1, "alertId": 0, "alertName": "", "dashboardId": 0,
                    "dashboardUID": body.get("dashboardUID") or None, "panelId": body.get("panelId") or 0,
                    "userId": 1, "newState": "", "prevState": "", "created": now, "updated": now, "time": start,
                    "timeEnd": body.get("timeEnd") or start, "text": body["text"], "tags": body.get("tags") or [],
                    "login": "sa-streamchaos", "email": "", "avatarUrl": "", "data": body.get("data") or {}}
            self.server.stored.append(item)
        return self._answer(200, {"message": "Annotation added", "id": item["id"]})

    def do_GET(self) -> None:  # noqa: N802
        parts = urlsplit(self.path)
        if parts.path != "/api/annotations":
            return self._answer(404, {"message": "Not found"})
        if not self._authorized():
            return None
        q = parse_qs(parts.query)
        lo, hi = int(q.get("from", ["0"])[0]), int(q.get("to", [str(2**62)])[0])
        tags, any_tag = set(q.get("tags", [])), q.get("matchAny", ["false"])[0] == "true"
        with self.server.lock:
            found = [a for a in self.server.stored if a["time"] <= hi and a["timeEnd"] >= lo
                     and (not tags or (bool(tags & set(a["tags"])) if any_tag else tags <= set(a["tags"])))]
        found.sort(key=lambda a: (a["time"], a["timeEnd"]), reverse=True)  # Grafana: newest first
        return self._answer(200, found[: int(q.get("limit", ["100"])[0])])


def _bind(body: Any) -> str | None:
    """Why Grafana's JSON binding (``dtos.PostAnnotationsCmd``) would reject ``body``; None when it binds."""
    if not isinstance(body, dict):
        return "cannot unmarshal into PostAnnotationsCmd"
    for key in ("time", "timeEnd", "dashboardId", "panelId"):
        value = body.get(key)
        if value is not None and (type(value) is not int or not -(2**63) <= value < 2**63):
            return f"{key}: {_INT64}"
    for key in ("text", "dashboardUID"):
        if body.get(key) is not None and not isinstance(body[key], str):
            return f"{key}: cannot unmarshal into string"
    tags = body.get("tags")
    if tags is not None and not (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
        return "tags: cannot unmarshal into []string"
    return None


@pytest.fixture
def grafana() -> Iterator[GrafanaDouble]:
    server = GrafanaDouble(TOKEN)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chaos", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "GF_TOKEN": TOKEN, **(env or {})}, timeout=timeout, check=False)


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there now: connection refused


@dataclass
class FinishedRun:
    run_dir: Path
    report: dict[str, Any]
    proc: subprocess.CompletedProcess[str]
    dead_url: str


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> FinishedRun:
    """The one real run, through the CLI with `--grafana` pointing where nothing listens."""
    tmp = tmp_path_factory.mktemp("grafana")
    (tmp / "probe.yaml").write_text(EXPERIMENT)
    dead = _dead_url()
    proc = _cli("run", str(tmp / "probe.yaml"), "--out", str(tmp / "run"), "--quiet",
                "--grafana", dead, "--grafana-token-env", "GF_TOKEN")
    assert (tmp / "run" / "report.json").exists(), proc.stderr
    return FinishedRun(tmp / "run", json.loads((tmp / "run" / "report.json").read_text()), proc, dead)


def _by_tag(bodies: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    return [b for b in bodies if tag in b["tags"]]


def test_one_region_per_phase_and_per_fault_at_the_reports_times(finished: FinishedRun) -> None:
    report = finished.report
    assert report["status"] == "completed" and len(report["phases"]) == 2 and len(report["faults"]) == 1, report
    bodies = make_annotations(report)
    start_ms = report["start"] * 1000
    phases, faults = _by_tag(bodies, "phase"), _by_tag(bodies, "fault")
    assert len(bodies) == len(phases) + len(faults) == 3  # healthy: no halt
    for body, phase in zip(phases, report["phases"], strict=True):
        assert body["tags"] == ["streamchaos", "phase", "grafana-probe", phase["name"]]
        assert abs(body["time"] - (start_ms + phase["start_s"] * 1000)) <= 1
        assert abs(body["timeEnd"] - (start_ms + phase["end_s"] * 1000)) <= 1
        assert phase["name"] in body["text"] and "errors pass" in body["text"], body["text"]
        assert _bind(body) is None and "dashboardUID" not in body
    (fault,), (body,) = report["faults"], faults
    assert body["tags"] == ["streamchaos", "fault", "grafana-probe", "client.slow_reader"]
    assert abs(body["time"] - (start_ms + fault["injected_at"] * 1000)) <= 1
    assert abs(body["timeEnd"] - (start_ms + fault["reverted_at"] * 1000)) <= 1
    assert "client.slow_reader" in phases[1]["text"] and "faults: none" in phases[0]["text"]


def test_a_fault_never_reverted_ends_with_the_run_and_a_halt_is_a_point(finished: FinishedRun) -> None:
    report = copy.deepcopy(finished.report)
    report["faults"][0]["reverted_at"] = None
    report["status"], report["halt"] = "halted", {"reason": "errors above 50% over 2s", "top_errors": []}
    bodies = make_annotations(report, dashboard_uid="streamchaos-run-qos", panel_id=4)
    (fault,), (halt,) = _by_tag(bodies, "fault"), _by_tag(bodies, "halt")
    assert fault["timeEnd"] == round(report["end"] * 1000) and "never reverted" in fault["text"]
    assert "timeEnd" not in halt and "errors above 50% over 2s" in halt["text"]
    assert halt["time"] == round((report["start"] + report["phases"][-1]["end_s"]) * 1000)
    assert all(b["dashboardUID"] == "streamchaos-run-qos" and b["panelId"] == 4 for b in bodies)


def test_report_grafana_pushes_them_and_grafana_gives_them_back(finished: FinishedRun, grafana: GrafanaDouble) -> None:
    proc = _cli("report", str(finished.run_dir), "--grafana", grafana.url, "--grafana-token-env", "GF_TOKEN",
                "--grafana-dashboard", "streamchaos-run-qos", "--grafana-panel", "2")
    assert proc.returncode == 0, proc.stderr
    assert "grafana: 3 annotations pushed" in proc.stdout and "ids 1, 2, 3" in proc.stdout, proc.stdout
    assert TOKEN not in proc.stdout + proc.stderr
    report = finished.report
    window = {"from": int(report["start"] * 1000), "to": int(report["end"] * 1000) + 1}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    phases = httpx.get(f"{grafana.url}/api/annotations", headers=headers,
                       params={**window, "tags": ["streamchaos", "phase"]}).json()
    faults = httpx.get(f"{grafana.url}/api/annotations", headers=headers,
                       params={**window, "tags": ["streamchaos", "fault", "client.slow_reader"]}).json()
    assert sorted(a["tags"][-1] for a in phases) == ["baseline", "slowed"]
    assert [a["id"] for a in faults] == [3]
    pushed = make_annotations(report, dashboard_uid="streamchaos-run-qos", panel_id=2)
    for stored in phases + faults:
        sent = pushed[stored["id"] - 1]
        assert (stored["time"], stored["timeEnd"], stored["tags"], stored["text"]) == (
            sent["time"], sent["timeEnd"], sent["tags"], sent["text"])
        assert stored["dashboardUID"] == "streamchaos-run-qos" and stored["panelId"] == 2


def test_a_wrong_token_is_exit_4_naming_401_and_the_variable(finished: FinishedRun, grafana: GrafanaDouble) -> None:
    proc = _cli("report", str(finished.run_dir), "--grafana", grafana.url, "--grafana-token-env", "GF_WRONG",
                env={"GF_WRONG": "glsa_not-the-token"})
    assert proc.returncode == 4, (proc.stdout, proc.stderr)
    assert "401" in proc.stderr and "$GF_WRONG" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "glsa_not-the-token" not in proc.stdout + proc.stderr
    assert grafana.stored == []


def test_grafana_down_during_the_run_is_one_line_and_the_exit_code_stands(finished: FinishedRun) -> None:
    proc, report = finished.proc, finished.report
    assert proc.returncode == report["exit_code"] == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "grafana" in line.lower()]
    assert len(lines) == 1 and "not pushed" in lines[0] and finished.dead_url in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    written = b"".join(p.read_bytes() for p in finished.run_dir.rglob("*") if p.is_file())
    assert TOKEN.encode() not in written and TOKEN not in proc.stdout + proc.stderr


def test_what_grafana_would_not_bind_is_refused_and_said(grafana: GrafanaDouble) -> None:
    good = {"time": 1_700_000_000_000, "timeEnd": 1_700_000_001_000, "tags": ["streamchaos"], "text": "x"}
    assert push_annotations(grafana.url, [good], token=TOKEN) == [1]
    with pytest.raises(ReportWriteFailed, match=r"400 Bad Request \(bad request data\).*1 of 2 annotations added"):
        push_annotations(grafana.url, [good, {**good, "time": 1.7e12 + 0.5}], token=TOKEN)
    with pytest.raises(ReportWriteFailed, match="401 .*no token given: name its environment variable"):
        push_annotations(grafana.url, [good], token=None)
    with pytest.raises(ReportWriteFailed, match="404 Not Found"):
        push_annotations(grafana.url + "/grafana", [good], token=TOKEN)
    with pytest.raises(ReportWriteFailed, match="could not be reached"):
        push_annotations(_dead_url(), [good], token=TOKEN)
