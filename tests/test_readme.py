"""The documentation's catalogues and support matrices are generated from the registries and cannot
drift (scripts/update_readme.py writes them into docs/faults.md, docs/slas.md and docs/support.md);
the README names the two commands that exist."""

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _update_readme() -> ModuleType:
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "scripts" / "update_readme.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_blocks_match_the_registries() -> None:
    module = _update_readme()
    assert set(module.BLOCKS) == {"docs/faults.md", "docs/slas.md", "docs/support.md", "docs/architecture.md",
                                  "docs/cli.md", "docs/hops.md"}
    for page in module.BLOCKS:
        text = (ROOT / page).read_text(encoding="utf-8")
        assert module.render(text, page) == text, f"{page} is stale: run python scripts/update_readme.py"
    assert module.stale() == []
    faults = (DOCS / "faults.md").read_text(encoding="utf-8")
    slas = (DOCS / "slas.md").read_text(encoding="utf-8")
    assert "### `network.latency`" in faults and "### `kv_cleanup`" in slas
    assert "### `goodput`" in slas and "### `fluidity`" in slas


def test_the_sla_page_has_the_definitions_table_side_by_side_with_other_tools() -> None:
    from sla.definitions import DEFINITIONS, definitions_markdown

    slas = (DOCS / "slas.md").read_text(encoding="utf-8")
    sla_section = slas[slas.index("## SLA catalogue"):]
    assert definitions_markdown() in sla_section
    header = sla_section[sla_section.index("| ours |"):].splitlines()[0]
    assert "vLLM bench serve" in header and "AIPerf" in header
    for name in DEFINITIONS:
        assert f"| `{name}` |" in sla_section
    # the names that differ across tools are spelled out where a reader compares them
    tpot_row = next(line for line in sla_section.splitlines() if line.startswith("| `tpot` |"))
    assert "| TPOT |" in tpot_row and "Inter Token Latency (ITL)" in tpot_row


def test_readme_names_the_two_commands_that_exist() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for script in ("scripts/try", "scripts/test"):
        assert f"./{script}" in readme
        assert (ROOT / script).is_file()


def test_the_docs_have_the_profiles_the_support_matrix_and_how_to_point_it_at_a_stack() -> None:
    from chaos.model.engines import PROFILES
    from chaos.output.catalogue import fault_kinds
    from chaos.output.support import fault_support

    targets = (DOCS / "targets.md").read_text(encoding="utf-8")
    support = (DOCS / "support.md").read_text(encoding="utf-8")
    assert "# Pointing it at your stack" in targets.splitlines()
    for heading in ("## Engine profiles", "## Fault support", "## What each SLA needs"):
        assert heading in support
    for name in PROFILES:
        assert f"| `{name}` |" in support
    for kind in fault_kinds():
        assert f"| `{kind.kind}` |" in support
        assert "?" not in fault_support(kind.kind).values(), f"{kind.kind}: no entry in chaos/output/support.py NEEDS"
    assert fault_support("server.stall")["remote"] == "no" and fault_support("network.latency")["remote"] == "yes"


def test_the_readme_is_a_front_door() -> None:
    """What it is, the two commands, a first experiment, the command line, exit codes, links: the
    reference lives in docs/ (tests/test_docs_site.py builds it)."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move reference text into docs/"
    for heading in ("## Two commands for a fresh clone", "## Using it", "## The experiment format", "## Documentation"):
        assert heading in lines, heading
    text = "\n".join(lines)
    assert "Exit codes: **0**" in text


def test_the_cli_reference_is_the_parser_and_goes_stale_with_a_new_option(monkeypatch) -> None:
    """docs/cli.md names every command and option the parser has; an option added to the parser without
    regenerating the page makes it stale."""
    import argparse

    import chaos.cli

    module = _update_readme()
    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    root = chaos.cli._parser()
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        if name in ("stack", "toxiproxy"):
            continue
        assert f"### `streamchaos {name}`" in page, name
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help") and action.help != argparse.SUPPRESS:
                    assert f"`{option}" in page, f"docs/cli.md does not name streamchaos {name} {option}"
    assert "### `streamchaos stack serve`" in page and "`--kv-blocks KV_BLOCKS`" in page

    real = chaos.cli._parser

    def with_a_new_option() -> argparse.ArgumentParser:
        parser = real()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices["run"].add_argument("--brand-new", help="an option nobody documented")
        return parser

    monkeypatch.setattr(chaos.cli, "_parser", with_a_new_option)
    assert module.render(page, "docs/cli.md") != page
    assert "docs/cli.md" in module.stale()


def test_the_readme_says_what_to_do_with_an_inconclusive_run_on_a_busy_machine() -> None:
    """A newcomer on a busy box meets exit 3 first: the README names it and points at the CI advice."""
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    section = text[text.index("## Verdicts on a busy machine"):]
    section = section[:section.index("| experiment |")]  # the paragraph before the soak table
    assert "exits **3** (inconclusive)" in section and "[CI recipes](docs/ci.md)" in section, section
    assert "[ $? -eq 3 ]" in (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")  # the advice it points at
