"""Engines we did not write, end to end: a stack speaking `transformers serve`'s dialect, a request
the engine refuses, a target that dies mid-run, and an API key that must never be written down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from chaos.api import run
from chaos.experiment import experiment_from_dict
from chaos.output.replay import replay
from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]


def _experiment(name: str, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name, "seed": 3, "target": {"kind": "openai", "model": "tiny"},
        "load": {"concurrency": 2, "max_tokens": 16, "request_timeout": "20s"},
        "phases": [{"name": "steady", "duration": "3s"}],
        "sla": [{"kind": "early_close", "budget": "0%"}, {"kind": "errors", "budget": "0%"},
                {"kind": "kv_cleanup", "within": "2s"}],
        "safety": {"max_duration": "90s", "cleanup_window": "2500ms", "drain_timeout": "10s"},
    }
    body.update(overrides)
    return body


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chaos", *args], capture_output=True, text=True, timeout=150, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def test_an_engine_that_refuses_ignore_eos_and_sends_no_done_is_judged_right(planted: Any, tmp_path: Path) -> None:
    """Before engine profiles: every request got 422 (errors 100%), and with ignore_eos off every
    stream failed early_close for want of [DONE]. Now the preflight drops the field and names the
    engine, its end-of-stream rule applies, and kv_cleanup is unobservable (its profile serves no metrics,
    /metrics answers 404): said with its reason and tolerated, so the other verdicts decide the exit."""
    url = planted("hf_dialect")
    exp = experiment_from_dict(_experiment("hf-dialect"))
    result = run(exp, target_url=url, out_dir=tmp_path / "run", handle_signals=False)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    engine = report["target"]["engine"]
    assert engine["profile"] == "transformers-serve" and "Unexpected fields" in engine["detected_by"]
    assert list(engine["dropped_fields"]) == ["ignore_eos"] and engine["end_of_stream"]["done"] is False
    verdicts = {v.sla: v for v in result.verdicts}
    assert verdicts["early_close"].status == "pass", verdicts["early_close"].evidence
    assert verdicts["errors"].status == "pass", verdicts["errors"].evidence
    assert all(not s.done_seen for s in result.observations.population())  # really no [DONE] on the wire
    kv = verdicts["kv_cleanup"]
    assert kv.status == "unobservable" and kv.ok, kv.evidence
    assert kv.evidence["reason"].startswith("transformers serve exports no Prometheus metrics"), kv.evidence
    assert "metrics_url" not in kv.evidence["reason"]  # no endpoint elsewhere to point at
    assert result.exit_code == 0
    # `verify` re-judges by the rule the journal recorded, not a global one
    again = replay(exp, tmp_path / "run")
    assert {v.sla: v.status for v in again.verdicts}["early_close"] == "pass" and again.exit_code == 0


def test_a_profile_set_by_hand_that_wants_done_is_warned_about_at_the_preflight(planted: Any, tmp_path: Path) -> None:
    url = planted("hf_dialect")
    body = _experiment("forced", target={"kind": "openai", "model": "tiny", "engine": "openai"},
                       phases=[{"name": "steady", "duration": "1s"}], sla=[{"kind": "early_close", "budget": "0%"}])
    result = run(experiment_from_dict(body), target_url=url, out_dir=tmp_path / "run", handle_signals=False)
    preflight = result.observations.notes_on("preflight")[-1].data
    assert "no [DONE], which the openai profile requires" in preflight["warning"]
    assert list(preflight["dropped"]) == ["ignore_eos"]  # refused by the server, dropped all the same
    assert {v.sla: v.status for v in result.verdicts}["early_close"] == "fail"  # as warned: target.engine said so


def test_streams_far_longer_than_the_run_start_the_load_instead_of_exiting_4(tmp_path: Path) -> None:
    """Before: the preflight waited for its 20,000-token stream to end (~2 minutes on the tiny stack),
    hit request_timeout and the run exited 4 before any load. Now it judges the stream at its first
    events, hangs up on it, says so, and the load and its phase run."""
    body = _experiment("endless",
                       target={"kind": "builtin", "model": "tiny", "max_model_len": 24000, "kv_blocks": 2048},
                       load={"concurrency": 2, "max_tokens": 20000, "ignore_eos": True, "request_timeout": "20s"},
                       phases=[{"name": "steady", "duration": "2s"}],
                       sla=[{"kind": "ttft", "quantile": 0.99, "budget": "15s"}],
                       safety={"max_duration": "90s", "cleanup_window": "1s", "drain_timeout": "2s"})
    result = run(experiment_from_dict(body), out_dir=tmp_path / "run", handle_signals=False)
    assert result.exit_code != 4, result.error
    preflight = result.observations.notes_on("preflight")[-1].data
    assert preflight["cut"].startswith("stream cut by the preflight after") and preflight["content_events"] >= 1, \
        preflight
    assert preflight["finish_reason"] is None and "rule is assumed: a complete stream ends with" in preflight["warning"]
    streams = result.observations.population()
    assert streams and all(s.phase == "steady" for s in streams)
    assert any(s.t_first_content is not None for s in streams)  # the load streamed in its phase
    assert not any(s.complete for s in streams)  # they were as long as asked: none could end in the run
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["target"]["engine"]["end_of_stream_assumed"] == preflight["cut"]


def test_a_refused_request_stops_the_run_before_the_load_with_the_servers_words(tmp_path: Path) -> None:
    with StackProcess.start("--port", "0", "--max-model-len", "64") as stack:
        (tmp_path / "e.yaml").write_text(json.dumps(_experiment("refused", load={"concurrency": 2, "max_tokens": 200})))
        done = _cli("run", str(tmp_path / "e.yaml"), "--target-url", stack.base_url, "--out", str(tmp_path / "run"))
    assert done.returncode == 4, done.stdout + done.stderr
    text = done.stdout + done.stderr
    assert f"reaching target {stack.base_url} (remote)" in done.stderr and "starting target" not in done.stderr
    assert "refused the load's request at the preflight (HTTP 400" in text
    assert "max_model_len" in text or "max_tokens" in text  # the server's own explanation
    journal = [json.loads(line) for line in (tmp_path / "run" / "journal.jsonl").read_text().splitlines()]
    assert not [r for r in journal if r.get("type") == "stream"]  # no load was sent


def test_a_target_that_dies_mid_run_halts_it_with_the_top_errors(tmp_path: Path) -> None:
    stack = StackProcess.start("--port", "0")
    killer = threading.Timer(2.5, lambda: os.kill(stack.pid, signal.SIGKILL))
    try:
        exp = experiment_from_dict(_experiment("dies", phases=[{"name": "long", "duration": "60s"}],
                                               safety={"max_duration": "2m", "cleanup_window": "2500ms"}))
        killer.start()
        result = run(exp, target_url=stack.base_url, out_dir=tmp_path / "run", handle_signals=False)
    finally:
        killer.cancel()
        stack.close()
    assert result.status == "halted" and result.exit_code == 4, result.error
    assert "the target looks dead" in (result.error or "")
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    top = report["halt"]["top_errors"]
    # the clients back off on the refusals (load.connect_backoff): two of them try ~5 times each in the 10 s
    # without an answer that halts the run (halt.DEAD_QUIET_S), not one every 50 ms
    assert top and top[0]["message"].startswith("connect:") and top[0]["count"] >= 3, top
    assert report["errors"]["top"][0]["count"] >= top[0]["count"]
    assert result.ended - result.started < 30  # it did not fire failing requests for the whole 60s phase


def test_the_api_key_from_the_environment_is_never_written_down(tmp_path: Path) -> None:
    key, metrics_token = "sk-never-write-me-7f3a9c", "mt-never-write-me-41d2"
    exp = _experiment("key", target={"kind": "builtin", "model": "tiny", "api_key_env": "SC_TEST_KEY",
                                     "metrics_auth": "env:SC_TEST_METRICS"},
                      phases=[{"name": "steady", "duration": "1s"}], sla=[{"kind": "errors", "budget": "0%"}])
    (tmp_path / "e.yaml").write_text(json.dumps(exp))
    done = _cli("run", str(tmp_path / "e.yaml"), "--out", str(tmp_path / "run"),
                env={"SC_TEST_KEY": key, "SC_TEST_METRICS": metrics_token})
    assert done.returncode == 0, done.stdout + done.stderr
    for secret in (key, metrics_token):
        assert secret not in done.stdout + done.stderr
        for path in (tmp_path / "run").rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path
    facts = json.loads((tmp_path / "run" / "report.json").read_text())["environment"]["target"]["credentials"]
    assert facts == {"api_key": "env:SC_TEST_KEY", "metrics_auth": "env:SC_TEST_METRICS"}
    missing = _cli("run", str(tmp_path / "e.yaml"), "--out", str(tmp_path / "run2"))
    assert missing.returncode == 2 and "SC_TEST_KEY is not set" in missing.stderr
