"""`./scripts/test`'s closing summary names what failed: pytest's summary lists every failure and
error (and each skip with its reason), and a run with more failures than the rerun cap lists them
and says why they are not rerun. A FLAKY test (failed in the suite, passed alone) is forgiven once:
two in one run, or the same one in two consecutive runs, fail the suite; the closing line counts them.

The script runs for real on a planted folder of a few failing tests, in a copy of the scripts whose
`_env.sh` is empty (the environment is the one running this test), one pytest process, no xdist.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(180)

PLANTED = '''
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("planted fixture error")

def test_fails_first():
    assert 1 == 2, "planted failure one"

def test_fails_second():
    assert "a" == "b", "planted failure two"

def test_errors(broken):
    pass

@pytest.mark.skip(reason="planted skip")
def test_skipped():
    pass

def test_passes():
    pass
'''
# what tests/conftest.py does for the script: the failed node ids, one a line, in the file it names
CONFTEST = '''
import os
from pathlib import Path

_failed = []

def pytest_runtest_logreport(report):
    if report.failed and report.nodeid not in _failed:
        _failed.append(report.nodeid)

def pytest_sessionfinish(session):
    target = os.environ.get("STREAMCHAOS_TEST_FAILED_FILE")
    if target:
        Path(target).write_text("".join(f"{nodeid}\\n" for nodeid in _failed))
'''
FAILED = ("tests/test_planted.py::test_fails_first", "tests/test_planted.py::test_fails_second",
          "tests/test_planted.py::test_errors")


def _run(tmp_path: Path, rerun_cap: int, planted: str = PLANTED) -> tuple[int, str]:
    if not (tmp_path / "scripts").exists():
        (tmp_path / "scripts").mkdir()
        shutil.copy2(ROOT / "scripts" / "test", tmp_path / "scripts" / "test")
        (tmp_path / "scripts" / "_env.sh").write_text("# planted: the environment running this test is the one\n")
        (tmp_path / "tests").mkdir()
        (tmp_path / "tests" / "test_planted.py").write_text(planted)
        (tmp_path / "tests" / "conftest.py").write_text(CONFTEST)
        (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider -p no:randomly\n")
        (tmp_path / "state").mkdir()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "STREAMCHAOS_TEST_WORKERS": "0", "STREAMCHAOS_TEST_RERUN": str(rerun_cap),
           "PLANTED_STATE": str(tmp_path / "state")}
    env.pop("STREAMCHAOS_TEST_FAILED_FILE", None)
    done = subprocess.run([str(tmp_path / "scripts" / "test"), "tests"], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=150)
    return done.returncode, done.stdout  # stderr in its place: the closing line is the last one


def _summary_names(out: str, nodeid: str) -> bool:
    """pytest's short summary line for a failed or erroring test: ``FAILED nodeid - ...``/``ERROR nodeid - ...``."""
    return any(line.startswith((f"FAILED {nodeid}", f"ERROR {nodeid}")) for line in out.splitlines())


def test_the_closing_summary_names_every_failure_error_and_skip(tmp_path: Path) -> None:
    code, out = _run(tmp_path, rerun_cap=0)  # no rerun: pytest's own summary is all there is
    assert code == 1, out
    for nodeid in FAILED:
        assert _summary_names(out, nodeid), f"{nodeid} is not named in the summary:\n{out}"
    assert "planted skip" in out, out


def test_more_failures_than_the_cap_are_listed_and_the_why_said(tmp_path: Path) -> None:
    code, out = _run(tmp_path, rerun_cap=2)
    assert code == 1, out
    tail = out[out.index("not rerun"):]
    assert "3 failed, more than the 2 that are rerun at most (STREAMCHAOS_TEST_RERUN)" in out, out
    assert "a breakage, not a busy box" in out, out
    for nodeid in FAILED:
        assert f"  FAILED {nodeid}" in tail, f"{nodeid} is not listed after 'not rerun':\n{out}"


# Tests that fail every other time they run (a mark file in PLANTED_STATE flips): in the suite they
# fail, alone they pass, and in the next run's suite they fail again — an intermittent defect.
FLIPPING = '''
import os
from pathlib import Path

def _flip(name):
    mark = Path(os.environ["PLANTED_STATE"]) / name
    if mark.exists():
        mark.unlink()
    else:
        mark.write_text("failed once")
        raise AssertionError("planted: fails every other time")

def test_flips_one():
    _flip("one")

def test_steady():
    pass
'''
TWO_FLIPPING = FLIPPING + '''
def test_flips_two():
    _flip("two")
'''


def _closing(out: str) -> str:
    return [line for line in out.splitlines() if line.strip()][-1]


def test_two_flaky_tests_in_one_run_fail_the_suite(tmp_path: Path) -> None:
    code, out = _run(tmp_path, rerun_cap=8, planted=TWO_FLIPPING)
    assert code == 1, out
    assert "2 FLAKY" in _closing(out) and "more than one FLAKY" in _closing(out), out


def test_one_flaky_test_passes_once_and_fails_the_next_run_flaky_again(tmp_path: Path) -> None:
    code, out = _run(tmp_path, rerun_cap=8, planted=FLIPPING)
    assert code == 0, out  # one FLAKY, the first time: forgiven, and counted in the closing line
    assert "FLAKY (failed in the suite, passed alone): tests/test_planted.py::test_flips_one" in out, out
    assert "0 failed, 1 FLAKY" in _closing(out), out
    code, out = _run(tmp_path, rerun_cap=8, planted=FLIPPING)  # the same checkout: the state file survives
    assert code == 1, out
    assert "FLAKY TWICE (FLAKY in the last run too" in out and "test_flips_one" in out, out
    assert "1 FLAKY" in _closing(out) and "two consecutive runs" in _closing(out), out


def test_a_clean_run_clears_the_last_runs_flaky_list_and_says_0_flaky(tmp_path: Path) -> None:
    code, out = _run(tmp_path, rerun_cap=8, planted=FLIPPING)
    assert code == 0, out
    (tmp_path / "tests" / "test_planted.py").write_text("def test_passes():\n    pass\n")
    code, out = _run(tmp_path, rerun_cap=8)
    assert code == 0 and "0 FLAKY" in _closing(out), out
    assert (tmp_path / ".pytest_cache" / "streamchaos" / "flaky").read_text().strip() == "", out
