"""`duration: {min, max}` and `until: decided`: phases that run until their verdicts decide, and the
mistakes in writing them, each located by file, line and key."""

from __future__ import annotations

import pytest

from chaos.experiment import parse_experiment
from chaos.model.errors import ExperimentInvalid


def test_a_fixed_a_ranged_and_an_until_decided_phase() -> None:
    exp = parse_experiment("""\
name: x
phases:
  - name: a
    duration: {min: 4s, max: 60s}
  - name: b
    duration: 2s
    until: decided
  - name: c
    duration: 3s
""")
    a, b, c = exp.phases
    assert (a.duration, a.max_duration) == (4.0, 60.0)
    assert (b.duration, b.max_duration) == (2.0, 20.0)  # until: decided: at most 10x the duration
    assert (c.duration, c.max_duration) == (3.0, None)
    assert exp.duration == 9.0 and exp.longest == 83.0
    assert a.length_text() == "4s–60s until decided" and c.length_text() == "3s"


@pytest.mark.parametrize(("phase", "where", "fragment"), [
    ("duration: {min: 4s}", "4:15: phases[0].duration", "missing required key 'max'"),
    ("duration: {max: 4s}", "4:15: phases[0].duration", "missing required key 'min'"),
    ("duration: {min: 8s, max: 2s}", "4:30: phases[0].duration.max", "must be at least min (8s), found 2s"),
    ("duration: {min: 1s, max: 2s, mx: 3s}", "4:34: phases[0].duration.mx", "unknown key 'mx' (did you mean 'max'?)"),
    ("duration: {min: 0s, max: 2s}", "4:21: phases[0].duration.min", "must be greater than zero"),
    ("duration: {min: 1s, max: fast}", "4:30: phases[0].duration.max", "expected a duration"),
    ("duration: 2s\n    until: forever", "5:12: phases[0].until", "expected one of decided, found 'forever'"),
    ("duration: [1s, 2s]", "4:15: phases[0].duration", "duration"),
])
def test_mistakes_in_a_phase_length_are_located(phase: str, where: str, fragment: str) -> None:
    text = f"name: x\nphases:\n  - name: a\n    {phase}\n"
    with pytest.raises(ExperimentInvalid) as caught:
        parse_experiment(text, "exp.yaml")
    message = str(caught.value)
    assert f"exp.yaml:{where}" in message and fragment in message, message


def test_the_hard_stop_must_leave_a_phase_its_max() -> None:
    with pytest.raises(ExperimentInvalid) as caught:
        parse_experiment("name: x\nphases:\n  - name: a\n    duration: {min: 4s, max: 5m}\n"
                         "safety: {max_duration: 2m}\n", "exp.yaml")
    assert "phases 300s at their max" in str(caught.value) and "safety.max_duration" in str(caught.value)
