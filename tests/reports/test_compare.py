"""`report --compare`: both figures, the change, and significance by the verdicts' own statistics;
regressions flagged, noise and improvements not. Pure functions on report dicts, then the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaos.cli import main
from chaos.output.reports.compare import compare_reports, compare_table, significance
from sla.base import Verdict


def quantile(figure: float, lower: float | None, upper: float | None, *, status: str = "pass", name: str = "ttft",
             phase: str | None = "steady", budget: float = 1.0, expect: str = "pass") -> dict[str, Any]:
    evidence = {"quantile": 0.5, "confidence": 0.95, "lower": lower, "upper": upper}
    v = Verdict("ttft", phase, status, figure, budget, "s", 100, evidence, expect=expect,  # type: ignore[arg-type]
                name=name)
    return v.to_dict()


def share(failed: int, streams: int, *, budget: float = 0.5) -> dict[str, Any]:
    status = "pass" if failed / streams <= budget else "fail"
    return Verdict("errors", None, status, failed / streams, budget, "fraction", streams,  # type: ignore[arg-type]
                   {"streams": streams, "failed": failed}).to_dict()


def report(*verdicts: dict[str, Any], name: str = "probe", start: float = 1.7e9) -> dict[str, Any]:
    return {"experiment": name, "status": "completed", "exit_code": 0, "start": start, "load": {"streams": 100},
            "verdicts": list(verdicts)}


def test_disjoint_intervals_of_a_quantile_flag_a_regression() -> None:
    rows = compare_reports(report(quantile(0.05, 0.045, 0.055)), report(quantile(0.25, 0.24, 0.27)))
    (row,) = rows
    assert row.significant is True and row.worse is True and row.flagged
    assert row.change == pytest.approx(0.20) and row.relative == pytest.approx(4.0)
    assert "intervals of the p50 disjoint" in row.test


def test_overlapping_intervals_are_not_significant() -> None:
    (row,) = compare_reports(report(quantile(0.05, 0.045, 0.060)), report(quantile(0.056, 0.050, 0.065)))
    assert row.significant is False and not row.flagged


def test_an_improvement_is_significant_but_not_flagged() -> None:
    (row,) = compare_reports(report(quantile(0.25, 0.24, 0.27)), report(quantile(0.05, 0.045, 0.055)))
    assert row.significant is True and row.worse is False and not row.flagged


def test_a_missing_bound_is_said_not_guessed() -> None:
    (row,) = compare_reports(report(quantile(0.05, None, None, status="inconclusive")),
                             report(quantile(0.5, None, None, status="inconclusive")))
    assert row.significant is None and "too few samples" in row.test and not row.flagged


def test_a_small_significant_change_is_below_min_change() -> None:
    a, b = report(quantile(1.00, 0.99, 1.01)), report(quantile(1.05, 1.04, 1.06))
    assert not compare_reports(a, b, min_change=0.10)[0].flagged
    assert compare_reports(a, b, min_change=0.01)[0].flagged


def test_shares_are_compared_with_fishers_exact_test() -> None:
    test, significant = significance(share(0, 200), share(40, 200))
    assert significant is True and test.startswith("Fisher exact on 0/200 vs 40/200")
    test, significant = significance(share(1, 200), share(2, 200))
    assert significant is False


def test_a_floor_getting_lower_is_worse() -> None:
    a = Verdict("throughput", None, "pass", 400.0, 100.0, "tokens/s", 50, {}).to_dict()
    b = Verdict("throughput", None, "pass", 200.0, 100.0, "tokens/s", 50, {}).to_dict()
    (row,) = compare_reports(report(a), report(b))
    assert row.worse is True and row.significant is None and not row.flagged  # no test claimed for a rate


def test_a_verdict_that_is_no_longer_as_expected_is_flagged() -> None:
    (row,) = compare_reports(report(share(0, 100)), report(share(60, 100)))
    assert row.flag == "verdict: pass → fail"


def test_an_expect_fail_entry_getting_worse_is_no_regression() -> None:
    a = quantile(0.5, 0.45, 0.55, status="fail", expect="fail", budget=0.1)
    b = quantile(0.9, 0.85, 0.95, status="fail", expect="fail", budget=0.1)
    (row,) = compare_reports(report(a), report(b))
    assert row.significant is True and not row.flagged


def test_rows_judged_in_one_run_only_are_shown_not_flagged() -> None:
    rows = compare_reports(report(share(0, 100)), report(share(0, 100), quantile(0.3, 0.2, 0.4, name="itl")))
    assert [r.name for r in rows] == ["errors", "itl"]
    assert rows[1].a is None and rows[1].significant is None and not rows[1].flagged
    lines = compare_table(rows)
    assert lines[2].split()[0] == "errors" and "not judged in both runs" in lines[3]


def write_run(root: Path, name: str, body: dict[str, Any]) -> Path:
    run = root / name
    run.mkdir()
    (run / "report.json").write_text(json.dumps(body))
    return run


def test_cli_prints_the_table_writes_the_page_and_exits_1_on_a_regression(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    a = write_run(tmp_path, "a", report(quantile(0.05, 0.045, 0.055)))
    b = write_run(tmp_path, "b", report(quantile(0.25, 0.24, 0.27)))
    assert main(["report", "--compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "!!" in out and "regression: significantly worse" in out and "1 flagged" in out
    page = (b / "compare.html").read_text()
    assert 'class="flagged"' in page and 'data-plot="compare"' in page and "<script" not in page
    assert main(["report", "--compare", str(a), str(a), "--html", str(tmp_path / "same.html")]) == 0
    assert "nothing flagged" in capsys.readouterr().out


def test_cli_says_what_is_wrong_with_a_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_run(tmp_path, "a", report(share(0, 10)))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "report.json").write_text("{not json")
    assert main(["report", "--compare", str(a), str(tmp_path / "missing")]) == 2
    # the one message report, verify and rollback give
    assert "missing: no such run directory" in capsys.readouterr().err
    assert main(["report", "--compare", str(a), str(bad)]) == 2
    assert "not a readable report.json" in capsys.readouterr().err
    assert main(["report", "--compare", str(a), str(a), "--min-change", "lots"]) == 2


def test_a_few_milliseconds_are_below_min_delay_whatever_the_ratio() -> None:
    # a healthy stack's TTFT p50 between two CI runs on a busy 2-core box: 9.9 -> 14.3 ms, disjoint intervals
    a, b = report(quantile(0.0099, 0.0090, 0.0110)), report(quantile(0.0143, 0.0130, 0.0160))
    (row,) = compare_reports(a, b, min_change=0.25)
    assert row.significant is True and row.worse is True and row.relative > 0.25 and not row.flagged
    (strict,) = compare_reports(a, b, min_change=0.25, min_delay=0.0)
    assert strict.flagged  # the floor, not the test, kept it unflagged
    (slowed,) = compare_reports(a, report(quantile(0.0495, 0.045, 0.055)), min_change=0.25)
    assert slowed.flagged  # the planted +400% is 40 ms
