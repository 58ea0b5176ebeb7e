"""Explicit YAML tags (``!!timestamp``, ``!!bool``, ``!!binary``, ``!!set``, ``!!python/...``, ``!custom``)
and YAML's implicit types (a date, a bool) in any position: ``streamchaos validate`` answers exit 2 with
the value's file, line and key and what is wanted there, never a traceback.

Before issue 41 a value the YAML layer could not read (an unknown tag) was reported once there and
then left out of its section, whose verifier or fault was built without it: a ``TypeError`` traceback
from ``from_params`` (an SLA's ``quantile: !!python/name:os.system``, a fault's ``timeout: !custom 5``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.cli import main

# Each position is a line of _BASE holding one value: the placeholder is put in its place.
_BASE = """\
name: {name}
target: {{kind: builtin, model: tiny}}
load:
  concurrency: {number}
  max_tokens: 16
phases:
  - name: baseline
    duration: {duration}
    faults:
      - kind: client.timeout
        timeout: {fault}
sla:
  - kind: ttft
    quantile: {quantile}
    budget: 500ms
    phases: {list}
"""
_GOOD = {"name": "tagged", "number": "2", "duration": "2s", "fault": "100ms", "quantile": "p90", "list": "[baseline]"}
_POSITIONS = {  # placeholder → (line, key path as validate prints it)
    "name": (1, "name"),
    "number": (4, "load.concurrency"),
    "duration": (8, "phases[0].duration"),
    "fault": (11, "phases[0].faults[0].timeout"),
    "quantile": (14, "sla[0].quantile"),
    "list": (16, "sla[0].phases"),
}
_TAGGED = [
    "!!timestamp 2024-01-01",
    "2024-01-01 10:00:00",  # an implicit timestamp: a datetime, not a string
    "!!bool true",
    "!!binary aGVsbG8=",
    "!!set {a, b}",
    "!!omap [a: 1]",
    "!!pairs [a: 1, b: 2]",
    "!!python/name:os.system",
    "!!python/object/apply:os.system [ls]",
    "!custom 5",
    "!!float .inf",
    "&loop [*loop]",  # an alias into the list that holds it
]


def test_the_base_experiment_is_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "good.yaml"
    path.write_text(_BASE.format(**_GOOD))
    assert main(["validate", str(path)]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("where", sorted(_POSITIONS))
@pytest.mark.parametrize("value", _TAGGED)
def test_a_tagged_value_of_the_wrong_type_is_a_located_problem(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, value: str) -> None:
    path = tmp_path / "tagged.yaml"
    path.write_text(_BASE.format(**{**_GOOD, where: value}))
    code = main(["validate", str(path)])
    out = capsys.readouterr()
    text = out.out + out.err
    line, key = _POSITIONS[where]
    assert "Traceback" not in text
    assert code == 2, text
    located = [row for row in text.splitlines() if row.startswith(f"{path}:{line}:") and f" {key}: " in row]
    assert located, f"no problem at line {line} for {key}:\n{text}"
    # what would be right: the kind of value wanted there, or how to write it without the tag
    right = ("expected", "must", "without the tag", "a cycle", "required key", "allowed:")
    assert any(word in row for row in located for word in right), located
