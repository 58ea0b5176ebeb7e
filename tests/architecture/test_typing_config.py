"""mypy runs strictly where every layer depends on the types (mypy itself runs in tests/lint)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_strict_modules_are_configured_strict() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    strict = [o for o in config["tool"]["mypy"].get("overrides", []) if o.get("disallow_untyped_defs")]
    modules = {m for o in strict for m in o["module"]}
    assert {"chaos.model.observations", "chaos.model.context", "chaos.model.experiment", "sla.*"} <= modules
    assert all(o.get("disallow_any_generics") and o.get("warn_return_any") for o in strict)
