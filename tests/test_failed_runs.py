"""A bad outcome looks bad: a run that never reached its verdicts (a dead target, a 404 server)
reads as failed on its page and its console, says what to check, and does not count as a run in
`report --history` or `budgets`; the dry run refuses what the real run would refuse.

The failed runs are real: `streamchaos run` against a loopback port nothing listens on, and against
a real HTTP server that answers /v1/models and 404 to everything else.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from test_budgets import synthetic_run, write_run

from chaos.cli import main
from chaos.output.reports.history import load_runs

pytestmark = pytest.mark.timeout(120)

EXPERIMENT = """\
name: synth
seed: 1
load: {concurrency: 2, max_tokens: 8}
phases:
  - {name: steady, duration: 2s}
sla:
  - {kind: ttft, quantile: p90, budget: 1s}
  - {kind: errors}
"""


def _cli(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(argv)
    return code, out.getvalue()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _NotFound(BaseHTTPRequestHandler):
    """Answers GET /v1/models; 404 to everything else (a server without the completions API)."""

    def _any(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        found = self.path == "/v1/models"
        body = json.dumps({"data": [{"id": "m"}]} if found else {"error": {"message": "Not Found"}}).encode()
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _any

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def not_found() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def dead_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int, str]:
    root = tmp_path_factory.mktemp("dead")
    (root / "exp.yaml").write_text(EXPERIMENT, encoding="utf-8")
    port = _closed_port()
    code, out = _cli(["run", str(root / "exp.yaml"), "--target-url", f"http://127.0.0.1:{port}", "--out",
                      str(root / "run"), "--quiet"])
    return root / "run", port, code, out


def test_a_dead_target_run_says_its_cause_first_and_what_to_check(dead_run: tuple[Path, int, int, str]) -> None:
    run_dir, port, code, out = dead_run
    lines = out.strip().splitlines()
    assert code == 4, out
    assert lines[0].startswith("error: ") and f"127.0.0.1:{port}" in lines[0], out
    assert "SLA  PHASE" not in out and "---" not in out  # no empty verdict table
    assert "synth: the run failed before any verdict: nothing was judged (exit 4)" in out
    assert f"nothing listens on 127.0.0.1:{port}" in out
    assert lines[-1] == f"open: {run_dir / 'report.html'}"


def test_the_page_of_a_run_that_judged_nothing_does_not_read_as_a_pass(dead_run: tuple[Path, int, int, str]) -> None:
    run_dir = dead_run[0]
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    summary = page.split('<p class="summary">', 1)[1].split("</p>", 1)[0]
    assert "all as expected" not in page and 'class="pass"' not in summary
    assert summary.startswith('<b class="fail">error: ') \
        and "nothing judged: the run failed before any verdict" in summary
    assert f"nothing listens on 127.0.0.1:{dead_run[1]}" in page  # what to check, on the page too


def test_a_404_server_run_points_at_load_endpoint_chat(tmp_path: Path, not_found: str) -> None:
    (tmp_path / "exp.yaml").write_text(EXPERIMENT, encoding="utf-8")
    code, out = _cli(["run", str(tmp_path / "exp.yaml"), "--target-url", not_found, "--out", str(tmp_path / "run"),
                      "--quiet"])
    assert code == 4, out
    assert out.startswith("error: the target refused the load's request at the preflight (HTTP 404"), out
    assert "set `load.endpoint: chat`" in out and out.strip().splitlines()[-1].startswith("open: ")


def test_https_to_a_plain_http_server_says_something_listens_and_to_use_http(tmp_path: Path, not_found: str) -> None:
    """TLS spoken to a real plain-HTTP server: the handshake fails, but something does listen there."""
    (tmp_path / "exp.yaml").write_text(EXPERIMENT, encoding="utf-8")
    where = not_found.removeprefix("http://")
    code, out = _cli(["run", str(tmp_path / "exp.yaml"), "--target-url", f"https://{where}", "--out",
                      str(tmp_path / "run"), "--quiet"])
    assert code == 4, out
    assert f"something listens on {where} but speaks plain HTTP, not TLS: use http://{where}" in out, out
    assert "nothing listens" not in out, out


def test_history_leaves_out_runs_that_judged_nothing(tmp_path: Path, dead_run: tuple[Path, int, int, str]) -> None:
    root = tmp_path / "history"
    root.mkdir()
    good = json.loads((dead_run[0] / "report.json").read_text(encoding="utf-8"))
    good.update(status="completed", exit_code=0, error=None, start=1.0,
                verdicts=[{"sla": "errors", "name": "errors", "phase": None, "status": "pass", "ok": True,
                           "expect": "pass", "figure": 0.0, "budget": 0.0, "unit": "fraction", "samples": 10,
                           "evidence": {}}])
    (root / "a-good").mkdir()
    (root / "a-good" / "report.json").write_text(json.dumps(good), encoding="utf-8")
    for i in range(3):
        shutil.copytree(dead_run[0], root / f"b-dead-{i}")
    left_out: list[Path] = []
    runs = load_runs(root, left_out=left_out)
    assert [r.path.name for r in runs] == ["a-good"]
    assert sorted(p.name for p in left_out) == ["b-dead-0", "b-dead-1", "b-dead-2"]
    code, out = _cli(["report", "--history", str(root)])
    assert code == 0, out
    assert out.count("left out ") == 3 and "none in the last" not in out


def test_budgets_leave_out_runs_that_judged_nothing(tmp_path: Path, dead_run: tuple[Path, int, int, str]) -> None:
    healthy = [write_run(tmp_path, f"healthy{s}", synthetic_run(s)) for s in range(2)]
    dead = tmp_path / "dead"
    shutil.copytree(dead_run[0], dead)
    (dead / "experiment.yaml").write_text(EXPERIMENT, encoding="utf-8")
    code, out = _cli(["budgets", *map(str, healthy), str(dead)])
    assert code == 0, out
    assert f"left out {dead}: it ended before any verdict" in out
    assert "budgets from 2 healthy run(s)" in out
    code, out = _cli(["budgets", str(dead)])
    assert code == 2 and "none of the 1 run(s) got as far as a verdict" in out, out


def test_a_dry_run_refuses_what_the_run_would_refuse(tmp_path: Path, not_found: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(EXPERIMENT, encoding="utf-8")
    code, out = _cli(["run", str(path), "--target-url", not_found, "--dry-run"])
    assert code == 4, out
    assert "REFUSES THE LOAD'S REQUEST: the target refused the load's request at the preflight (HTTP 404" in out
    assert "set `load.endpoint: chat`" in out and "the run could not be carried out here (exit 4)" in out
    # the builtin target needs the engine extra: without it the run stops at once, and so does the dry run
    import chaos.targets.base

    monkeypatch.setattr(chaos.targets.base, "ENGINE_MODULES",
                        (*chaos.targets.base.ENGINE_MODULES, "streamchaos_no_such_module"))
    code, out = _cli(["run", str(path), "--dry-run"])
    assert code == 4, out
    assert "NOT POSSIBLE HERE: the experiment's target (kind builtin) needs the builtin engine" in out
    assert "missing: streamchaos_no_such_module" in out


def test_report_of_a_run_that_judged_nothing_says_so_without_an_empty_table(
        dead_run: tuple[Path, int, int, str]) -> None:
    run_dir, port = dead_run[0], dead_run[1]
    code, out = _cli(["report", str(run_dir)])
    assert code == 4 and out.startswith("error: "), out
    assert "nothing was judged" in out and f"nothing listens on 127.0.0.1:{port}" in out and "SLA  PHASE" not in out
