"""Typing as a guard: mypy passes on the whole package, strictly where every layer depends on the types."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mypy_is_clean(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "chaos", "faults", "sla"],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_the_strict_modules_are_configured_strict() -> None:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    strict = [o for o in config["tool"]["mypy"].get("overrides", []) if o.get("disallow_untyped_defs")]
    modules = {m for o in strict for m in o["module"]}
    assert {"chaos.observations", "chaos.context", "chaos.experiment.model", "sla.*"} <= modules
    assert all(o.get("disallow_any_generics") and o.get("warn_return_any") for o in strict)
