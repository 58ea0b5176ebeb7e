"""The stream.h2_* fault kinds (faults/h2.py) without a hop process: their parameters in units and on the wire,
the checks at load time (the hop must speak HTTP/2), the dry run's account. What each does to real HTTP/2
streams and connections: tests/hops/runs/test_streamhop_h2.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import faults  # noqa: F401  (registers every kind)
from chaos.experiment import experiment_from_dict, parse_experiment
from chaos.hops.streamhop.rules import H2_ERRORS, H2_LEAK_HOWS
from chaos.hops.streamhop.rules import KINDS as RULE_KINDS
from chaos.model.context import HopInfo, Scene, TargetInfo
from chaos.model.errors import ExperimentInvalid
from chaos.model.experiment import Experiment, HopSpec
from faults.base import REGISTRY
from faults.h2 import H2Fault

KINDS = ("stream.h2_rst_stream", "stream.h2_goaway", "stream.h2_max_streams", "stream.h2_window",
         "stream.h2_header_leak")
MINIMAL: dict[str, dict[str, Any]] = {
    "stream.h2_rst_stream": {"after_events": 3, "error": "cancel"},
    "stream.h2_goaway": {"after_streams": 100},
    "stream.h2_max_streams": {"streams": 2},
    "stream.h2_window": {"window": "1KiB", "seconds": "3s"},
    "stream.h2_header_leak": {"how": "neighbour", "share": "25%"},
}
TARGET = TargetInfo(kind="openai", base_url="http://127.0.0.1:1/v1")


def spec(kind: str, **raw: Any) -> H2Fault:
    values, problems = REGISTRY[kind].schema.parse(raw)
    assert problems == [], problems
    fault = REGISTRY[kind].from_params(kind.replace(".", "-"), values)
    assert isinstance(fault, H2Fault)
    return fault


def path_of(*hops: HopSpec) -> Experiment:
    base = experiment_from_dict({"name": "n", "phases": [{"name": "a", "duration": "1s"}]})
    return replace(base, path=hops)


H2_HOP = HopSpec(kind="stream", name="edge", options=(("http", "2"),))


def test_every_kind_is_registered_and_its_wire_params_are_the_hops() -> None:
    wire = {kind: spec(kind, **MINIMAL[kind]).rule_params() for kind in KINDS}
    assert wire == {
        "stream.h2_rst_stream": {"after_events": 3, "error": "cancel"},
        "stream.h2_goaway": {"after_streams": 100},
        "stream.h2_max_streams": {"streams": 2},
        "stream.h2_window": {"bytes": 1024, "seconds": 3.0},
        "stream.h2_header_leak": {"how": "neighbour"},
    }
    for kind in KINDS:
        rule_kind = REGISTRY[kind].rule_kind  # type: ignore[attr-defined]
        assert rule_kind == kind.split(".")[1] and set(wire[kind]) == set(RULE_KINDS[rule_kind])
    assert spec("stream.h2_header_leak", **MINIMAL["stream.h2_header_leak"]).share == 0.25
    assert spec("stream.h2_rst_stream").rule_params() == {"after_events": 1, "error": "internal_error"}
    assert spec("stream.h2_header_leak").rule_params() == {"how": "drop"}
    assert spec("stream.h2_goaway").rule_params() == {"after_streams": None}


@pytest.mark.parametrize("kind, raw, key, words", [
    ("stream.h2_rst_stream", {"error": "boom"}, "error", "expected one of"),
    ("stream.h2_max_streams", {}, "", "missing required key 'streams'"),
    ("stream.h2_max_streams", {"streams": 5000}, "streams", "at most 1000"),
    ("stream.h2_window", {"window": "3GiB", "seconds": "1s"}, "window", "at most"),
    ("stream.h2_window", {"window": "1KiB"}, "", "missing required key 'seconds'"),
    ("stream.h2_goaway", {"after_streams": 0}, "after_streams", "at least 1"),
    ("stream.h2_header_leak", {"how": "swap"}, "how", "expected one of"),
])
def test_the_schema_refuses_bad_values(kind: str, raw: dict[str, Any], key: str, words: str) -> None:
    _, problems = REGISTRY[kind].schema.parse(raw)
    assert [k for k, _ in problems] == [key], problems
    assert words in problems[0][1]


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_needs_a_stream_hop_that_speaks_http2(kind: str) -> None:
    fault = spec(kind, **MINIMAL[kind])
    assert fault.problems(path_of(H2_HOP)) == []
    problems = fault.problems(path_of(HopSpec(kind="stream", name="edge")))
    assert [k for k, _ in problems] == ["hop"] and "`http: 2`" in problems[0][1]
    assert [k for k, _ in fault.problems(path_of())] == ["kind"]  # no stream hop at all


def test_the_choices_are_the_hops_own() -> None:
    def choices(kind: str, name: str) -> tuple[str, ...]:
        return next(p.choices for p in REGISTRY[kind].schema.params if p.name == name)

    assert choices("stream.h2_rst_stream", "error") == H2_ERRORS
    assert choices("stream.h2_header_leak", "how") == H2_LEAK_HOWS


def test_an_experiment_with_h2_faults_loads_and_one_on_an_http11_hop_is_located() -> None:
    text = """
name: h2
target: {kind: builtin, model: tiny}
path:
  - {kind: stream, name: edge, http: 2, tls: true}
phases:
  - name: faulted
    duration: 2s
    faults:
      - {kind: stream.h2_goaway, after_streams: 50}
      - {kind: stream.h2_max_streams, streams: 4}
      - {kind: stream.h2_window, window: 1KiB, seconds: 2s, share: 50%}
      - {kind: stream.h2_header_leak, share: 25%}
      - {kind: stream.h2_rst_stream, after_events: 5, error: cancel}
"""
    exp = parse_experiment(text, "h2.yaml")
    assert exp.path[0].option("http") == "2" and exp.path[0].option("tls") is True
    with pytest.raises(ExperimentInvalid, match="speaks HTTP/1.1"):
        parse_experiment(text.replace("http: 2, tls: true", "http: 1.1"), "h1.yaml")


def test_the_dry_run_says_what_each_changes() -> None:
    hop = HopInfo(name="edge", kind="stream", listen="127.0.0.1:8", upstream="http://127.0.0.1:1",
                  control_url="http://127.0.0.1:9/", control_token="t")
    scene = Scene(target=TARGET, hops=(hop,))
    words = {kind: spec(kind, **MINIMAL[kind]).describe(scene).changes for kind in KINDS}
    assert "RST_STREAM CANCEL" in words["stream.h2_rst_stream"]
    assert "GOAWAY" in words["stream.h2_goaway"] and "100 streams" in words["stream.h2_goaway"]
    assert "2 streams at once" in words["stream.h2_max_streams"] and "REFUSED_STREAM" in words["stream.h2_max_streams"]
    assert "1024 bytes" in words["stream.h2_window"] and "3s after it opened" in words["stream.h2_window"]
    assert "neighbour" in words["stream.h2_header_leak"] and "25% of requests" in words["stream.h2_header_leak"]
    assert "released at once" in spec("stream.h2_max_streams", streams=1).describe(scene).undo
