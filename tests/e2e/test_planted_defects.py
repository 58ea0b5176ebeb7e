"""Each verifier catches the bug it exists for, end to end: a real stack with a planted defect,
real streaming load through the runner, and a `fail` verdict for the right SLA (exit code 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaos.runner import run

pytestmark = pytest.mark.timeout(180)


def experiment(name: str, *, load: dict[str, Any], phases: list[dict[str, Any]], sla: list[dict[str, Any]], cleanup: str = "2s") -> dict[str, Any]:
    return {
        "name": name, "seed": 3,
        "target": {"kind": "openai", "model": "tiny"},
        "load": {"request_timeout": "20s", **load},
        "phases": phases, "sla": sla,
        "safety": {"max_duration": "90s", "cleanup_window": cleanup, "drain_timeout": "10s"},
    }


def verdicts_by_kind(result: Any) -> dict[str, Any]:
    return {v.sla: v for v in result.verdicts}


def run_dict(exp: dict[str, Any], url: str, tmp_path: Path) -> Any:
    from chaos.experiment import experiment_from_dict

    return run(experiment_from_dict(exp), target_url=url, out_dir=tmp_path / "run", handle_signals=False)


LEAK_EXPERIMENT = experiment(
    "planted-leak",
    load={"concurrency": 6, "max_tokens": 600},
    phases=[{"name": "storm", "duration": "3s", "faults": [{"kind": "client.disconnect", "fraction": "100%", "after_tokens": 2}]}],
    sla=[{"kind": "kv_cleanup", "within": "1s"}],
    cleanup="2500ms",
)


def test_kv_leak_fails_kv_cleanup_through_the_cli(planted: Any, tmp_path: Path) -> None:
    url = planted("leak", "--max-num-seqs", "64")
    path = tmp_path / "leak.yaml"
    path.write_text(yaml.safe_dump(LEAK_EXPERIMENT), encoding="utf-8")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "chaos", "run", str(path), "--target-url", url, "--out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=150,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    kv = next(v for v in report["verdicts"] if v["sla"] == "kv_cleanup")
    assert kv["status"] == "fail", kv


def test_same_storm_on_the_real_stack_cleans_up(tmp_path: Path) -> None:
    """The control: the unmodified builtin stack passes the experiment the leaky one fails."""
    exp = dict(LEAK_EXPERIMENT, target={"kind": "builtin", "model": "tiny"})
    from chaos.experiment import experiment_from_dict

    result = run(experiment_from_dict(exp), out_dir=tmp_path / "run", handle_signals=False)
    assert verdicts_by_kind(result)["kv_cleanup"].status == "pass", result.verdicts


def test_buffering_server_fails_ttft(planted: Any, tmp_path: Path) -> None:
    url = planted("buffer")
    exp = experiment(
        "planted-buffer", load={"concurrency": 2, "max_tokens": 400},
        phases=[{"name": "steady", "duration": "4s"}],
        sla=[{"kind": "ttft", "quantile": "p50", "budget": "150ms"}],
    )
    result = run_dict(exp, url, tmp_path)
    ttft = verdicts_by_kind(result)["ttft"]
    assert ttft.status == "fail", ttft
    assert result.exit_code == 1


def test_missing_done_fails_early_close(planted: Any, tmp_path: Path) -> None:
    url = planted("no_done")
    exp = experiment("planted-no-done", load={"concurrency": 2, "max_tokens": 16},
                     phases=[{"name": "steady", "duration": "2s"}], sla=[{"kind": "early_close", "budget": "0%"}])
    result = run_dict(exp, url, tmp_path)
    assert verdicts_by_kind(result)["early_close"].status == "fail"
    assert result.exit_code == 1


def test_replacement_characters_fail_integrity(planted: Any, tmp_path: Path) -> None:
    url = planted("fffd")
    exp = experiment("planted-fffd", load={"concurrency": 2, "max_tokens": 16},
                     phases=[{"name": "steady", "duration": "2s"}], sla=[{"kind": "integrity"}])
    result = run_dict(exp, url, tmp_path)
    assert verdicts_by_kind(result)["integrity"].status == "fail"
    assert result.exit_code == 1
