"""Rewrite the generated sections of the documentation pages: the fault and SLA catalogues (the
registries) in docs/faults.md and docs/slas.md, the engine profiles with the fault-support and
SLA × metrics matrices (chaos.model.engines, chaos.output.support) in docs/support.md, the
rooms' "may import" table (pyproject.toml's import-linter contracts) in docs/architecture.md,
the command line reference (chaos/cli.py's parser) in docs/cli.md, and the hop kinds of `path:`
(the gateway registry, chaos.hops.gateways) in docs/hops.md.

    python scripts/update_readme.py            rewrite every generated block in place
    python scripts/update_readme.py --check    exit 1, naming the pages, when a block is stale

Each block sits between two HTML-comment markers (``<!-- faults:start -->`` ... ``<!-- faults:end -->``);
what lies outside the markers is written by hand and left alone. The name is historical: these
blocks lived in README.md until the reference moved to docs/.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLA_HEADING = "## SLA catalogue"


def _faults() -> str:
    from chaos.output.catalogue import catalogue_markdown

    md = catalogue_markdown()
    return md[:md.index(SLA_HEADING)]


def _slas() -> str:
    from chaos.output.catalogue import catalogue_markdown

    md = catalogue_markdown()
    return md[md.index(SLA_HEADING):]


def _support() -> str:
    from chaos.output.catalogue import fault_kinds, sla_kinds
    from chaos.output.support import render_markdown

    return render_markdown([k.kind for k in fault_kinds()], [k.kind for k in sla_kinds()])


def _hops() -> str:
    from chaos.output.catalogue import hops_markdown

    return hops_markdown()


def _rooms() -> str:
    """The layers contract as a table, top to bottom, and the forbidden contracts as sentences."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    contracts = config["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    # a forbidden contract on a whole room narrows what its row may import (faults and sla: the floor)
    narrowed = {c["source_modules"][0]: set(c["forbidden_modules"]) for c in contracts
                if c["type"] == "forbidden" and len(c["source_modules"]) == 1}
    rows = ["| layer | rooms | may import |", "| --- | --- | --- |"]
    for i, layer in enumerate(layers):
        rooms = [r.strip() for r in layer.replace(":", "|").split("|")]
        below = [r.strip() for lower in layers[i + 1:] for r in lower.replace(":", "|").split("|")]
        below = [r for r in below if len(rooms) > 1 or r not in narrowed.get(rooms[0], set())]
        siblings = " (not each other)" if "|" in layer and len(rooms) > 1 else ""
        may = ", ".join(f"`{r}`" for r in below) if below else "nothing of ours"
        rows.append(f"| {i + 1} | {', '.join(f'`{r}`' for r in rooms)} | {may}{siblings} |")
    notes = [f"- {c['name']}: {', '.join(f'`{m}`' for m in c['source_modules'])} may not import "
             f"{', '.join(f'`{m}`' for m in c['forbidden_modules'])}." for c in contracts if c["type"] == "forbidden"]
    return "\n".join(rows) + "\n\n" + "\n".join(notes)


def _cli() -> str:
    """Every command of the parser (chaos/cli.py), and `stack serve`'s own: usage, arguments, help."""
    from chaos.cli import _parser
    from chaos.stack.serve import build_parser

    root = _parser()
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    parts = [_cli_command(root, root.description or "")]
    for name, parser in sub.choices.items():
        if name in ("stack", "toxiproxy"):
            continue  # their `serve` parses its own options (below, and `streamchaos toxiproxy serve --help`)
        parts.append(_cli_command(parser, helps.get(name) or ""))
    parts.append(_cli_command(build_parser(), "the builtin streaming stack as a server of its own"))
    return "\n\n".join(parts)


def _cli_command(parser: argparse.ArgumentParser, summary: str) -> str:
    """One command as Markdown: a heading, what it does, its usage at a fixed width, a table of its arguments."""
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100)  # not the terminal's width
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        text = formatter._expand_help(action) if action.help else ""
        if action.default not in (None, False, [], argparse.SUPPRESS) and "default" not in text:
            text = f"{text} (default: {action.default})" if text else f"default: {action.default}"
        rows.append(f"| `{formatter._format_action_invocation(action)}` | {_cli_cell(text)} |")
    table = "\n".join(["| argument | what it does |", "| --- | --- |", *rows]) if rows else ""
    return "\n\n".join(part for part in (f"### `{parser.prog}`", _cli_cell(summary),
                                           f"```text\n{parser.format_usage().strip()}\n```", table) if part)


def _cli_cell(text: str) -> str:
    """Help text as Markdown table text: ``<time>`` and ``|`` kept literal."""
    return " ".join(text.split()).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def _integrations() -> str:
    from chaos.output.integrations import integrations_markdown

    return integrations_markdown()


# page (relative to the repository root) -> its generated blocks: (marker name, body)
BLOCKS: dict[str, list[tuple[str, Callable[[], str]]]] = {
    "docs/faults.md": [("faults", _faults)],
    "docs/slas.md": [("slas", _slas)],
    "docs/support.md": [("support", _support), ("integrations", _integrations)],
    "docs/architecture.md": [("rooms", _rooms)],
    "docs/cli.md": [("cli", _cli)],
    "docs/hops.md": [("hops", _hops)],
}


def _replace(text: str, name: str, body: str, page: str) -> str:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    pattern = re.escape(start) + r".*?" + re.escape(end)
    if not re.search(pattern, text, flags=re.S):
        raise SystemExit(f"scripts/update_readme.py: {page} has no {start} ... {end} block")
    block = f"{start}\n{body.strip()}\n{end}"
    return re.sub(pattern, lambda _: block, text, flags=re.S)


def render(text: str, page: str) -> str:
    """``text`` (the page ``page``, e.g. ``docs/faults.md``) with its generated blocks brought up to date."""
    for name, body in BLOCKS[page]:
        text = _replace(text, name, body(), page)
    return text


def stale() -> list[str]:
    """The pages whose generated blocks are not what the registries give now."""
    out = []
    for page in BLOCKS:
        text = (ROOT / page).read_text(encoding="utf-8")
        if render(text, page) != text:
            out.append(page)
    return out


def main(argv: list[str]) -> int:
    if "--check" in argv:
        pages = stale()
        if pages:
            print(f"scripts/update_readme.py: stale: {', '.join(pages)}: run python scripts/update_readme.py")
            return 1
        return 0
    for page in BLOCKS:
        path = ROOT / page
        path.write_text(render(path.read_text(encoding="utf-8"), page), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
