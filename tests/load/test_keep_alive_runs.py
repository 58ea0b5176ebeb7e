"""Whole runs against a server that closes every connection after a streamed response while its
response says keep-alive (llama-server's way, played by the mock's ``closes_after_stream``):
``load.http.keep_alive: auto`` (the default) finds it before the load and opens a connection per
request, so no request is lost to it, and says so; ``on`` reuses whatever the server leaves open,
and the requests written into connections it was closing are lost (cause ``stale_connection``)."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

from chaos.api import runner as make_runner
from chaos.experiment import experiment_from_dict
from chaos.load.mock import ThreadedMockServer
from chaos.output.progress import ConsoleProgress

pytestmark = pytest.mark.timeout(60)


def _run(tmp_path: Path, keep_alive: str | None, **mock: Any) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    load: dict[str, Any] = {"concurrency": 4, "max_tokens": 4}
    if keep_alive is not None:
        load["http"] = {"keep_alive": keep_alive}
    experiment = experiment_from_dict({
        "name": "keep-alive", "seed": 1, "load": load, "phases": [{"name": "p", "duration": "1500ms"}],
        "safety": {"max_duration": "30s", "drain_timeout": "2s", "cleanup_window": "100ms"},
        "sla": [{"kind": "errors", "budget": "0%"}],
    })
    live = io.StringIO()
    run_dir = tmp_path / f"run-{keep_alive}"
    with ThreadedMockServer(tick_s=0.0005, **mock) as server:
        result = asyncio.run(make_runner(experiment, target_url=server.base_url, out_dir=run_dir,
                                         handle_signals=False, listeners=[ConsoleProgress(live)]).run())
    assert result.status == "completed", result.error
    report = json.loads((run_dir / "report.json").read_text())
    notes = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    probes = [n["data"] for n in notes if n.get("type") == "note" and n.get("topic") == "keep_alive"]
    return report, probes, live.getvalue()


def _errors(report: dict[str, Any]) -> dict[str, Any]:
    return next(v for v in report["verdicts"] if v["sla"] == "errors")


def test_auto_finds_the_closing_server_and_loses_nothing(tmp_path: Path) -> None:
    report, probes, live = _run(tmp_path, None, closes_after_stream=True)
    (probe,) = probes
    assert probe["closes_after_stream"] is True and probe["reuse"] is False, probe
    assert "without Connection: close" in live and "one connection per request" in live, live
    errors = _errors(report)
    assert errors["status"] == "pass" and errors["samples"] > 50, errors


def test_on_reuses_and_counts_the_requests_the_closing_server_loses(tmp_path: Path) -> None:
    report, probes, _live = _run(tmp_path, "on", closes_after_stream=True)
    assert probes == []  # asked for reuse: nothing probed
    errors = _errors(report)
    print("lost to closed connections:", errors["figure"], "of", errors["samples"])
    assert errors["status"] == "fail", errors
    assert "stale connection" in json.dumps(errors["evidence"]), errors["evidence"]


def test_auto_keeps_reusing_a_server_that_keeps_its_connections(tmp_path: Path) -> None:
    report, probes, live = _run(tmp_path, None)
    (probe,) = probes
    assert probe["closes_after_stream"] is False and probe["reuse"] is True, probe
    assert "one connection per request" not in live
    assert _errors(report)["status"] == "pass"
