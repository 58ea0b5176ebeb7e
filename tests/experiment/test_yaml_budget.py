"""YAML budgets: alias bombs, huge files, deep nesting and long integers end in one located error, exit 2.

Each case runs ``python -m chaos validate`` in a child whose address space is capped (RLIMIT_AS) and
whose run time is bounded, so the old unbudgeted reader's failure shows as what it was: a
MemoryError traceback (exit 1) or a hang, where the budgeted one answers at once with exit 2.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from chaos.experiment import parse_experiment
from chaos.experiment.yamlpos import Budget, YamlSyntaxError, YamlTooLarge, load_bounded, load_located
from chaos.model.errors import ExperimentInvalid

# The interpreter plus numpy/scipy (imported by the SLA registry) reserve about 300 MiB of address
# space with one BLAS thread; 512 MiB leaves room for a few MB of YAML and nothing like an alias bomb.
ADDRESS_SPACE = 512 << 20
HANG_GUARD_S = 60.0  # not a speed check: only stops the old code's minutes-long expansion


def _bomb(size: int) -> str:
    """A billion-laughs experiment of exactly ``size`` bytes: as many levels of 9 aliases as fit."""
    lines = ["name: bomb", "phases: [{name: a, duration: 1s}]", "l0: &l0 [x,x,x,x,x,x,x,x,x]"]
    while True:
        i = len(lines) - 2
        more = lines + [f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]"]
        if len("\n".join(more)) + 3 > size:
            break
        lines = more
    text = "\n".join(lines) + "\n"
    return text + "#" + "x" * (size - len(text) - 2) + "\n"


def _merge_bomb() -> str:
    lines = ["name: bomb", "phases: [{name: a, duration: 1s}]", "m0: &m0 {a: 1, b: 2, c: 3, d: 4}"]
    lines += [f"m{i}: &m{i} {{<<: [" + ",".join([f"*m{i - 1}"] * 8) + "]}" for i in range(1, 8)]
    return "\n".join(lines) + "\n"


def _ten_megabytes() -> str:
    head = "name: big\nphases:\n"
    row = "  - {name: a, duration: 1s}\n"
    return head + row * ((10_000_000 - len(head)) // len(row))


CASES: dict[str, tuple[Callable[[], str], str]] = {
    "alias-bomb-345B": (lambda: _bomb(345), "expand the document to more than"),
    "alias-bomb-395B": (lambda: _bomb(395), "expand the document to more than"),
    "merge-key-bomb": (_merge_bomb, "expand the document to more than"),
    "10MB-file": (_ten_megabytes, "experiment files may be at most 256 KiB"),
    "100k-deep": (lambda: "name: x\nseed: " + "[" * 100_000 + "\n", "nested more than 64 levels deep"),
    "5000-digit-int": (lambda: "name: x\nphases: [{name: a, duration: 1s}]\nseed: " + "7" * 5000 + "\n",
                       "at most 32 are read"),
}


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_file_gets_one_located_error_and_exit_2(case: str, tmp_path: Path) -> None:
    build, expected = CASES[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(build(), encoding="utf-8")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "chaos", "validate", str(path)], capture_output=True, text=True,
            timeout=HANG_GUARD_S, preexec_fn=_limit_memory, env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"validate {case} still running after {HANG_GUARD_S:g}s")
    out = done.stdout + done.stderr
    assert "Traceback" not in out and "MemoryError" not in out, out[-2000:]
    assert done.returncode == 2, out[-2000:]
    lines = [line for line in done.stdout.splitlines() if expected in line]
    assert len(lines) == 1, out[-2000:]
    where = lines[0].split(": ", 1)[0]  # FILE:LINE:COL
    file, line, column = where.rsplit(":", 2)
    assert file == str(path) and int(line) >= 2 and int(column) >= 1, lines[0]


def test_alias_bomb_error_names_the_key_path() -> None:
    with pytest.raises(ExperimentInvalid) as caught:
        parse_experiment(_bomb(345), "bomb.yaml")
    (problem,) = caught.value.problems
    assert re.fullmatch(r"l\d(\[\d\])+", problem.path) and "alias" in problem.message, problem


def test_budget_is_a_parameter_and_a_sane_document_fits() -> None:
    text = "a: &a [1, 2, 3]\nb: [*a, *a]\n"
    assert load_bounded(text) == {"a": [1, 2, 3], "b": [[1, 2, 3], [1, 2, 3]]}
    with pytest.raises(YamlTooLarge) as caught:
        load_bounded(text, Budget(max_expanded=8))
    assert caught.value.path[0] == "b"
    with pytest.raises(YamlTooLarge):
        load_bounded(text, Budget(max_nodes=5))
    with pytest.raises(YamlTooLarge) as size:
        load_located("a: 1\nb: 22\n", Budget(max_bytes=8))
    assert (size.value.mark.line, size.value.mark.column) == (2, 4)  # the 9th byte


def test_load_bounded_reports_structural_problems() -> None:
    with pytest.raises(YamlSyntaxError) as caught:
        load_bounded("a: 1\na: 2\n")
    assert "duplicate key" in caught.value.message and caught.value.mark.line == 2


def test_verify_sla_override_is_budgeted(tmp_path: Path) -> None:
    from chaos.cli import _load_sla_override

    exp = tmp_path / "experiment.yaml"
    exp.write_text("name: x\nphases: [{name: a, duration: 1s}]\n", encoding="utf-8")
    sla = tmp_path / "sla.yaml"
    sla.write_text(_bomb(395), encoding="utf-8")
    with pytest.raises(ExperimentInvalid, match="alias"):
        _load_sla_override(exp, sla)
