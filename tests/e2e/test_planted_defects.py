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
    # Streams sent together are buffered alike, so in send order their TTFTs come in pairs and are
    # worth about half as many independent samples: 6 s of 200-token responses give ~20, worth ~10.
    exp = experiment(
        "planted-buffer", load={"concurrency": 2, "max_tokens": 200},
        phases=[{"name": "steady", "duration": "6s"}],
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


# varied lengths keep the 8 streams out of lockstep (a lockstep wave's TTFTs count as about one sample)
STALL_LOAD = {"concurrency": 8, "max_tokens": [40, 56]}
STALL_SLA = [
    {"kind": "ttft", "quantile": "p50", "budget": "500ms"},
    {"kind": "itl", "quantile": "p90", "budget": "100ms"},
    {"kind": "fluidity", "pace": "50ms", "ttft": "300ms", "min_on_time": "90%", "max_missed_run": 5},
    {"kind": "goodput", "ttft": "500ms", "tpot": "12ms", "min_share": "50%"},
]


def test_fluidity_tells_an_early_stall_from_a_late_one_and_goodput_catches_both(planted: Any, tmp_path: Path) -> None:
    """Every stream stalls 0.8 s once: at its 2nd content event, or at its 25th. 40 tokens arrive
    in 28 to 40 content events (a multibyte character waits for its last byte), so the late stall
    hits every stream too. The gap distribution is the same (one long gap in about 40), so the
    p90 gap passes both; fluidity fails the early stall, which no slack hides, and passes the
    late one, which 24 fast tokens' slack absorbs. goodput's TPOT objective (12 ms; the stall
    adds at least 14 ms per token) fails both while TTFT stays far under its budget."""
    outcomes = {}
    for where, at in (("early", 2), ("late", 25)):
        url = planted("stall", "--stall-at", str(at), "--stall-for", "0.8")
        exp = experiment(f"planted-stall-{where}", load=STALL_LOAD, phases=[{"name": "steady", "duration": "5s"}],
                         sla=STALL_SLA)
        result = run_dict(exp, url, tmp_path / where)
        outcomes[where] = verdicts_by_kind(result)
    early, late = outcomes["early"], outcomes["late"]
    for v in (early, late):
        # TTFT is not the problem (every one far under 500 ms); a start-up wave of 8 simultaneous
        # prefills can leave ~50 TTFTs worth too few independent samples to pass, never to fail
        assert v["ttft"].status != "fail", v["ttft"]
        assert v["ttft"].figure is not None and v["ttft"].figure < 0.5
        assert v["itl"].status == "pass", v["itl"]  # the p90 gap does not see a stall in one gap of 39
        assert v["goodput"].status == "fail", v["goodput"]
        assert v["goodput"].evidence["misses_by_reason"].get("tpot", 0) > 0
    assert early["fluidity"].status == "fail", early["fluidity"]
    assert early["fluidity"].evidence["longest_missed_run"] > 5
    assert late["fluidity"].status == "pass", late["fluidity"].evidence
    assert late["fluidity"].evidence["missed"] == 0


def test_goodput_fails_a_stack_whose_streams_never_complete(planted: Any, tmp_path: Path) -> None:
    url = planted("no_done")
    exp = experiment("planted-goodput", load={"concurrency": 2, "max_tokens": 16},
                     phases=[{"name": "steady", "duration": "2s"}],
                     sla=[{"kind": "ttft", "quantile": "p50", "budget": "1s"},
                          {"kind": "goodput", "ttft": "1s", "min_share": "90%"}])
    result = run_dict(exp, url, tmp_path)
    by_kind = verdicts_by_kind(result)
    assert by_kind["ttft"].status == "pass"  # every first token came in time
    assert by_kind["goodput"].status == "fail"
    assert by_kind["goodput"].figure == 0.0
    assert by_kind["goodput"].evidence["misses_by_reason"]["incomplete"] == by_kind["goodput"].samples
