"""`report --history DIR`: runs of one experiment on one page — streaks, trends, regressions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_compare import quantile, report, share

from chaos.cli import main
from chaos.model.errors import UsageError
from chaos.output.reports.history import load_runs, regressions, render_history, streak


def make_history(root: Path, runs: list[dict[str, Any]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i, body in enumerate(runs):
        run = root / f"run-{i}"
        run.mkdir(parents=True)
        (run / "report.json").write_text(json.dumps(body))
    return root


def weekly(tmp_path: Path) -> Path:
    day = 86_400.0
    return make_history(tmp_path / "gamedays", [
        report(quantile(0.050, 0.045, 0.055), share(0, 100), start=1.7e9),
        report(quantile(0.052, 0.046, 0.058), share(0, 100), start=1.7e9 + 7 * day),
        report(quantile(0.051, 0.045, 0.057), share(0, 100), start=1.7e9 + 14 * day),
        report(quantile(0.300, 0.280, 0.320, status="pass"), share(30, 100, budget=0.0), start=1.7e9 + 21 * day),
    ])


def test_runs_load_oldest_first_and_streaks_count_back_from_the_newest(tmp_path: Path) -> None:
    runs = load_runs(weekly(tmp_path))
    assert [r.start for r in runs] == sorted(r.start for r in runs) and len(runs) == 4
    assert streak(runs, ("ttft", "steady")) == ("pass", 4)
    assert streak(runs, ("errors", "run")) == ("fail", 1)


def test_only_the_run_that_regressed_is_flagged(tmp_path: Path) -> None:
    runs = load_runs(weekly(tmp_path))
    transitions = regressions(runs)
    flagged = [(t.after.path.name, r.name) for t in transitions for r in t.rows if r.flagged]
    assert flagged == [("run-3", "ttft"), ("run-3", "errors")]


def test_the_page_has_a_trend_per_entry_with_a_point_per_run(tmp_path: Path) -> None:
    runs = load_runs(weekly(tmp_path))
    page = render_history(runs, regressions(runs))
    assert 'data-plot="trend-ttft-steady" data-points="4"' in page
    assert 'data-plot="trend-errors-run" data-points="4"' in page
    assert page.count('class="flagged"') == 2 and "<script" not in page


def test_runs_of_several_experiments_need_a_choice(tmp_path: Path) -> None:
    root = make_history(tmp_path / "mixed", [report(share(0, 1), name="a"), report(share(0, 1), name="b")])
    with pytest.raises(UsageError, match=r"several experiments \(a, b\); choose one with --experiment"):
        load_runs(root)
    assert [r.report["experiment"] for r in load_runs(root, "b")] == ["b"]
    with pytest.raises(UsageError, match="no run directory with a report.json"):
        load_runs(make_history(tmp_path / "empty", []))


def test_cli_history_exits_1_when_the_latest_run_regressed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = weekly(tmp_path)
    assert main(["report", "--history", str(root)]) == 1
    out = capsys.readouterr().out
    assert "4 runs" in out and "ttft [steady]: pass in the last 4 run(s)" in out and "2 flagged change(s)" in out
    assert (root / "history.html").is_file()
    assert main(["report", "--history", str(tmp_path / "nowhere")]) == 2


def _against(body: dict[str, Any], kind: str, url: str, model: str = "tiny") -> dict[str, Any]:
    return {**body, "target": {"kind": kind, "base_url": url, "metrics_url": None, "device": "cpu", "model": model,
                               "engine": {"profile": "builtin" if kind == "builtin" else "vllm"}}}


def two_targets(tmp_path: Path, *, last_regresses: bool = False) -> Path:
    """A game-day alternating between the builtin stack (a new loopback port each run, as a spawned stack
    gets) and a vLLM behind a fixed URL, whose TTFT is six times the builtin's: different targets, not a change."""
    day = 86_400.0
    runs = []
    for i in range(8):
        if i % 2 == 0:
            figure = 0.300 if last_regresses and i == 6 else 0.050
            runs.append(_against(report(quantile(figure, figure - 0.005, figure + 0.005), start=1.7e9 + i * day),
                                 "builtin", f"http://127.0.0.1:{40000 + i}/v1"))
        else:
            runs.append(_against(report(quantile(0.300, 0.280, 0.320), start=1.7e9 + i * day),
                                 "openai", "http://gpu-1:8000/v1", model="llama"))
    return make_history(tmp_path / "mixed-targets", runs)


def test_runs_against_different_targets_are_separate_series(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    runs = load_runs(two_targets(tmp_path))
    assert {r.target for r in runs} == {"builtin tiny on cpu, profile builtin",
                                        "openai http://gpu-1:8000/v1 llama on cpu, profile vllm"}
    transitions = regressions(runs)
    assert len(transitions) == 6  # 3 within each target's 4 runs; none across targets
    assert all(t.before.target == t.after.target for t in transitions)
    assert not [r for t in transitions for r in t.rows if r.flagged]  # alternating targets is no regression
    assert main(["report", "--history", str(tmp_path / "mixed-targets")]) == 0
    out = capsys.readouterr().out
    assert "against 2 targets" in out and "0 flagged change(s)" in out, out
    assert "target builtin tiny on cpu, profile builtin: 4 run(s)" in out, out
    page = (tmp_path / "mixed-targets" / "history.html").read_text(encoding="utf-8")
    assert 'data-plot="trend-0-ttft-steady" data-points="4"' in page
    assert 'data-plot="trend-1-ttft-steady" data-points="4"' in page


def test_a_regression_within_one_target_is_still_flagged_among_others(tmp_path: Path) -> None:
    runs = load_runs(two_targets(tmp_path, last_regresses=True))
    flagged = [(t.after.path.name, t.before.path.name) for t in regressions(runs) for r in t.rows if r.flagged]
    assert flagged == [("run-6", "run-4")]  # the builtin run against the builtin run before it
    assert main(["report", "--history", str(tmp_path / "mixed-targets")]) == 0  # the newest run (vLLM) held
