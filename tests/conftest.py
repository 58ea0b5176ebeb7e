"""The slow tier, by folder: every test under one of these folders is marked ``slow`` here, and
nowhere else (``./scripts/test --quick`` deselects them). tests/README.md says why each is slow."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent
SLOW_FOLDERS = tuple(HERE / name for name in (
    "e2e",              # whole experiments, kills of real runs
    "containers",       # a real Docker daemon
    "thirdparty",       # nginx, HAProxy, transformers serve, LiteLLM
    "vllm",             # real vLLM
    "k8s/runs",         # whole runs against the fake API server
    "stack/processes",  # a stack process per case, or killed ones
    "reports/runs",     # real runs the report pages are made from
    "lint",             # mypy over the packages
    "install/light",    # a fresh virtualenv with the light install
))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        if any(folder in path.parents for folder in SLOW_FOLDERS):
            item.add_marker(pytest.mark.slow)


# The failed tests' node ids, written by the controlling process (not by xdist's workers) to the file
# STREAMCHAOS_TEST_FAILED_FILE names: ./scripts/test runs them once more, alone on the box, and says
# which passed the second time (FLAKY). A test that fails twice fails the suite.
FAILED_FILE_ENV = "STREAMCHAOS_TEST_FAILED_FILE"
_failed: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed and report.nodeid not in _failed:
        _failed.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    import os

    target = os.environ.get(FAILED_FILE_ENV)
    if target and not hasattr(session.config, "workerinput"):  # the controller sees every worker's reports
        Path(target).write_text("".join(f"{nodeid}\n" for nodeid in _failed))
