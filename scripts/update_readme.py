"""Rewrite the generated catalogue section of README.md from the fault and SLA registries."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- catalogue:start -->", "<!-- catalogue:end -->"


def render(readme: str) -> str:
    from chaos.catalogue import catalogue_markdown

    block = f"{START}\n{catalogue_markdown().strip()}\n{END}"
    return re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: block, readme, flags=re.S)


def main() -> int:
    path = ROOT / "README.md"
    path.write_text(render(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
