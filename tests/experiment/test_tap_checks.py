"""The verifiers that read the stream hops' taps get a located error at load time when there is nothing to
tap: ``relay.over`` naming a hop the path does not have (the hops named), a gateway with no tapping
stream hop on one side, a stream hop with ``tap: false``, and ``abort_path`` on a path without one.
Each next to the form that loads."""

from __future__ import annotations

import pytest

from chaos.experiment import parse_experiment
from chaos.model.errors import ExperimentInvalid, Problem

pytestmark = pytest.mark.timeout(30)

HEAD = "name: taps\nphases:\n  - {name: only, duration: 1s}\n"
AROUND = "path:\n  - {kind: stream, name: outer}\n  - {kind: nginx}\n  - {kind: stream, name: inner}\n"


def _problems(text: str) -> list[Problem]:
    with pytest.raises(ExperimentInvalid) as info:
        parse_experiment(text, "exp.yaml")
    return list(info.value.problems)


def _one(text: str) -> Problem:
    (problem,) = _problems(text)
    return problem


def test_relay_over_a_gateway_between_two_stream_hops_loads() -> None:
    exp = parse_experiment(HEAD + AROUND + "sla:\n  - {kind: relay, over: nginx}\n  - {kind: abort_path}\n")
    assert [e.spec.kind for e in exp.sla] == ["relay", "abort_path"]
    # a stream hop judged on its own up against its own down needs nothing around it
    parse_experiment(HEAD + "path: [{kind: stream, name: edge}]\nsla:\n  - {kind: relay, over: edge}\n")


def test_relay_over_a_hop_the_path_does_not_have_names_the_hops() -> None:
    problem = _one(HEAD + AROUND + "sla:\n  - {kind: relay, over: ngnix}\n")
    assert (problem.file, problem.line, problem.path) == ("exp.yaml", 9, "sla[0].over")
    assert problem.message == ("relay over 'ngnix': not a hop of the path (did you mean 'nginx'?); its hops: "
                               "outer, nginx, inner")
    problem = _one(HEAD + "sla:\n  - {kind: relay, over: nginx}\n")
    assert problem.path == "sla[0].over" and "the experiment has no path" in problem.message


@pytest.mark.parametrize(("path", "where"), [
    ("[{kind: nginx}, {kind: stream}]", "between it and the load"),
    ("[{kind: stream}, {kind: nginx}]", "between it and the target"),
    ("[{kind: stream}, {kind: nginx}, {kind: toxiproxy}]", "between it and the target"),
])
def test_relay_over_a_gateway_with_no_stream_hop_on_one_side_is_a_tap_with_no_hop_to_tap(path: str,
                                                                                         where: str) -> None:
    problem = _one(HEAD + f"path: {path}\nsla:\n  - {{kind: relay, over: nginx}}\n")
    assert problem.path == "sla[0].over"
    assert problem.message == ("a tap with no hop to tap: relay over 'nginx' compares the stream hops on each side "
                               f"of it, and there is none {where}; put a {{kind: stream}} hop there in path:")


def test_a_stream_hop_that_does_not_tap_cannot_serve_relay() -> None:
    text = HEAD + "path: [{kind: stream, tap: false}, {kind: nginx}, {kind: stream, name: inner}]\n"
    problem = _one(text + "sla:\n  - {kind: relay, over: nginx}\n")
    assert problem.message == ("a tap with no hop to tap: relay over 'nginx' reads stream hop 'stream', which has "
                               "tap: false; remove tap: false")
    assert _one(text + "sla:\n  - {kind: relay, over: stream}\n").path == "sla[0].over"
    parse_experiment(text + "sla:\n  - {kind: relay, over: inner}\n")  # its own taps: judged alone


def test_abort_path_without_a_tapping_stream_hop_is_located_at_its_kind() -> None:
    for path in ("", "path: [{kind: nginx}]\n", "path: [{kind: stream, tap: false}]\n"):
        problem = _one(HEAD + path + "sla:\n  - {kind: errors}\n  - {kind: abort_path, budget: 1s}\n")
        assert problem.path == "sla[1].kind", path
        assert problem.message.startswith("a tap with no hop to tap: abort_path reads the stream hops' taps")
    parse_experiment(HEAD + "path: [{kind: stream}]\nsla:\n  - {kind: abort_path, budget: 1s}\n")


def test_every_tap_problem_is_reported_at_once_beside_the_others() -> None:
    problems = _problems(HEAD + "path: [{kind: nginx}]\nsla:\n  - {kind: relay, over: nginx}\n"
                         "  - {kind: abort_path}\n  - {kind: relay, over: gone}\n  - {kind: ttft, budget: 1}\n")
    assert [p.path for p in problems] == ["sla[0].over", "sla[1].kind", "sla[2].over", "sla[3].budget"]
