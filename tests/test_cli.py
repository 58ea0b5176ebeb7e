"""The `streamchaos` command line: exit codes, located errors, offline re-judging, no tracebacks."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from chaos.cli import main

SHORT = {
    "name": "cli-short",
    "target": {"kind": "builtin", "model": "tiny"},
    "load": {"concurrency": 2, "max_tokens": 8},
    # 3 s, not 1.5: two streams of 8 tokens share batches, so their TTFTs are correlated in send order;
    # under the soak's two hogs 1.5 s gave 63 of them, too few independent ones to bound a p50 (exit 3)
    "phases": [{"name": "steady", "duration": "3s"}],
    "sla": [{"kind": "ttft", "quantile": "p50", "budget": "2s"}, {"kind": "errors", "budget": "0%"}],
    "safety": {"cleanup_window": "300ms"},
}


def test_validate_reports_file_line_and_key_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nphases:\n  - name: p\n    duration: 5\n", encoding="utf-8")
    assert main(["validate", str(bad)]) == 2
    out = capsys.readouterr().out
    assert f"{bad}:4:15: phases[0].duration:" in out and "250ms" in out


def test_run_with_an_invalid_experiment_exits_2_without_traceback(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nphases: [{name: p, duration: 1s, faults: [{kind: network.latencyy}]}]\n", encoding="utf-8")
    assert main(["run", str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'network.latency'" in err and "Traceback" not in err


def test_unreachable_target_exits_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(SHORT), encoding="utf-8")
    assert main(["run", str(exp), "--target-url", f"http://127.0.0.1:{port}/v1", "--out", str(tmp_path / "run"),
                 "--quiet"]) == 4
    assert "did not answer" in capsys.readouterr().out + (tmp_path / "run" / "report.json").read_text()


def test_list_prints_both_catalogues(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "network.slicer" in out and "kv_cleanup" in out and "gpu.throttle" in out


@pytest.mark.timeout(120)
def test_verify_rejudges_a_finished_run_against_other_budgets(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    exp, run_dir = tmp_path / "exp.yaml", tmp_path / "run"
    exp.write_text(yaml.safe_dump(SHORT), encoding="utf-8")
    code = main(["run", str(exp), "--out", str(run_dir), "--quiet"])
    report = json.loads((run_dir / "report.json").read_text())
    assert code == 0, json.dumps([v for v in report["verdicts"] if not v["ok"]] or report.get("error"), indent=1)[:3000]
    assert {v["sla"] for v in report["verdicts"]} == {"ttft", "errors"} and report["status"] == "completed"
    assert main(["verify", str(run_dir)]) == 0  # same budgets: same outcome, from the journal alone
    strict = tmp_path / "strict.yaml"
    strict.write_text("sla:\n  - {kind: ttft, quantile: p50, budget: 1us}\n", encoding="utf-8")
    code = main(["verify", str(run_dir), "--sla", str(strict)])
    (rejudged,) = json.loads((run_dir / "verify.json").read_text())["verdicts"]
    # a fail, unless the run's own load generator was late enough to explain the whole ~20 ms: then the
    # tool says so (the soak's two hogs beside this test made its loop 31 ms late at p99)
    saturated = rejudged["evidence"].get("inconclusive_cause") == "load generator saturated"
    assert (code, rejudged["status"]) == ((3, "inconclusive") if saturated else (1, "fail")), rejudged["evidence"]
    assert main(["report", str(run_dir)]) == 0
    assert "cli-short" in capsys.readouterr().out


def test_a_used_run_directory_is_refused_and_left_as_it_was(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(SHORT), encoding="utf-8")
    used = tmp_path / "run"
    used.mkdir()
    previous = '{"type":"run","run_id":"a"}\n{"type":"end","status":"completed","run_id":"a"}\n'
    (used / "journal.jsonl").write_text(previous, encoding="utf-8")
    assert main(["run", str(exp), "--out", str(used), "--quiet"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (used / "journal.jsonl").read_text(encoding="utf-8") == previous  # nothing appended, nothing started
