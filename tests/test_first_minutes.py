"""What a newcomer hits in the first minutes: `--version`, `list experiments`, one exit code (2,
usage) for a run folder that is missing or is not one, across `report`, `verify`, `rollback`;
the README's test command names failures, errors and skips; a python3 too old gets a next step; the
venv check imports nothing heavy."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.cli import main
from chaos.execution.shipped import experiments_dir

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent


def test_version_prints_the_distribution_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert re.fullmatch(r"streamchaos \d+\.\d+\.\d+\S*( \(not installed\))?\n", capsys.readouterr().out)


def test_list_experiments_names_every_shipped_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "experiments"]) == 0
    out = capsys.readouterr().out
    shipped = sorted(p.name for p in experiments_dir().glob("*.yaml"))
    assert shipped and all(f"  {name}  (" in out for name in shipped), out
    assert "DOES NOT VALIDATE" not in out
    assert "smoke.yaml  (smoke; " in out and "run one: streamchaos run experiments/<file>" in out


@pytest.mark.parametrize("command", [["report"], ["verify"], ["rollback"], ["report", "--as", "vllm-bench"]])
def test_a_missing_or_foreign_run_folder_is_a_usage_error_everywhere(command: list[str], tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    assert main([*command, str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"streamchaos: {missing}: no such run directory" in err and "Traceback" not in err
    assert main([*command, str(tmp_path)]) == 2  # a folder, but no run's
    assert f"{tmp_path} is not a finished run directory (no " in capsys.readouterr().err


def test_the_readme_test_command_lists_failures_errors_and_skips_with_their_reasons() -> None:
    script = (ROOT / "scripts" / "test").read_text(encoding="utf-8")
    assert re.search(r"^args=\(-rfEs ", script, re.M), script  # tests/test_test_script.py runs it


def test_a_python_too_old_for_the_locked_set_gets_a_next_step(tmp_path: Path) -> None:
    """Debian 12's python3 is 3.11.2: `./scripts/try` stops before pip (exit 4), says which version it
    needs and how to make a .venv with one; the README states the same minimum."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # a python3 that is 3.11.2: `-V` says so, every check (find_spec, the version test) fails as there
    (bin_dir / "python3").write_text('#!/bin/sh\n[ "$1" = "-V" ] && echo "Python 3.11.2" && exit 0\nexit 1\n',
                                     encoding="utf-8")
    (bin_dir / "python3").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run(["bash", "-c", f"source {ROOT / 'scripts' / '_env.sh'}"], cwd=work, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert done.returncode == 4, done.stderr
    assert not (work / ".venv").exists(), done.stderr
    assert "needs Python 3.11.5 or newer" in done.stderr and "python3 here is Python 3.11.2" in done.stderr
    assert "uv venv --seed --python '>=3.11.5,<3.12' .venv" in done.stderr, done.stderr  # the next step
    assert "-m venv .venv" in done.stderr and "run this again" in done.stderr, done.stderr
    minimum = re.search(r"sys\.version_info < \((\d+), (\d+), (\d+)\)", (ROOT / "scripts" / "_env.sh").read_text())
    assert minimum is not None
    assert f"Python {'.'.join(minimum.groups())} or newer" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_venv_check_looks_modules_up_without_importing_them(tmp_path: Path) -> None:
    fake = tmp_path / "site"
    (fake / "torch").mkdir(parents=True)
    marker = tmp_path / "torch-was-imported"
    (fake / "torch" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n", encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n', encoding="utf-8")  # this venv's python
    (bin_dir / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": f"{ROOT}:{fake}",
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}  # were the check to fail, no install may reach anything
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run(["bash", "-c", f"source {ROOT / 'scripts' / '_env.sh'} && command -v python3"], cwd=work,
                          env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert not (work / ".venv").exists(), done.stderr  # the environment was found good
    assert done.stdout.strip() == str(bin_dir / "python3")
    assert not marker.exists(), "the check imported torch"
