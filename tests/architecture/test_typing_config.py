"""mypy runs strict on every package (mypy itself runs in tests/lint/test_typing.py), and the few places
it is told to look away say why.

``strict = true`` holds for the whole of chaos, faults and sla; no override turns a strict check back off
for a module of ours (an override may only say how a library outside is read). Each ``# type: ignore``
names the errors it silences and says why after it, ``# type: ignore[code]  # why``, or in a comment on the
line before.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("chaos", "faults", "sla")
# what --strict turns on (mypy 1.x), each of which an override could turn back off
STRICT_FLAGS = frozenset({
    "warn_unused_configs", "disallow_any_generics", "disallow_subclassing_any", "disallow_untyped_calls",
    "disallow_untyped_defs", "disallow_incomplete_defs", "check_untyped_defs", "disallow_untyped_decorators",
    "warn_redundant_casts", "warn_unused_ignores", "warn_return_any", "no_implicit_reexport", "strict_equality",
    "extra_checks",
})
_IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[^\]]*\])?(?P<rest>.*)$")


def relaxed_overrides(mypy: dict[str, Any]) -> list[str]:
    """Each override that turns a strict check off, or ignores errors, for a module of ours."""
    found = []
    for override in mypy.get("overrides", []):
        modules = override["module"] if isinstance(override["module"], list) else [override["module"]]
        ours = [m for m in modules if m.split(".")[0] in PACKAGES]
        off = sorted(k for k, v in override.items() if (k in STRICT_FLAGS and v is False)
                     or (k == "ignore_errors" and v is True))
        if ours and off:
            found.append(f"{ours}: {off}")
    return found


def unexplained_ignores(source: str, where: str) -> list[str]:
    """``where:line`` for each ``# type: ignore`` in ``source`` without its codes or without a why after them."""
    found = []
    lines = source.splitlines()
    for number, line in enumerate(lines, 1):
        match = _IGNORE.search(line)
        if match is None:
            continue
        why = match.group("rest").strip()
        said = why.startswith("#") and len(why.lstrip("# ")) >= 8
        above = number > 1 and lines[number - 2].strip().startswith("#")  # a long line says why on the line before
        if not match.group("codes") or not (said or above):
            found.append(f"{where}:{number}")
    return found


def test_mypy_is_strict_on_every_package() -> None:
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert mypy.get("strict") is True, "[tool.mypy] strict = true: every package of ours is checked strictly"
    assert relaxed_overrides(mypy) == []


def test_every_type_ignore_names_its_codes_and_says_why() -> None:
    found = [hit for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             for hit in unexplained_ignores(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())]
    assert found == []


def test_a_relaxing_override_and_a_bare_ignore_are_found() -> None:
    mypy = {"strict": True, "overrides": [
        {"module": ["torch", "torch.*"], "follow_imports": "skip"},
        {"module": "chaos.stack.engine.model", "disallow_subclassing_any": False},
        {"module": ["sla.*"], "ignore_errors": True},
    ]}
    assert relaxed_overrides(mypy) == ["['chaos.stack.engine.model']: ['disallow_subclassing_any']",
                                       "['sla.*']: ['ignore_errors']"]
    source = ("x = f()  # type: ignore\n"
              "y = g()  # type: ignore[arg-type]\n"
              "z = h()  # type: ignore[arg-type]  # h is typed too narrowly upstream\n"
              "w = k()  # type: ignore  # no code named\n"
              "# k's stubs want a literal: this one is built at run time\n"
              "v = k()  # type: ignore[arg-type]\n")
    assert unexplained_ignores(source, "m.py") == ["m.py:1", "m.py:2", "m.py:4"]
