"""Rewrite the generated sections of README.md: the catalogues (fault and SLA registries) and the
engine profiles with the fault-support and SLA × metrics matrices (chaos.engines, chaos.support)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- catalogue:start -->", "<!-- catalogue:end -->"
SUPPORT_START, SUPPORT_END = "<!-- support:start -->", "<!-- support:end -->"


def _replace(readme: str, start: str, end: str, body: str) -> str:
    block = f"{start}\n{body.strip()}\n{end}"
    return re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, readme, flags=re.S)


def render(readme: str) -> str:
    from chaos.catalogue import catalogue_markdown, fault_kinds, sla_kinds
    from chaos.support import render_markdown

    readme = _replace(readme, START, END, catalogue_markdown())
    support = render_markdown([k.kind for k in fault_kinds()], [k.kind for k in sla_kinds()])
    return _replace(readme, SUPPORT_START, SUPPORT_END, support)


def main() -> int:
    path = ROOT / "README.md"
    path.write_text(render(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
