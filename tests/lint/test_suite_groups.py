"""./scripts/test's grouping (tests/conftest.py, ONE_WORKER): the tests of a group run on one xdist
worker, the others wherever a worker is free. xdist's own xdist_group marks silently stopped grouping
under pytest 9; this runs the real scheduler on a real module so a change like that fails here."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.conftest import worker_group

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_names_each_grouped_module_and_nothing_else() -> None:
    assert worker_group("tests/vllm/test_vllm_target.py::test_a_runner_killed") == "vllm"
    assert worker_group("tests/e2e/test_budgets_real.py::test_budgets") == "vllm"
    assert worker_group("tests/stack/test_admin.py::test_bad_admin_bodies_are_400[PUT-/x-{]") == "stack"
    assert worker_group("tests/stack/processes/test_malformed_http.py::test_mutated") is None
    assert worker_group("tests/test_units.py::test_format_duration") is None


def test_a_grouped_module_runs_on_one_worker_and_the_rest_spreads() -> None:
    grouped, spread = "tests/toxiproxy/test_hardening.py", "tests/test_units.py"
    done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup", "-p", "no:randomly",
                           grouped, spread, "-k", "listens or rates or format"],
                          cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, nodeid in re.findall(r"^\[(gw\d+)\] \[\s*\d+%\] PASSED (\S+)", done.stdout, re.M):
        workers[nodeid.split("::")[0]].add(worker)
    assert len(workers[grouped]) == 1, dict(workers)
    assert workers[spread], dict(workers)
