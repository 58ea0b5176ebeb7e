"""docs/troubleshooting.md advises only on messages the tool still prints: every message the page
quotes (a blockquote of one code span, ``…`` for what changes from run to run) occurs in a string
literal of chaos/, faults/ or sla/, its pieces in order, each f-string placeholder standing for any text."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "troubleshooting.md"
HOLE = "\x00"  # where a literal has a placeholder (or a non-literal operand of +)
_QUOTE = re.compile(r"^> (`+) ?(.+?) ?\1$", re.M)  # > `message` or > ``message with `code` in it``


def quoted() -> list[str]:
    return [m.group(2) for m in _QUOTE.finditer(PAGE.read_text(encoding="utf-8"))]


def _flat(node: ast.expr) -> str | None:
    """A string expression's text with each placeholder as HOLE; None for a non-string expression."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else HOLE for v in node.values)  # type: ignore[misc]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _flat(node.left), _flat(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else HOLE) + (right if right is not None else HOLE)
    return None


def _literals(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Constant, ast.JoinedStr, ast.BinOp)):
            text = _flat(node)
            if text:
                yield text


@cache
def literals() -> tuple[str, ...]:
    return tuple(text for package in ("chaos", "faults", "sla") for path in sorted((ROOT / package).rglob("*.py"))
                 for text in _literals(path))


def occurs(message: str, text: str) -> bool:
    """``message``'s pieces (split at ``…``) in ``text`` in order, none spanning a placeholder."""
    at = 0
    for piece in message.split("…"):
        if not piece:
            continue
        found = text.find(piece, at)
        if found < 0:
            return False
        at = found + len(piece)
    return True


def test_the_page_quotes_messages() -> None:
    messages = quoted()
    assert len(messages) >= 30, f"only {len(messages)} quoted messages found: is the page's quoting intact?"
    assert all(message.replace("…", "").strip() for message in messages)


def test_every_quoted_message_is_printed_by_the_code() -> None:
    missing = [m for m in quoted() if not any(occurs(m, text) for text in literals())]
    assert not missing, ("docs/troubleshooting.md quotes messages no string in chaos/, faults/ or sla/ "
                         "prints any more:\n  " + "\n  ".join(missing))


def test_a_changed_message_is_caught() -> None:
    texts = literals()
    assert any(occurs("the target looks dead: all of the first … streams failed", t) for t in texts)
    assert not any(occurs("the target looks dead: all of the first … streams were fine", t) for t in texts)
    assert not any(occurs("the target looks dead: all of the first 8 streams failed", t) for t in texts), \
        "a placeholder must be written as … on the page"
