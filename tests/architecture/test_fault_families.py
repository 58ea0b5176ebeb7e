"""faults/ holds fault families and nothing else: every module but the shared helpers registers at
least one fault kind, and the helpers register none. A backend (a client of some service, a helper
process, an embedded server) belongs in a room of chaos/'s floor instead (docs/architecture.md)."""

from __future__ import annotations

import importlib
from pathlib import Path

import faults
from faults.base import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
# What the families share: the spec/Injection base and the registry (``base``), and the timing of a
# kill in its phase that ``process.kill`` and ``docker.kill`` both follow (``kill_schedule``).
HELPERS = {"faults.base", "faults.kill_schedule"}


def _modules() -> set[str]:
    return {f"faults.{p.stem}" for p in (ROOT / "faults").glob("*.py") if p.stem != "__init__"}


def test_faults_holds_modules_only_no_packages() -> None:
    folders = [p.name for p in (ROOT / "faults").iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert folders == [], "a package inside faults/ is not a fault family: give it a room of chaos/"


def test_every_module_of_faults_but_the_helpers_is_a_family() -> None:
    """Importing ``faults`` registers every family; a module without a kind is not one."""
    for name in _modules():
        importlib.import_module(name)  # a module faults/__init__.py forgets still shows up as kind-less
    families = {cls.__module__ for cls in REGISTRY.values()}
    assert HELPERS <= _modules(), "a helper named here is gone: update HELPERS and docs/architecture.md"
    assert _modules() - HELPERS <= families, "not a fault family (no @register): move it to a room of chaos/"
    assert not families & HELPERS, "a helper registers a kind: it is a family, not a helper"


def test_the_package_imports_every_family() -> None:
    """A family's kinds exist for experiments only when faults/__init__.py imports it."""
    imported = {name for name in dir(faults) if f"faults.{name}" in _modules() - HELPERS}
    assert {f"faults.{name}" for name in imported} == _modules() - HELPERS
