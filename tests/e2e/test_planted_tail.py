"""A server whose first tokens have a slow tail (3% wait 1.5 s) fails the shipped tail check, the
``ttft-tail`` experiment's ``ttft_tail`` (p99 within 1 s), while its p75 check passes: the tail is what only a
p99 sees, and a phase that runs until decided gets the samples a p99 needs."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.api import run
from chaos.experiment import load_experiment
from chaos.stack.process import StackProcess

HERE = Path(__file__).parent
TAIL = HERE.parents[1] / "experiments" / "ttft-tail.yaml"

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def slow_tail() -> Iterator[str]:
    stack = StackProcess.start(command=[sys.executable, str(HERE / "planted_tail.py"), "--port", "0"], timeout=60.0)
    try:
        yield stack.url
    finally:
        stack.close()


def test_a_3_percent_tail_of_1_5_s_first_tokens_fails_the_shipped_tail_check(slow_tail: str, tmp_path: Path) -> None:
    result = run(load_experiment(TAIL), target_url=slow_tail, out_dir=tmp_path / "run", handle_signals=False)
    by_name = {v.name or v.sla: v for v in result.verdicts}
    tail = by_name["ttft_tail"]
    assert tail.status == "fail", tail.evidence.get("reason")
    assert tail.evidence["lower"] > 1.0  # the p99's lower bound is past the budget: a decided fail
    assert by_name["ttft"].status == "pass"  # the p75 does not see it
    window = result.observations.phase("baseline")
    assert window is not None and window.looks >= 1 and window.stopped_by == "decided"
    assert tail.evidence["sequential"]["looks"] == window.looks
    assert result.exit_code == 1
