"""Real runs against the loopback mock: a metrics URL that answers 404 (a server without /metrics) makes
`kv_cleanup` unobservable, and the run exits 0 by default, 3 with `when_unobservable: inconclusive` and 1
with `fail` (the same journal re-judged); a metrics URL that answers 500 is a failure that could clear,
so the verdict stays inconclusive and the run exits 3."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import chaos
from chaos.execution.result import exit_code_for
from chaos.execution.verify import judge_all
from chaos.experiment.loader import parse_experiment
from chaos.load.mock import ThreadedMockServer
from chaos.model.observations import Observations

pytestmark = pytest.mark.timeout(120)


def experiment(url: str, metrics_url: str, when: str = "tolerate") -> str:
    return (f"name: unobservable\ntarget: {{kind: openai, url: '{url}', metrics_url: '{metrics_url}'}}\n"
            "load: {concurrency: 2, max_tokens: 4}\nphases: [{name: a, duration: 2s}]\n"
            f"sla:\n  - {{kind: kv_cleanup, within: 0.5s, when_unobservable: {when}}}\n"
            "  - {kind: errors, budget: 0}\n"
            "safety: {max_duration: 60s, cleanup_window: 1s}\n")


@pytest.fixture
def failing_metrics() -> Iterator[str]:
    """A /metrics that answers 500 every time."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_target_without_metrics_is_tolerated_or_counted_as_the_entry_says(tmp_path: Path) -> None:
    with ThreadedMockServer() as mock:
        root = mock.base_url.removesuffix("/v1")
        text = experiment(mock.base_url, f"{root}/absent/metrics")
        result = chaos.run(parse_experiment(text), out_dir=tmp_path / "run")
    kv, errors = result.verdicts
    assert (kv.status, errors.status) == ("unobservable", "pass"), kv.evidence
    assert kv.evidence["reason"].startswith("the target has no /metrics (404 ×")
    assert result.exit_code == 0
    report = json.loads((tmp_path / "run" / "report.json").read_text(encoding="utf-8"))
    body = report["verdicts"][0]
    assert (body["status"], body["when_unobservable"], body["ok"]) == ("unobservable", "tolerate", True)
    obs = Observations.load(tmp_path / "run" / "journal.jsonl")
    for when, code in (("inconclusive", 3), ("fail", 1), ("tolerate", 0)):
        verdicts = judge_all(parse_experiment(experiment(mock.base_url, f"{root}/absent/metrics", when)), obs)
        assert verdicts[0].status == "unobservable"
        assert exit_code_for(verdicts) == code, when


def test_a_metrics_endpoint_that_fails_stays_inconclusive(tmp_path: Path, failing_metrics: str) -> None:
    with ThreadedMockServer() as mock:
        result = chaos.run(parse_experiment(experiment(mock.base_url, failing_metrics)), out_dir=tmp_path / "run")
    kv = result.verdicts[0]
    assert kv.status == "inconclusive", kv.evidence
    assert "HTTP 500" in kv.evidence["reason"]
    assert result.exit_code == 3
