"""`streamchaos validate` (validate_command) and `streamchaos list` (render_catalogue) output."""

from __future__ import annotations

import io
import re
from pathlib import Path

import experiment_cases as cases
import pytest

from chaos.experiment import validate_command
from chaos.model.errors import ExperimentInvalid
from chaos.output.catalogue import catalogue_markdown, fault_kinds, render_catalogue, sla_kinds

pytestmark = pytest.mark.timeout(30)


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_validate_prints_ok_and_exits_zero_when_all_valid(tmp_path: Path) -> None:
    paths = [_write(tmp_path, "a.yaml", cases.MINIMAL.text), _write(tmp_path, "b.yaml", cases.FULL.text)]
    out = io.StringIO()
    assert validate_command(paths, out) == 0
    assert out.getvalue() == f"OK {paths[0]}\nOK {paths[1]}\n"


def test_validate_prints_each_problem_as_file_line_col_path_message(tmp_path: Path) -> None:
    good = _write(tmp_path, "good.yaml", cases.MINIMAL.text)
    bad = _write(tmp_path, "bad.yaml", cases.MANY.text)
    out = io.StringIO()
    assert validate_command([good, bad], out) == 2
    lines = out.getvalue().splitlines()
    assert lines[0] == f"OK {good}"
    assert len(lines) == 1 + len(cases.MANY.expected)
    for line, (ln, col, path, fragment) in zip(lines[1:], cases.MANY.expected, strict=True):
        assert line.startswith(f"{bad}:{ln}:{col}: {path}: ")
        assert fragment in line
    assert lines[1] == f"{bad}:2:7: seed: expected an integer, found 'seven'"


def test_validate_reports_missing_files_and_syntax_errors_without_tracebacks(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.yaml")
    broken = _write(tmp_path, "broken.yaml", cases.SYNTAX.text)
    out = io.StringIO()
    assert validate_command([missing, broken], out) == 2
    text = out.getvalue()
    assert f"{missing}: cannot read the experiment file: No such file or directory\n" in text
    assert re.search(rf"^{re.escape(broken)}:4:1: invalid YAML: ", text, re.MULTILINE)
    assert "Traceback" not in text


def test_validate_without_files_is_a_usage_error() -> None:
    out = io.StringIO()
    assert validate_command([], out) == 2
    assert "give at least one experiment file" in out.getvalue()


def test_catalogue_lists_every_registered_kind_with_its_parameters() -> None:
    text = render_catalogue("all")
    kinds = fault_kinds() + sla_kinds()
    assert {"test.latency", "test.hangup", "test.slo"} <= {k.kind for k in kinds}
    for k in kinds:
        assert re.search(rf"^{re.escape(k.kind)}$", text, re.MULTILINE), k.kind
        for p in k.schema.params:
            assert re.search(rf"^    {re.escape(p.name)} ", text, re.MULTILINE), (k.kind, p.name)
    block = text.split("test.latency\n", 1)[1].split("\n\n", 1)[0]
    assert "test-only: delay every chunk through the proxy" in block
    assert re.search(r"latency\s+duration, e\.g\. 250ms\s+required\s+added delay", block)
    assert re.search(r"toxicity\s+fraction, e\.g\. 0\.3 or 30%\s+100%\s+share of connections", block)
    hangup = text.split("test.hangup\n", 1)[1].split("\n\n", 1)[0]
    assert "exactly one of: after_tokens, after" in hangup


def test_catalogue_sections_are_separate() -> None:
    faults_only, slas_only = render_catalogue("faults"), render_catalogue("slas")
    assert "test.latency" in faults_only and "test.slo" not in faults_only
    assert "test.slo" in slas_only and "test.latency" not in slas_only
    assert re.search(r"quantile\s+float \(>= 0\.5, <= 0\.999\)\s+0\.99", slas_only)
    targets_only = render_catalogue("targets")
    assert "docker" in targets_only and "test.latency" not in targets_only and "test.slo" not in targets_only
    with pytest.raises(ExperimentInvalid, match="expected one of faults, slas, targets, all, found 'fault'"):
        render_catalogue("fault")


def test_catalogue_markdown_has_a_table_row_per_parameter() -> None:
    md = catalogue_markdown()
    assert md.index("## Fault catalogue") < md.index("## SLA catalogue")
    for k in fault_kinds() + sla_kinds():
        assert f"### `{k.kind}`" in md
    assert "| `latency` | duration, e.g. 250ms |  | yes | added delay |" in md
    assert "| `toxicity` | fraction, e.g. 0.3 or 30% | `100%` |  | share of connections affected |" in md
    assert md == catalogue_markdown()  # deterministic, so the README check cannot flake
