"""The console says why: under every failed or inconclusive verdict's row, `streamchaos run` and
`streamchaos report RUN_DIR` print the verifier's reason (the words report.html's "why" column shows),
wrapped to the terminal; a pass gets no line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import chaos.api
from chaos.cli import main
from chaos.execution.result import Result
from chaos.experiment import experiment_from_dict
from chaos.model.observations import Observations
from chaos.model.verdict import Verdict
from chaos.output.render import verdict_table
from chaos.output.report import write_reports
from chaos.output.reports.verdicts import why_text as html_why

BUFFERED = ("your responses are being buffered by something in the path: 88 of 88 streams got their first token "
            "together with 100% of their content (median), after 98% of the stream's time, 12.0 content events "
            "per read; nginx is in the path (Server: nginx/1.22.1): set proxy_buffering off")
UNDECIDED = "40 samples cannot bound the p90 from the upper side at 95% confidence; at least 45 are needed"

VERDICTS = [
    Verdict("streaming", "steady", "fail", 1.0, 0.1, "fraction", 88, {"reason": BUFFERED}),
    Verdict("ttft", "steady", "inconclusive", 0.2, 0.25, "s", 40, {"quantile": 0.9, "reason": UNDECIDED}),
    Verdict("errors", "steady", "pass", 0.0, 0.0, "fraction", 88, {"reason": "a pass says nothing here"}),
    # no words from the verifier: its interval against the budget is the why
    Verdict("itl", "steady", "fail", 0.09, 0.05, "s", 900,
            {"quantile": 0.99, "confidence": 0.95, "lower": 0.08, "upper": 0.1}),
]
EXPERIMENT = "name: why\nphases:\n  - {name: steady, duration: 1s}\n"


def _flat(text: str) -> str:
    """The console's wrapped lines joined back into one, for comparing with the whole reason."""
    return " ".join(line.strip().removeprefix("why:").strip() for line in text.splitlines())


def _rows(lines: list[str]) -> dict[str, int]:
    return {line.split()[1]: i for i, line in enumerate(lines) if line.lstrip().startswith(("!! ", "ok "))}


def test_each_failed_or_inconclusive_row_has_its_why_under_it_and_a_pass_none() -> None:
    lines = verdict_table(VERDICTS, width=80)
    rows = _rows(lines)
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[rows["streaming"] + 1].startswith("   why: your responses are being buffered"), lines
    assert "proxy_buffering off" in _flat("\n".join(lines[rows["streaming"] + 1:rows["ttft"]]))
    assert lines[rows["ttft"] + 1].startswith("   why: 40 samples cannot bound the p90"), lines
    assert rows["itl"] == rows["errors"] + 1, "a pass has no why line"
    assert "a pass says nothing" not in "\n".join(lines)
    assert _flat("\n".join(lines[rows["itl"] + 1:])) == \
        "the 95% interval [80.0ms, 100.0ms] of the p99 does not contain the budget 50.0ms"


def test_the_console_and_the_page_give_the_same_why() -> None:
    for v in VERDICTS[:2]:
        assert html_why(v.to_dict()) in _flat("\n".join(verdict_table([v], width=400)))


def _result(out: Path) -> Result:
    return Result(experiment=experiment_from_dict({"name": "why", "phases": [{"name": "steady", "duration": "1s"}]}),
                  verdicts=list(VERDICTS), observations=Observations(experiment="why"), out_dir=out,
                  status="completed", exit_code=1, started=1.7e9, ended=1.7e9 + 1)


def test_run_prints_the_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "why.yaml").write_text(EXPERIMENT, encoding="utf-8")

    def finished(*_: Any, **__: Any) -> Result:  # the run's outcome, without starting anything
        return _result(tmp_path / "run")

    monkeypatch.setattr(chaos.api, "run", finished)
    assert main(["run", str(tmp_path / "why.yaml"), "--target-url", "http://127.0.0.1:9", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "why: your responses are being buffered" in out and "why: 40 samples cannot bound" in out, out
    assert out.count("   why: ") == 3, out


def test_report_run_dir_prints_the_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "run"
    out_dir.mkdir(mode=0o700)
    write_reports(_result(out_dir))
    assert main(["report", str(out_dir)]) == 1
    out = capsys.readouterr().out
    assert "why: your responses are being buffered" in out and "why: 40 samples cannot bound" in out, out
    assert out.count("   why: ") == 3, out
