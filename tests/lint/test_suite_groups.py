"""./scripts/test's grouping (tests/conftest.py, ONE_WORKER): the tests of a group run on one xdist
worker, the others wherever a worker is free. xdist's own xdist_group marks silently stopped grouping
under pytest 9; this runs the real scheduler on a real module so a change like that fails here."""

from __future__ import annotations

import ast
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
    assert worker_group("tests/stack/processes/test_malformed_http.py::test_mutated") == "malformed-http"
    assert worker_group("tests/stack/processes/test_sigterm.py::test_sigterm") is None  # not the stack group
    assert worker_group("tests/test_units.py::test_format_duration") is None


def _shared_fixtures(source: str) -> set[str]:
    """The names of the module-, package- or session-scoped fixtures ``source`` defines."""
    return {node.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)
            for deco in node.decorator_list if isinstance(deco, ast.Call)
            for key in deco.keywords if key.arg == "scope"
            and isinstance(key.value, ast.Constant) and key.value.value in ("module", "package", "session")}


def _tests_asking_for(source: str, fixtures: set[str]) -> int:
    """How many tests of ``source`` take one of ``fixtures`` as an argument (a parametrized or hypothesis
    test counts as two: it is several tests)."""
    count = 0
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test") \
                and fixtures & {arg.arg for arg in node.args.args}:
            marks = " ".join(ast.unparse(deco) for deco in node.decorator_list)
            several = "parametrize" in marks or "given" in marks
            count += 2 if several else 1
    return count


def test_a_module_whose_tests_share_a_module_fixture_runs_on_one_worker() -> None:
    """Spread over three workers, such a module built its server, library or runs once on each: the
    report probes' three runs took 31 s of setup on each of three workers in CI. A module whose tests
    share a module- or session-scoped fixture (its own, or a conftest's above it) is named in ONE_WORKER."""
    missing = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        fixtures = _shared_fixtures(path.read_text(encoding="utf-8"))
        for folder in path.relative_to(ROOT).parents:
            if (ROOT / folder / "conftest.py").is_file():
                fixtures |= _shared_fixtures((ROOT / folder / "conftest.py").read_text(encoding="utf-8"))
        nodeid = f"{path.relative_to(ROOT).as_posix()}::test"
        if _tests_asking_for(path.read_text(encoding="utf-8"), fixtures) >= 2 and worker_group(nodeid) is None:
            missing.append(nodeid.removesuffix("::test"))
    assert missing == [], f"add these to ONE_WORKER in tests/conftest.py: {missing}"


def test_the_shared_fixture_finder_sees_a_module_fixture_and_its_tests() -> None:
    source = ('import pytest\n@pytest.fixture(scope="module")\ndef server(): ...\n'
              '@pytest.fixture\ndef each(): ...\n'
              'def test_a(server): ...\ndef test_b(server, each): ...\ndef test_c(each): ...\n')
    assert _shared_fixtures(source) == {"server"}
    assert _tests_asking_for(source, {"server"}) == 2
    assert _tests_asking_for(source, {"each"}) == 2 and _tests_asking_for(source, set()) == 0


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
