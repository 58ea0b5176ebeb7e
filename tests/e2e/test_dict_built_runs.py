"""A run of an experiment built from a dict (``chaos_run({...})``, ``chaos.api.run``) keeps an
experiment.yaml as a file-built one does, so ``streamchaos verify`` re-judges it to the same verdicts
and ``streamchaos budgets`` reads it. A whole run: the slow tier (the quick tier keeps one CLI run,
tests/test_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos.cli import main
from tests.test_cli import SHORT


@pytest.mark.timeout(120)
def test_a_run_of_an_experiment_built_from_a_dict_is_verified_and_budgeted(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`chaos_run({...})` and tests build experiments from dicts: their runs keep an experiment.yaml
    too, so `verify` re-judges them (to the same verdicts) and `budgets` reads them."""
    from chaos.api import run
    from chaos.experiment import experiment_from_dict

    run_dir = tmp_path / "run"
    result = run(experiment_from_dict(dict(SHORT, name="cli-dict")), out_dir=run_dir, handle_signals=False)
    assert result.status == "completed", result.error
    assert main(["verify", str(run_dir)]) == result.exit_code
    rejudged = json.loads((run_dir / "verify.json").read_text())["verdicts"]
    assert [(v["sla"], v["phase"], v["status"], v["figure"]) for v in rejudged] == [
        (v.sla, v.phase, v.status, v.figure) for v in result.verdicts]
    assert main(["budgets", str(run_dir)]) == 0
    assert "ttft" in capsys.readouterr().out
