"""No function of the packages is longer than a screen: 60 lines at most (ruff's C901 bounds their
cyclomatic complexity at 10, pyproject.toml; ruff has no rule for length)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 60


def long_functions(source: str, where: str) -> list[str]:
    """Every function in ``source`` over ``MAX_LINES`` lines, as ``where:line name (n lines)``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_LINES:
                out.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_function_is_longer_than_a_screen() -> None:
    found = [hit for package in ("chaos", "sla", "faults") for path in sorted((ROOT / package).rglob("*.py"))
             for hit in long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert found == []


def test_a_long_function_is_found_wherever_it_hides() -> None:
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_LINES))
    source = f"class C:\n    async def m(self) -> None:\n{body}\n\ndef short() -> None:\n    pass\n"
    assert long_functions(source, "planted.py") == [f"planted.py:2 m ({MAX_LINES + 1} lines)"]
