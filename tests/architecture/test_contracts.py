"""The rooms' import contracts (pyproject.toml's [tool.importlinter]) hold, type-only imports
counted; a planted violation breaks them; the forbidden lists are whole (a new room of chaos/ is
either in the floor or forbidden to faults/ and sla/); and outside the embedded Toxiproxy there is
no import circle at all, within a room or across rooms."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("chaos", "sla", "faults")
# The floor of chaos/: the rooms a fault family or a verifier may import (docs/architecture.md).
FLOOR = {"chaos.model", "chaos.host", "chaos.admin", "chaos.docker", "chaos.gpu", "chaos.hops", "chaos.k8s",
         "chaos.toxiproxy"}

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
    assert "6 kept, 0 broken" in report, report


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
    # the floor's backends are siblings: independent of each other
    ("chaos/k8s/pods.py", "import chaos.docker.containers as _c\n", "The rooms, top to bottom"),
    ("chaos/stack/serve.py", "import sla.ttft as _t\n", "The builtin stack imports only"),
    ("chaos/toxiproxy/server/api.py", "import chaos.model.errors as _e\n",
     "The embedded Toxiproxy is a product of its own"),
    # the layers allow both (faults sits above the load generator, sla above the stack); the floor does not
    ("faults/network.py", "import chaos.load.generator as _g\n", "Fault families stand on the floor"),
    ("sla/ttft.py", "import chaos.stack.metrics as _m\n", "Verifiers stand on the floor"),
])
def test_a_planted_violation_breaks_its_contract(copy: Path, module: str, planted: str, contract: str) -> None:
    path = copy / module
    path.write_text(path.read_text(encoding="utf-8") + "\n" + planted, encoding="utf-8")
    code, report = _lint(copy)
    assert code != 0, report
    broken = [line for line in report.splitlines() if line.rstrip().endswith("BROKEN")]
    assert any(line.startswith(contract) for line in broken), report
    assert module.removesuffix(".py").replace("/", ".") in report, report  # the report names the importer


def _contracts() -> list[dict[str, Any]]:
    contracts: list[dict[str, Any]] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))[
        "tool"]["importlinter"]["contracts"]
    return contracts


def _forbidden(contract_id: str) -> set[str]:
    return set(next(c for c in _contracts() if c["id"] == contract_id)["forbidden_modules"])


def _members(package: str) -> set[str]:
    """The modules and subpackages directly inside ``package`` (a dotted name), ``__init__`` left out."""
    folder = ROOT.joinpath(*package.split("."))
    modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    packages = {p.parent.name for p in folder.glob("*/__init__.py")}
    return {f"{package}.{name}" for name in modules | packages}


def test_the_toxiproxy_contract_forbids_everything_else_of_ours() -> None:
    rooms = _members("chaos") - {"chaos.toxiproxy"}
    siblings = _members("chaos.toxiproxy") - {"chaos.toxiproxy.server"}
    assert _forbidden("toxiproxy") == {"faults", "sla"} | rooms | siblings


def test_the_stream_hop_contract_forbids_everything_else_of_ours() -> None:
    rooms = _members("chaos") - {"chaos.hops"}
    siblings = _members("chaos.hops") - {"chaos.hops.streamhop"}
    assert _forbidden("streamhop") == {"faults", "sla"} | rooms | siblings


@pytest.mark.parametrize("package, other", [("faults", "sla"), ("sla", "faults")])
def test_faults_and_sla_may_import_only_the_floor(package: str, other: str) -> None:
    """Every room of chaos/ is either in the floor or forbidden, so a new room is a decision."""
    forbidden = _forbidden(package)
    rooms = _members("chaos")
    assert other in forbidden
    assert forbidden - {other} <= rooms, "a forbidden room that does not exist"
    assert rooms - forbidden == FLOOR


def test_every_room_has_its_layer_and_the_floor_is_at_the_bottom() -> None:
    layers = next(c for c in _contracts() if c["id"] == "rooms")["layers"]
    where = {room.strip(): i for i, layer in enumerate(layers) for room in layer.split("|")}
    assert _members("chaos") | {"faults", "sla"} <= set(where)
    assert min(where[r] for r in FLOOR) > max(i for r, i in where.items() if r not in FLOOR)


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
    circles = [c for c in _cycles(graph) if not all(m.startswith("chaos.toxiproxy.server.") for m in c)]
    assert circles == []


def test_the_architecture_page_shows_the_contracts_as_they_are() -> None:
    out = subprocess.run([sys.executable, "scripts/update_readme.py", "--check"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
