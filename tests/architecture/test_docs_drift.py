"""The descriptions of the packages stay true: every module a room's ``__init__.py`` docstring or
docs/architecture.md names exists, and the limits the doc states are the enforced ones.

A room's docstring names its modules bare (``base``, ``registry``), dotted (``chaos.execution.verify``)
or as paths (``chaos/targets/base.py``); docs/architecture.md does the same in backticks. When a module
moves and its old room's docstring still lists it, a reader goes looking for a file that is not there
(issue 38 found three). Here every such name must resolve: a bare name to a module, subpackage or name
of the room it is written in, a dotted name to a module (or a name a module defines), a path to a file
or folder. The paths docs/*.md quote are also checked by tests/test_repo_paths.py; the module names,
and the docstrings, only here.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("chaos", "faults", "sla")
DOC = ROOT / "docs" / "architecture.md"

# Bare words a room's docstring writes in backticks that are not its modules, each with why.
NOT_MODULES = {
    ("chaos/execution", "run"): "the name the room does not take (``chaos.run`` is the front door's function)",
    ("chaos/k8s", "kubernetes"): "the official client package, an optional dependency",
    ("sla", "errors"): "an SLA kind, judged by the module stream_errors",
}
# Paths the page quotes as what is not there, each with why.
NOT_PATHS = {"chaos/run/": "the name the run's room does not take: it would shadow the function chaos.run"}

_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_DOTTED = re.compile(r"(?<![\w./-])(?:chaos|faults|sla)(?:\.[A-Za-z_]\w*)+")
_BARE = re.compile(r"[a-z_][a-z0-9_]*/?")
_PATH = re.compile(r"(?:chaos|faults|sla)(?:/[\w.]+)*/?")
_FENCE = re.compile(r"^\s*(```|~~~)")


# --- what a name resolves to --------------------------------------------------------------------------------


@cache
def defined_names(module: Path) -> frozenset[str]:
    """The names a module (a ``.py`` file) defines at its top level, its imports included, and every string
    constant in it: a lazy export (``__all__``, a ``__getattr__`` table) is named by a string."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    names = set(_strings(tree))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            names.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(a.asname or a.name.split(".")[0] for a in node.names)
    return frozenset(names)


@cache
def described_names(module: Path) -> frozenset[str]:
    """What a docstring may name in a module besides the module: its functions and classes (methods
    included) and its string constants (kinds, fields, commands). A plain variable is not among them, so
    a module that moved away is not excused by a local of the same name."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    defs = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    return frozenset(defs | _strings(tree))


def _strings(tree: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def module_file(root: Path, parts: list[str]) -> Path | None:
    """The file of the module ``parts`` (``a/b.py`` or ``a/b/__init__.py``) under ``root``, or None."""
    base = root.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def dotted_resolves(root: Path, name: str) -> bool:
    """``a.b.c`` is a module, or ``a.b`` is one and defines ``c`` (what follows ``c`` is an attribute of it)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        found = module_file(root, parts[:end])
        if found is not None:
            return end == len(parts) or parts[end] in defined_names(found)
    return False


@cache
def room_names(room: Path) -> frozenset[str]:
    """What the modules of ``room`` (a folder, its subpackages included) define that a docstring may name,
    and every name its ``__init__.py`` defines or exports."""
    init = room / "__init__.py"
    exported = defined_names(init) if init.is_file() else frozenset()
    return exported.union(*(described_names(module) for module in room.rglob("*.py")))


def bare_resolves(root: Path, room: str, name: str) -> bool:
    """``name`` is a module or subpackage of ``room`` (a folder), a function, class or string of one of its
    modules (a docstring names those too), a name its ``__init__.py`` exports, the room itself or one of our
    packages, or a word ``NOT_MODULES`` explains."""
    name = name.rstrip("/")
    if (room, name) in NOT_MODULES or name in PACKAGES or name == Path(room).name:
        return True
    if module_file(root / room, [name]) is not None or (root / room / name).is_dir():
        return True
    return name in room_names(root / room)


def room_of(root: Path, path: str) -> str | None:
    """The package folder a quoted path names (``chaos/targets/base.py`` → ``chaos/targets``), or None."""
    folder = path.rstrip("/") if (root / path).is_dir() else str(Path(path).parent)
    return folder if (root / folder / "__init__.py").is_file() else None


# --- the names a text gives --------------------------------------------------------------------------------


def spans(text: str) -> list[str]:
    """The inline code spans of ``text`` (``x`` and ``x`` in backticks, single or double), in order."""
    return [m.group(2).strip() for m in _SPAN.finditer(text)]


def stale_names(root: Path, text: str, rooms: tuple[str, ...] = ()) -> list[str]:
    """Every name ``text`` gives that does not resolve. Bare words count only where a room is known: one
    of ``rooms`` when given (a room's docstring, a table row's first cell), else the room the last quoted
    folder of ours before them in ``text`` names."""
    found = [f"{name} (no such module or name)" for name in _DOTTED.findall(text) if not dotted_resolves(root, name)]
    current = rooms
    for span in spans(text):
        if _PATH.fullmatch(span) and "/" in span:
            exists = span in NOT_PATHS or (root / span).exists()
            if not exists:
                found.append(f"{span} (no such file or folder)")
            if not rooms and span.endswith("/"):
                folder = room_of(root, span) if exists else None
                current = (folder,) if folder else ()
        elif _BARE.fullmatch(span) and current and not any(bare_resolves(root, room, span) for room in current):
            found.append(f"{span} (not a module of {' or '.join(room + '/' for room in current)})")
    return found


def paragraphs(text: str) -> Iterator[tuple[int, str]]:
    """``(first line, text)`` of each paragraph of a Markdown page outside code fences; a table row is a
    paragraph of its own, so the room its first cell names holds for that row only."""
    block: list[str] = []
    start, in_fence = 0, False
    for number, line in enumerate([*text.splitlines(), ""], 1):
        fence = _FENCE.match(line) is not None
        table_row = not in_fence and line.lstrip().startswith("|")
        if fence or in_fence or table_row or not line.strip():
            if block:
                yield start, "\n".join(block)
            block = []
            in_fence ^= fence
            if (in_fence and not fence) or table_row:
                yield number, line  # a code line's dotted names count (its bare words have no room path)
            continue
        if not block:
            start = number
        block.append(line)


def stale_in_doc(root: Path, page: Path) -> list[str]:
    """``page:line: name (why)`` for each name a Markdown page gives that does not resolve."""
    found = []
    for line, para in paragraphs(page.read_text(encoding="utf-8")):
        rooms: tuple[str, ...] = ()
        if para.lstrip().startswith("|"):  # a row of the rooms table: the rooms its first cell names
            first_cell = para.strip().strip("|").split("|")[0]
            rooms = tuple(r for p in spans(first_cell) if _PATH.fullmatch(p) and (r := room_of(root, p)))
        found += [f"{page.relative_to(root)}:{line}: {hit}" for hit in stale_names(root, para, rooms)]
    return found


def room_docstrings(root: Path) -> Iterator[tuple[str, str]]:
    """``(room, docstring)`` for every package of ours: its folder, relative to ``root``."""
    for package in PACKAGES:
        for init in sorted((root / package).rglob("__init__.py")):
            doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
            if doc:
                yield init.parent.relative_to(root).as_posix(), doc


def stale_in_module_docstrings(root: Path) -> list[str]:
    """``path:line: name (why)`` for each dotted name a docstring of a module, class or function of ours gives
    that does not resolve (bare words are left to the rooms' docstrings: elsewhere they are mostly not modules)."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node, clean=False)
                    line = getattr(node, "lineno", 1)
                    found += [f"{path.relative_to(root).as_posix()}:{line}: {name} (no such module or name)"
                              for name in _DOTTED.findall(doc or "") if not dotted_resolves(root, name)]
    return found


def stale_in_docstrings(root: Path) -> list[str]:
    """``room/__init__.py: name (why)`` for each name a room's docstring gives that does not resolve."""
    return [f"{room}/__init__.py: {hit}" for room, doc in room_docstrings(root)
            for hit in stale_names(root, doc, (room,))]


# --- the tree ---------------------------------------------------------------------------------------------


def test_every_module_a_room_docstring_names_exists() -> None:
    assert stale_in_docstrings(ROOT) == []


def test_every_dotted_name_a_docstring_gives_exists() -> None:
    assert stale_in_module_docstrings(ROOT) == []


def test_every_module_the_architecture_page_names_exists() -> None:
    assert stale_in_doc(ROOT, DOC) == []


def test_the_limits_the_architecture_page_states_are_the_enforced_ones() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    enforced = config["tool"]["ruff"]["lint"]["mccabe"]["max-complexity"]
    assert limit_drift(DOC.read_text(encoding="utf-8"), enforced, max_lines_enforced()) == []


def limit_drift(page: str, complexity: int, max_lines: int) -> list[str]:
    """Where the page's sentence on the limits disagrees with the enforced ``complexity`` and ``max_lines``."""
    text = " ".join(page.split())
    stated = re.search(r"No function of the packages is over cyclomatic complexity (\d+) .*? or (\d+) lines", text)
    if stated is None:
        return ["the page no longer states the limits in the sentence this test reads"]
    found = []
    if int(stated.group(1)) != complexity:
        found.append(f"complexity {stated.group(1)} stated, {complexity} enforced (pyproject.toml)")
    if int(stated.group(2)) != max_lines:
        found.append(f"{stated.group(2)} lines stated, {max_lines} enforced (test_function_size.py)")
    return found


def max_lines_enforced() -> int:
    """``MAX_LINES`` as tests/architecture/test_function_size.py sets it (read, not imported: tests are no package)."""
    source = (ROOT / "tests" / "architecture" / "test_function_size.py").read_text(encoding="utf-8")
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["MAX_LINES"]:
            return int(ast.literal_eval(node.value))
    raise AssertionError("tests/architecture/test_function_size.py sets no MAX_LINES")


# --- the checks themselves fail on what they are for --------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """chaos/ with a room ``targets`` (modules ``base`` and ``docker``, the lazy export ``start``) and
    chaos/execution/verify.py defining ``judge_entry``."""
    targets = tmp_path / "chaos" / "targets"
    targets.mkdir(parents=True)
    (tmp_path / "chaos" / "__init__.py").write_text('"""The front door."""\n__all__ = ["run"]\n')
    (targets / "__init__.py").write_text('"""Targets: ``base``, ``docker``."""\n_LAZY = {"start": "base"}\n')
    (targets / "base.py").write_text("class Target:\n    pass\n")
    (targets / "docker.py").write_text("")
    execution = tmp_path / "chaos" / "execution"
    execution.mkdir()
    (execution / "__init__.py").write_text("")
    (execution / "verify.py").write_text("def judge_entry() -> None:\n    pass\n")
    return tmp_path


def test_a_name_that_moved_away_is_reported_in_every_form(tree: Path) -> None:
    text = ("Targets: ``base``, ``docker``, ``containers``; ``start`` resolves lazily; see ``chaos/targets/base.py``,"
            " ``chaos/targets/gone.py``, ``chaos.execution.verify.judge_entry``, ``chaos.execution.verify.gone``,"
            " ``chaos.execution.moved`` and ``chaos.run``.")
    assert stale_names(tree, text, ("chaos/targets",)) == [
        "chaos.execution.verify.gone (no such module or name)", "chaos.execution.moved (no such module or name)",
        "containers (not a module of chaos/targets/)", "chaos/targets/gone.py (no such file or folder)"]


def test_a_planted_wrong_name_in_a_room_docstring_fails(tree: Path) -> None:
    assert stale_in_docstrings(tree) == []
    init = tree / "chaos" / "targets" / "__init__.py"
    init.write_text(init.read_text().replace("``docker``", "``docker``, ``host_image``"))
    assert stale_in_docstrings(tree) == ["chaos/targets/__init__.py: host_image (not a module of chaos/targets/)"]


def test_a_planted_wrong_dotted_name_in_a_function_docstring_fails(tree: Path) -> None:
    assert stale_in_module_docstrings(tree) == []
    verify = tree / "chaos" / "execution" / "verify.py"
    verify.write_text('def judge_entry() -> None:\n    """Per entry (``chaos.execution.verify.judge_entry``, '
                      'not ``chaos.execution.guard.judge``)."""\n')
    assert stale_in_module_docstrings(tree) == [
        "chaos/execution/verify.py:1: chaos.execution.guard.judge (no such module or name)"]


def test_bare_words_in_the_page_belong_to_the_room_named_before_them(tree: Path) -> None:
    (tree / "docs").mkdir()
    page = tree / "docs" / "architecture.md"
    page.write_text("Rooms: `chaos/targets/` (`base`, `docker`), `chaos/execution/` (`verify`, `docker`).\n\n"
                    "No room here: `anything` goes, but `chaos.execution.lost` does not.\n\n"
                    "| room | owns |\n| --- | --- |\n| `chaos/targets/` | `base` and `lost` |\n"
                    "| `chaos/execution/` | `base` |\n\n```\nchaos.execution.verify.judge_entry → chaos.nowhere\n```\n",
                    encoding="utf-8")
    assert stale_in_doc(tree, page) == [
        "docs/architecture.md:1: docker (not a module of chaos/execution/)",
        "docs/architecture.md:3: chaos.execution.lost (no such module or name)",
        "docs/architecture.md:7: lost (not a module of chaos/targets/)",
        "docs/architecture.md:8: base (not a module of chaos/execution/)",
        "docs/architecture.md:11: chaos.nowhere (no such module or name)"]


def test_a_stated_limit_other_than_the_enforced_one_is_reported() -> None:
    page = ("No function of the packages is\nover cyclomatic complexity 15 (ruff's C901, pyproject.toml) or 60 lines\n"
            "(`tests/architecture/test_function_size.py`).")
    assert limit_drift(page, 10, 60) == ["complexity 15 stated, 10 enforced (pyproject.toml)"]
    assert limit_drift(page.replace("15", "10"), 10, 60) == []
    assert limit_drift(page, 15, 50) == ["60 lines stated, 50 enforced (test_function_size.py)"]
    assert limit_drift("Functions are short.", 10, 60) == [
        "the page no longer states the limits in the sentence this test reads"]
