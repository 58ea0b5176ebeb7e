"""The rooms' import contracts (pyproject.toml's [tool.importlinter]) hold, type-only imports
counted; a planted violation breaks them; and outside the embedded Toxiproxy there is no import
circle at all, within a room or across rooms."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("chaos", "sla", "faults")

pytestmark = pytest.mark.timeout(180)


def _lint(root: Path) -> tuple[int, str]:
    """lint-imports on the packages under ``root``: its exit code and its report, colours removed."""
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                         timeout=150)
    return out.returncode, re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)


def test_the_contracts_are_kept() -> None:
    code, report = _lint(ROOT)
    assert code == 0, report
    assert "3 kept, 0 broken" in report, report


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The three packages and pyproject.toml copied where a planted import can go."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


@pytest.mark.parametrize("module, planted, contract", [
    # a type-only import counts: the model may not name the runner even for a hint
    ("chaos/model/units.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from chaos.execution.runner import Runner\n",
     "The rooms, top to bottom"),
    ("chaos/execution/runner.py", "from chaos.output.report import ReportWriter as _W\n", "The rooms, top to bottom"),
    ("chaos/load/client.py", "import chaos.k8s.pods as _p\n", "The rooms, top to bottom"),  # siblings are independent
    ("chaos/stack/serve.py", "import sla.ttft as _t\n", "The builtin stack imports only"),
    ("faults/toxiproxy_server/api.py", "import faults.base as _b\n", "The embedded Toxiproxy is a product of its own"),
])
def test_a_planted_violation_breaks_its_contract(copy: Path, module: str, planted: str, contract: str) -> None:
    path = copy / module
    path.write_text(path.read_text(encoding="utf-8") + "\n" + planted, encoding="utf-8")
    code, report = _lint(copy)
    assert code != 0, report
    broken = [line for line in report.splitlines() if line.rstrip().endswith("BROKEN")]
    assert any(line.startswith(contract) for line in broken), report
    assert module.removesuffix(".py").replace("/", ".") in report, report  # the report names the importer


def test_the_toxiproxy_contract_forbids_every_other_fault_module() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    forbidden = next(c for c in config["contracts"] if c["id"] == "toxiproxy")["forbidden_modules"]
    others = {f"faults.{p.stem}" for p in (ROOT / "faults").glob("*.py") if p.stem != "__init__"}
    assert set(forbidden) == {"chaos", "sla"} | others


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_import_circle_outside_the_embedded_toxiproxy() -> None:
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, exclude_type_checking_imports=False)
    circles = [c for c in _cycles(graph) if not all(m.startswith("faults.toxiproxy_server.") for m in c)]
    assert circles == []


def test_the_architecture_page_shows_the_contracts_as_they_are() -> None:
    out = subprocess.run([sys.executable, "scripts/update_readme.py", "--check"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
