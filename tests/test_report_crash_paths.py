"""Report crash paths (issue 23.6): `$…$` names are text, one listener's failure costs the others
nothing, and junit.xml holds only characters XML allows."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from chaos.execution.events import EventBus
from chaos.execution.result import Result
from chaos.experiment import experiment_from_dict
from chaos.model.observations import Observations
from chaos.output.report import write_reports
from chaos.output.reports.plot import Window, decorate_time_axes, new_figure, to_svg

pytestmark = pytest.mark.timeout(60)


def test_phase_and_fault_names_with_dollars_are_drawn_as_text() -> None:
    fig, axes = new_figure(6, 2, rows=2, sharex=True)
    names = ["$x^$", r"$\frac{$", "cost $5 $"]
    decorate_time_axes(axes, [Window(n, i, i + 1) for i, n in enumerate(names)], [Window("$_$", 0.5, 1.5)], 4.0)
    axes[0].plot([0, 1], [0, 1], label="$\\sqrt{")
    axes[0].legend()
    svg = to_svg(fig, label="t")  # mathtext would raise ValueError on each of these
    assert "$x^$" in svg and "cost $5 $" in svg


class _Raises:
    def on_event(self, event: Any) -> None:
        raise RuntimeError("a listener's bug")


class _Keeps:
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def on_event(self, event: Any) -> None:
        self.seen.append(event)


def test_one_listeners_exception_does_not_stop_the_others() -> None:
    keeps = _Keeps()
    bus = EventBus([_Raises(), keeps])
    with pytest.raises(RuntimeError, match="a listener's bug"):
        bus.emit("event")
    assert keeps.seen == ["event"]  # heard it although the one before it raised


def test_junit_holds_no_xml_invalid_character_and_a_failing_page_costs_no_other_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    out.mkdir(mode=0o700)
    exp = experiment_from_dict({"name": "x\x1b[31m", "phases": [{"name": "p", "duration": "1s"}]})
    result = Result(experiment=exp, verdicts=[], observations=Observations(experiment="x"), out_dir=out,
                    status="failed", exit_code=4, started=0.0, ended=1.0,
                    error="server said \x00\x01\x1b[2J\ud800\ufffe and stopped")
    import chaos.output.reports.page

    def broken(*_: Any) -> str:
        raise ValueError("the html page failed")

    monkeypatch.setattr(chaos.output.reports.page, "render_html", broken)
    with pytest.raises(ValueError, match="html page failed"):
        write_reports(result)
    root = ET.fromstring((out / "junit.xml").read_bytes())  # parses: nothing XML 1.0 forbids
    assert root.find("testcase/error").text == "server said [2J and stopped"  # type: ignore[union-attr]
    assert (out / "report.json").is_file() and not (out / "report.html").exists()


@pytest.mark.timeout(120)
def test_a_report_file_that_cannot_be_written_is_a_located_error_not_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41.6: report.json's name taken in the run directory (before: a FileExistsError traceback)
    gives one line naming the file and why, exit 4; the other report files are still written."""
    import socket

    import yaml

    import chaos.execution.runner as runner
    from chaos.cli import main

    with socket.socket() as s:  # a port nobody listens on: the run fails fast but writes its files
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"name": "taken", "target": {"kind": "builtin", "model": "tiny"},
                                   "phases": [{"name": "p", "duration": "500ms"}]}), encoding="utf-8")
    keep = runner.save_experiment

    def save_and_take_the_name(experiment: Any, out_dir: Path) -> None:
        keep(experiment, out_dir)
        (out_dir / "report.json").write_text("taken\n", encoding="utf-8")

    monkeypatch.setattr(runner, "save_experiment", save_and_take_the_name)
    out = tmp_path / "run"
    assert main(["run", str(exp), "--target-url", dead, "--out", str(out), "--quiet"]) == 4
    err = capsys.readouterr().err
    assert "Traceback" not in err and "FileExistsError" not in err
    assert f"streamchaos: could not write {out / 'report.json'}: something is already there" in err, err
    assert (out / "report.json").read_text() == "taken\n"
    assert (out / "report.html").is_file() and (out / "junit.xml").is_file()
