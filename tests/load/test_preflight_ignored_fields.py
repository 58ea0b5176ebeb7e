"""A server that takes ``ignore_eos`` and ``stream_options.include_usage`` and ignores them (as
llama-cpp-python's does, played here by the mock's ``ignores_ignore_eos`` / ``ignores_include_usage``)
is named by the preflight, from its own stream, and a real run carries the finding to its console and
report.json; a server that honours them is named nothing, and no run pays for an extra request unless
the preflight cut its stream before the end that decides."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

from chaos.api import runner as make_runner
from chaos.execution.preflight import PROBE_MAX_TOKENS, preflight
from chaos.experiment import experiment_from_dict
from chaos.load.mock import ThreadedMockServer
from chaos.model.engines import PROFILES
from chaos.model.experiment import LoadSpec
from chaos.output.progress import ConsoleProgress
from chaos.output.report import render_summary

pytestmark = pytest.mark.timeout(60)

IGNORING = {"ignores_ignore_eos": True, "ignores_include_usage": True}
NAMED = ("ignored by the server: ignore_eos (the preflight stream stopped at 7 of 32 tokens with finish_reason stop), "
         "stream_options.include_usage (no usage chunk)")


async def _preflight(server: ThreadedMockServer, max_tokens: int) -> Any:
    return await preflight(LoadSpec(max_tokens=(max_tokens, max_tokens)), base_url=server.base_url, model="mock",
                           seed=1, api_key=None, profile=PROFILES["openai"], timeout=10.0)


async def test_the_preflight_names_both_fields_a_server_ignores_from_its_one_request() -> None:
    with ThreadedMockServer(tick_s=0.001, **IGNORING) as server:
        found = await _preflight(server, 32)
        assert len(server.requests) == 1  # decided by the load's own request: no second one
    assert [(c.field, c.evidence) for c in found.ignored] == [
        ("ignore_eos", "the preflight stream stopped at 7 of 32 tokens with finish_reason stop"),
        ("stream_options.include_usage", "no usage chunk")]
    assert found.dropped == {}  # taken, not refused: nothing is dropped
    facts = found.facts()
    assert [i["field"] for i in facts["ignored_fields"]] == ["ignore_eos", "stream_options.include_usage"]
    assert all(i["affects"] for i in facts["ignored_fields"])


async def test_the_preflight_names_nothing_against_a_server_that_honours_them() -> None:
    with ThreadedMockServer(tick_s=0.001) as server:
        found = await _preflight(server, 32)
        assert len(server.requests) == 1
    assert found.ignored == [] and found.facts()["ignored_fields"] == []
    assert {c.field: c.outcome for c in found.checks} == {"ignore_eos": "honoured",
                                                          "stream_options.include_usage": "honoured"}


async def test_a_cut_preflight_stream_decides_with_one_short_request_more() -> None:
    # a soak's 100000 tokens: the preflight hangs up early, before the end where usage comes
    with ThreadedMockServer(tick_s=0.002, ignores_include_usage=True) as server:
        found = await _preflight(server, 100_000)
        sent = [r.body.get("max_tokens") for r in server.requests]
    assert found.cut is not None and sent == [100_000, PROBE_MAX_TOKENS]
    assert {c.field: c.outcome for c in found.checks} == {"ignore_eos": "honoured",
                                                          "stream_options.include_usage": "ignored"}
    (usage,) = found.ignored
    assert usage.evidence == f"no usage chunk (a second preflight request of max_tokens {PROBE_MAX_TOKENS})"
    assert found.probe is not None and found.probe["max_tokens"] == PROBE_MAX_TOKENS and not found.probe["usage"]


def _run(tmp_path: Path, **mock: Any) -> tuple[dict[str, Any], str, str]:
    experiment = experiment_from_dict({
        "name": "ignored", "seed": 1, "load": {"concurrency": 2, "max_tokens": 32},
        "phases": [{"name": "p", "duration": "500ms"}],
        "safety": {"max_duration": "30s", "drain_timeout": "2s", "cleanup_window": "100ms"},
        "sla": [{"kind": "errors"}],
    })
    live = io.StringIO()
    with ThreadedMockServer(tick_s=0.001, **mock) as server:
        result = asyncio.run(make_runner(experiment, target_url=server.base_url, out_dir=tmp_path / "run",
                                         handle_signals=False, listeners=[ConsoleProgress(live)]).run())
    assert result.status == "completed", result.error
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    return report, render_summary(result, width=200), live.getvalue()


def test_a_run_against_a_server_ignoring_both_fields_says_so_on_its_console_and_in_report_json(tmp_path: Path) -> None:
    report, summary, live = _run(tmp_path, **IGNORING)
    engine = report["target"]["engine"]
    assert [i["field"] for i in engine["ignored_fields"]] == ["ignore_eos", "stream_options.include_usage"]
    assert engine["ignored_fields"][0]["evidence"] == "the preflight stream stopped at 7 of 32 tokens with " \
                                                      "finish_reason stop"
    assert any(a.startswith("early_close:") for a in engine["ignored_fields"][0]["affects"])
    assert any(a.startswith("integrity:") for a in engine["ignored_fields"][1]["affects"])
    assert engine["dropped_fields"] == {}
    assert "dropped from requests: nothing" in summary and NAMED in summary, summary
    assert "ignore_eos ignored changes: early_close, throughput" in summary
    assert "!! ignored by the server: ignore_eos (the preflight stream stopped at 7 of 32 tokens" in live, live


def test_a_run_against_the_default_mock_names_nothing(tmp_path: Path) -> None:
    report, summary, live = _run(tmp_path)
    assert report["target"]["engine"]["ignored_fields"] == []
    assert "ignored by the server" not in summary and "ignored by the server" not in live
