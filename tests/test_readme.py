"""The README's catalogues are generated from the registries and cannot drift."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_catalogue_matches_the_registries() -> None:
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "scripts" / "update_readme.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert module.render(readme) == readme, "README catalogue is stale: run python scripts/update_readme.py"
    assert "### `network.latency`" in readme and "### `kv_cleanup`" in readme
    assert "### `goodput`" in readme and "### `fluidity`" in readme


def test_readme_sla_section_has_the_definitions_table_side_by_side_with_other_tools() -> None:
    from sla.definitions import DEFINITIONS, definitions_markdown

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    sla_section = readme[readme.index("## SLA catalogue"):]
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


def test_readme_has_the_profiles_the_support_matrix_and_how_to_point_it_at_a_stack() -> None:
    from chaos.catalogue import fault_kinds
    from chaos.engines import PROFILES
    from chaos.support import fault_support

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for heading in ("### Pointing it at your stack", "## Engine profiles", "## Fault support", "## What each SLA needs"):
        assert heading in readme
    for name in PROFILES:
        assert f"| `{name}` |" in readme
    for kind in fault_kinds():
        assert f"| `{kind.kind}` |" in readme
        assert "?" not in fault_support(kind.kind).values(), f"{kind.kind}: no entry in chaos/support.py NEEDS"
    assert fault_support("server.stall")["remote"] == "no" and fault_support("network.latency")["remote"] == "yes"
