"""What pyproject.toml declares for ruff holds on the whole tree, and the rules it declares do catch
what they are for (a long line, unsorted imports, a zip that hides a length mismatch, a function
over complexity 10 in a package)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


def _ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("ruff")
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=100, check=False)


def test_the_tree_is_clean_under_the_declared_rules() -> None:
    done = _ruff(".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_the_declared_rules_catch_a_planted_violation_of_each(tmp_path: Path) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    package = tmp_path / "chaos"
    package.mkdir()
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(11))
    (package / "planted.py").write_text(
        "import sys\nimport os\n\n\n"  # I001: unsorted
        f"LONG = '{'x' * 130}'\n\n\n"  # E501
        "def pairs(a: list[int], b: list[int]) -> list[tuple[int, int]]:\n"
        "    return list(zip(a, b))\n\n\n"  # B905
        f"def branchy(x: int) -> int:\n{branches}\n    return len(sys.argv) + len(os.sep)\n",  # C901: 12
        encoding="utf-8")
    done = _ruff(".", cwd=tmp_path)
    codes = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("chaos/")}
    assert {"I001", "E501", "B905", "C901"} <= codes, done.stdout
