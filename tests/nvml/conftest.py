"""Fixtures for the fake NVML: the library is compiled once per session (skipped only without gcc)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fakenvml import build_fake_nvml, gcc


@pytest.fixture(scope="session")
def fake_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if gcc() is None:
        pytest.skip("gcc is not installed: the fake libnvidia-ml.so.1 cannot be built")
    return build_fake_nvml(tmp_path_factory.mktemp("fake-nvml"))
