"""Typing as a guard: mypy passes, strict (pyproject.toml's ``strict = true``), on every package (the
configuration it runs with is checked in tests/architecture/test_typing_config.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_mypy_is_clean(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "chaos", "faults", "sla"],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
