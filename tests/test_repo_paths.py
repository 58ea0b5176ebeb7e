"""The tree holds what the docs and the slow tier say it holds.

``.gitignore`` once ignored every folder named ``runs/``, so the tests moved into ``tests/k8s/runs/``
and ``tests/reports/runs/`` were run, named in the docs and never committed (issue 38). Here: every
folder of the slow tier (``SLOW_FOLDERS`` in tests/conftest.py) exists and holds a test file git
keeps; nothing under the packages, the tests, the experiments or the docs is hidden by an ignore
rule but caches; and every repository path quoted in docs/*.md, README.md and tests/README.md
exists, so a doc naming a moved or lost file fails here rather than misleading a reader.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# where a quoted repository path starts: the top-level folders a doc may name
TOP_FOLDERS = ("chaos", "faults", "sla", "tests", "experiments", "docs", "scripts", "benchmarks", "manifests", ".ci")
KEPT = ("tests", "chaos", "faults", "sla", "experiments", "docs")  # nothing under these may be ignored
CACHES = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis", ".grimp_cache"}
# paths a page names on purpose although they are not there, each with why
NOT_THERE = {
    ("docs/architecture.md", "chaos/run/"): "says the run's room is not chaos/run/, which would shadow chaos.run",
}
PAGES = (*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", ROOT / "tests" / "README.md",
         ROOT / "manifests" / "README.md", ROOT / "SECURITY.md")

_FENCE = re.compile(r"^\s*(```|~~~)")
_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_TOKEN_SPLIT = re.compile(r"[\s=\"'()\[\]|]+|,(?![^{}]*\})")  # a comma splits, but not one in braces
_PLACEHOLDER = re.compile(r"<[^>/]*>")  # runs/<time>-<name>: any name there
_BRACES = re.compile(r"\{([^{}/]*,[^{}/]*)\}")  # chaos/output/reports/{compare,distributions}.py


# --- git -------------------------------------------------------------------------------------------------


def git_files(root: Path, *args: str) -> list[str]:
    """``git ls-files ARGS`` in ``root``; skips the test where ``root`` is no git checkout."""
    if not (root / ".git").exists() or shutil.which("git") is None:
        pytest.skip(f"{root} is not a git checkout (or git is not installed): what git keeps cannot be asked")
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", *args], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return [name for name in out.split("\0") if name]


def ignored(root: Path, folders: tuple[str, ...]) -> list[str]:
    """Files under ``folders`` that an ignore rule hides from git, caches left out."""
    names = git_files(root, "--others", "--ignored", "--exclude-standard", "--", *folders)
    return [name for name in names if not CACHES & set(Path(name).parts) and not name.endswith((".pyc", ".pyo"))]


def kept_tests(root: Path, folder: str) -> list[str]:
    """The test files under ``folder`` that git tracks, or would add (untracked and not ignored)."""
    names = git_files(root, "--cached", "--others", "--exclude-standard", "--", folder)
    return [name for name in names if Path(name).name.startswith("test_") and name.endswith(".py")]


def slow_folders() -> list[Path]:
    """``SLOW_FOLDERS`` as tests/conftest.py defines it (loaded under a name of its own, not ``conftest``)."""
    spec = importlib.util.spec_from_file_location("_slow_tier_conftest", ROOT / "tests" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.SLOW_FOLDERS)


# --- the paths the docs quote ------------------------------------------------------------------------------


def quoted_paths(text: str) -> Iterator[tuple[int, str]]:
    """``(line, token)`` for each word of an inline code span or a fenced block that starts with a
    top-level folder, and ``(line, "link:TARGET")`` for each Markdown link. Prose is not read."""
    in_fence = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        chunks = [line] if in_fence else [m.group(2) for m in _SPAN.finditer(line)]
        for word in itertools.chain.from_iterable(_TOKEN_SPLIT.split(c) for c in chunks):
            word = word.removeprefix("./")
            if word.split("/")[0] in TOP_FOLDERS and "/" in word:
                yield number, word
        if not in_fence:
            yield from ((number, f"link:{m.group(1)}") for m in _LINK.finditer(line))


def _clean(word: str) -> str:
    """The path in a quoted word: without a trailing ``:12`` line, ``::test`` node id or punctuation."""
    word = word.split("::")[0]
    word = re.sub(r":\d+(-\d+)?$", "", word)
    return word.rstrip(".,;:!?")


def _expand(path: str) -> list[str]:
    """``a/{b,c}.py`` as ``a/b.py`` and ``a/c.py``; other paths as they are."""
    match = _BRACES.search(path)
    if match is None:
        return [path]
    return [p for choice in match.group(1).split(",")
            for p in _expand(path[:match.start()] + choice.strip() + path[match.end():])]


def _exists(base: Path, path: str) -> bool:
    """Whether ``path`` (from ``base``) names something there; a glob or a placeholder must match at least one."""
    pattern = _PLACEHOLDER.sub("*", path)
    if any(c in pattern for c in "*?["):
        return next(base.glob(pattern.rstrip("/")), None) is not None
    return (base / pattern).exists()


def _link_target(page: Path, target: str) -> tuple[Path, str] | None:
    """Where a relative link points (its folder and path), or None for a URL or an anchor on the page."""
    target = target.split("#")[0]
    if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target):
        return None
    return page.parent, target


def where_from(root: Path, page: Path) -> str:
    return page.relative_to(root).as_posix()


def missing_paths(root: Path, page: Path) -> list[str]:
    """``page:line: path`` for each path ``page`` quotes that is not in the tree at ``root``."""
    found = []
    for number, word in quoted_paths(page.read_text(encoding="utf-8")):
        if word.startswith("link:"):
            where = _link_target(page, word.removeprefix("link:"))
            if where is None:
                continue
            base, path = where
        else:
            base, path = root, _clean(word)
        if not all(_exists(base, p) for p in _expand(path)) and (where_from(root, page), path) not in NOT_THERE:
            found.append(f"{where_from(root, page)}:{number}: {path}")
    return found


# --- the tree ----------------------------------------------------------------------------------------------


def test_every_slow_folder_exists_and_holds_tests_git_keeps() -> None:
    folders = slow_folders()
    assert folders, "tests/conftest.py names no slow folder"
    for folder in folders:
        relative = folder.relative_to(ROOT).as_posix()
        assert folder.is_dir(), f"SLOW_FOLDERS names {relative}, which is not there"
        assert kept_tests(ROOT, relative), (f"{relative} holds no test file git tracks or would add: "
                                            f"an ignore rule hides it ({ignored(ROOT, (relative,))[:5]})")


def test_nothing_under_the_code_tests_or_docs_is_ignored_but_caches() -> None:
    hidden = ignored(ROOT, KEPT)
    assert hidden == [], f"hidden by an ignore rule (so never committed; git check-ignore -v names it): {hidden[:20]}"


def test_the_tests_readme_lists_the_slow_tier_as_conftest_names_it() -> None:
    rows = re.findall(r"^\| `([^`]+/)` \|.*\| ([^|]+) \|$", (ROOT / "tests" / "README.md").read_text(encoding="utf-8"),
                      re.MULTILINE)
    assert rows, "tests/README.md has no folder table"
    for folder, _ in rows:
        assert (ROOT / "tests" / folder).is_dir(), f"tests/README.md lists tests/{folder}, which is not there"
    slow = {folder.rstrip("/") for folder, tier in rows if tier.strip().startswith("slow")}
    assert slow == {f.relative_to(ROOT / "tests").as_posix() for f in slow_folders()}


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_repository_path_the_docs_quote_exists(page: Path) -> None:
    assert missing_paths(ROOT, page) == []


# --- the checks themselves fail on what they are for --------------------------------------------------------


def test_the_extractor_finds_quoted_paths_and_leaves_prose_alone() -> None:
    text = ("Run `./scripts/test tests/sla` or see chaos/cli.py in prose; `chaos.cli` is a module.\n"
            "```\nstreamchaos run experiments/smoke.yaml --out runs/ci\n```\n"
            "See [the page](docs/ci.md#jobs) and `tests/e2e/test_halt.py::test_x`.\n")
    assert list(quoted_paths(text)) == [
        (1, "scripts/test"), (1, "tests/sla"), (3, "experiments/smoke.yaml"),
        (5, "tests/e2e/test_halt.py::test_x"), (5, "link:docs/ci.md#jobs")]


def test_a_broken_quoted_path_is_reported_and_placeholders_globs_and_braces_are_not(tmp_path: Path) -> None:
    (tmp_path / "chaos" / "output").mkdir(parents=True)
    for name in ("compare.py", "page.py"):
        (tmp_path / "chaos" / "output" / name).write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "ci.md").write_text("")
    page = tmp_path / "docs" / "page.md"
    page.write_text("`chaos/output/{compare,page}.py` `chaos/output/<name>.py` `chaos/output/*.py`\n"
                    "`chaos/output/page.py:12` and [ci](ci.md#x) and [site](https://example.org/a/b)\n"
                    "`chaos/output/gone.py` and `chaos/{page,lost}.py` and [lost](lost.md)\n"
                    "`chaos/nothing/*.py`\n", encoding="utf-8")
    assert missing_paths(tmp_path, page) == [
        "docs/page.md:3: chaos/output/gone.py", "docs/page.md:3: chaos/{page,lost}.py", "docs/page.md:3: lost.md",
        "docs/page.md:4: chaos/nothing/*.py"]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_folder_hidden_by_an_ignore_rule_is_found(tmp_path: Path) -> None:
    """The rule that lost the tests: ``runs/`` unanchored hides tests/k8s/runs/; ``/runs/`` does not."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=30)
    (tmp_path / "tests" / "k8s" / "runs").mkdir(parents=True)
    (tmp_path / "tests" / "k8s" / "runs" / "test_target.py").write_text("")
    (tmp_path / "tests" / "k8s" / "runs" / "__pycache__").mkdir()
    (tmp_path / "tests" / "k8s" / "runs" / "__pycache__" / "x.pyc").write_text("")
    (tmp_path / ".gitignore").write_text("__pycache__/\nruns/\n")
    assert ignored(tmp_path, ("tests",)) == ["tests/k8s/runs/test_target.py"]
    assert kept_tests(tmp_path, "tests/k8s/runs") == []
    (tmp_path / ".gitignore").write_text("__pycache__/\n/runs/\n")
    assert ignored(tmp_path, ("tests",)) == []
    assert kept_tests(tmp_path, "tests/k8s/runs") == ["tests/k8s/runs/test_target.py"]
