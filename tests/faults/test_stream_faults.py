"""The stream.* fault kinds without a hop process: their parameters in units and on the wire, the checks
at load time (located at file:line:col), which hop each acts on, the dry run's account, and rollback
when the hop is gone. What each kind does to a real stream: tests/hops/runs/test_stream_fault_kinds.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import faults  # noqa: F401  (registers every kind)
from chaos.experiment import experiment_from_dict, parse_experiment
from chaos.host.procs import start_time
from chaos.model.context import HopInfo, RunContext, Scene, TargetInfo
from chaos.model.errors import ExperimentInvalid, FaultUnsupported
from chaos.model.experiment import Experiment, HopSpec
from faults.base import REGISTRY
from faults.stream import StreamFault, pick_hop

KINDS = ("stream.hold", "stream.silence", "stream.cut", "stream.status", "stream.drop", "stream.duplicate",
         "stream.split", "stream.rewrite", "stream.deadline")
TOKEN = "hop-token-never-journaled"
TARGET = TargetInfo(kind="openai", base_url="http://127.0.0.1:1/v1")


def spec(kind: str, **raw: Any) -> StreamFault:
    values, problems = REGISTRY[kind].schema.parse(raw)
    assert problems == [], problems
    fault = REGISTRY[kind].from_params(kind.replace(".", "-"), values)
    assert isinstance(fault, StreamFault)
    return fault


def path_of(*hops: tuple[str, str]) -> Experiment:
    base = experiment_from_dict({"name": "n", "phases": [{"name": "a", "duration": "1s"}]})
    return replace(base, path=tuple(HopSpec(kind=kind, name=name) for kind, name in hops))


def hop_info(name: str = "stream", control_url: str | None = "http://127.0.0.1:9/", pid: int | None = None) -> HopInfo:
    return HopInfo(name=name, kind="stream", listen="127.0.0.1:8", upstream="http://127.0.0.1:1",
                   control_url=control_url, control_token=TOKEN, pid=pid)


MINIMAL: dict[str, dict[str, Any]] = {
    "stream.hold": {"seconds": "7s", "keepalive": "2s"},
    "stream.silence": {"after_events": 3, "seconds": "5s"},
    "stream.cut": {"after_events": 4, "how": "reset"},
    "stream.status": {"code": 429, "retry_after": "2s"},
    "stream.drop": {"share_events": "20%", "skip_first": 2},
    "stream.duplicate": {"share_events": 0.5},
    "stream.split": {"inside_utf8": True},
    "stream.rewrite": {"gzip": True, "gzip_buffer": "4KiB", "remove": ["x-accel-buffering"]},
    "stream.deadline": {"seconds": "15s", "how": "clean"},
}


def test_every_kind_is_registered_with_units_in_yaml_and_seconds_on_the_wire() -> None:
    assert set(KINDS) <= set(REGISTRY) and set(MINIMAL) == set(KINDS)
    wire = {kind: spec(kind, **MINIMAL[kind]).rule_params() for kind in KINDS}
    assert wire["stream.hold"] == {"seconds": 7.0, "keepalive_s": 2.0, "headers": "send"}
    assert wire["stream.silence"] == {"after_events": 3, "seconds": 5.0, "keepalive_s": None, "during": "any"}
    assert wire["stream.status"] == {"code": 429, "retry_after_s": 2.0, "storm_above": None}
    assert wire["stream.drop"] == {"share_events": 0.2, "skip_first": 2}
    assert wire["stream.rewrite"] == {"content_type": None, "gzip": True, "gzip_buffer_bytes": 4096,
                                      "x_accel_buffering": None, "remove": ["x-accel-buffering"]}
    assert wire["stream.deadline"] == {"seconds": 15.0, "how": "clean"}
    assert {REGISTRY[k].rule_kind for k in KINDS} == {k.split(".")[1] for k in KINDS}  # type: ignore[attr-defined]
    for kind in KINDS:  # hop and share: every kind takes them, share defaults to every request
        assert spec(kind, **MINIMAL[kind]).share == 1.0 and spec(kind, **MINIMAL[kind]).hop is None


@pytest.mark.parametrize("kind, raw, key, words", [
    ("stream.hold", {"seconds": "-1s"}, "seconds", "negative"),
    ("stream.hold", {"seconds": "7"}, "seconds", "unit"),
    ("stream.hold", {"seconds": "2s", "share": 1.5}, "share", "between 0 and 1"),
    ("stream.cut", {"how": "eof"}, "how", "expected one of"),
    ("stream.silence", {"seconds": "1s", "after_events": -1}, "after_events", "at least 0"),
    ("stream.rewrite", {"gzip_buffer": "0B", "gzip": True}, "gzip_buffer", "at least 1"),
    ("stream.silence", {"seconds": "25h"}, "seconds", "at most 86400"),  # the hop's limit
])
def test_the_schema_refuses_bad_values(kind: str, raw: dict[str, Any], key: str, words: str) -> None:
    _, problems = REGISTRY[kind].schema.parse(raw)
    assert [k for k, _ in problems] == [key]
    assert words in problems[0][1]


@pytest.mark.parametrize("kind, raw, key, words", [
    ("stream.hold", {"seconds": "2s", "keepalive": "2s"}, "keepalive", "not shorter than the hold"),
    ("stream.hold", {"seconds": "0s", "keepalive": "1s"}, "keepalive", "not shorter than the hold"),
    ("stream.hold", {"seconds": "5s", "keepalive": "5ms"}, "keepalive", "at least 10ms"),
    ("stream.hold", {"seconds": "5s", "keepalive": "1s", "headers": "hold"}, "keepalive", "needs headers: send"),
    ("stream.silence", {"seconds": "1s", "keepalive": "3s"}, "keepalive", "not shorter than the silence"),
    ("stream.status", {"code": 200}, "code", "not an error"),
    ("stream.status", {"code": 404}, "code", "429, 500, 502, 503, 504"),
    ("stream.rewrite", {}, "", "changes nothing"),
    ("stream.rewrite", {"gzip_buffer": "4KiB", "remove": ["a"]}, "gzip_buffer", "only with gzip"),
    ("stream.rewrite", {"remove": ["bad name"]}, "remove", "not a header name"),
    ("stream.rewrite", {"gzip_buffer": "2MiB", "gzip": True}, "gzip_buffer", "at most 1MiB"),  # the hop's limit
    ("stream.rewrite", {"content_type": "text/plain\r\nx: y"}, "content_type", "control characters"),
    ("stream.deadline", {"seconds": "0s"}, "seconds", "longer than 0s"),
])
def test_the_cross_checks_of_each_kind(kind: str, raw: dict[str, Any], key: str, words: str) -> None:
    problems = spec(kind, **raw).problems(path_of(("stream", "stream")))
    assert [k for k, _ in problems] == [key], problems
    assert words in problems[0][1]


def test_a_rule_name_the_hop_would_refuse() -> None:
    fault = replace(spec("stream.cut"), name="a/b")
    assert [k for k, _ in fault.problems(path_of(("stream", "stream")))] == ["name"]


def test_the_choices_are_the_hops_own() -> None:
    from chaos.hops.streamhop.rules import CUT_HOWS, DEADLINE_HOWS
    from chaos.hops.streamhop.rules import KINDS as RULE_KINDS
    from faults.stream import CUT_WORDS, DEADLINE_WORDS

    assert tuple(CUT_WORDS) == CUT_HOWS and tuple(DEADLINE_WORDS) == DEADLINE_HOWS
    for kind in KINDS:  # every parameter on the wire is one the hop's rule kind takes
        assert set(spec(kind, **MINIMAL[kind]).rule_params()) == set(RULE_KINDS[kind.split(".")[1]])


def test_the_disarmed_forms_are_valid() -> None:
    exp = path_of(("stream", "stream"))
    disarmed: list[tuple[str, dict[str, Any]]] = [
        ("stream.hold", {"seconds": "0s"}), ("stream.silence", {"seconds": "1s", "after_events": 10_000}),
        ("stream.drop", {"share": 0}), ("stream.status", {"share": "0%"}), ("stream.cut", {"after_events": 10_000})]
    for kind, raw in disarmed:
        assert spec(kind, **raw).problems(exp) == []


def test_which_hop_a_fault_acts_on() -> None:
    one = path_of(("toxiproxy", "toxiproxy"), ("stream", "edge"))
    two = path_of(("stream", "outer"), ("nginx", "nginx"), ("stream", "inner"))
    assert pick_hop("stream.cut", None, one.path)[0] == one.path[1]  # the only stream hop
    assert pick_hop("stream.cut", "inner", two.path)[0] == two.path[2]
    none, why = pick_hop("stream.cut", None, two.path)
    assert none is None and why == ("hop", "the path has 2 stream hops (outer, inner): say which one stream.cut "
                                           "acts on with `hop:`")
    _, why = pick_hop("stream.cut", "nginx", two.path)
    assert why is not None and why[0] == "hop" and "is a nginx hop" in why[1] and "outer, inner" in why[1]
    _, why = pick_hop("stream.cut", "iner", two.path)
    assert why is not None and "did you mean 'inner'" in why[1] and "nginx (nginx)" in why[1]
    _, why = pick_hop("stream.cut", None, path_of(("nginx", "nginx")).path)
    assert why is not None and why[0] == "kind" and "path: [{kind: stream}]" in why[1] and "nginx (nginx)" in why[1]
    _, why = pick_hop("stream.cut", None, ())
    assert why is not None and "no `path:`" in why[1]


YAML = """\
name: located
path:
  - kind: nginx
phases:
  - name: a
    duration: 1s
    faults:
      - kind: stream.hold
        seconds: 7s
"""


def test_a_stream_fault_without_a_stream_hop_is_a_located_error() -> None:
    with pytest.raises(ExperimentInvalid) as caught:
        parse_experiment(YAML, "x.yaml")
    (problem,) = caught.value.problems
    assert (problem.file, problem.line, problem.path) == ("x.yaml", 8, "phases[0].faults[0].kind")
    assert "stream.hold acts on a stream hop and there is none" in problem.message


def test_a_hop_naming_a_gateway_is_a_located_error() -> None:
    text = YAML.replace("  - kind: nginx\n", "  - kind: stream\n  - kind: nginx\n") + "        hop: nginx\n"
    with pytest.raises(ExperimentInvalid) as caught:
        parse_experiment(text, "x.yaml")
    (problem,) = caught.value.problems
    assert (problem.line, problem.path) == (11, "phases[0].faults[0].hop")
    assert "hop 'nginx' is a nginx hop" in problem.message
    assert parse_experiment(text.replace("hop: nginx", "hop: stream"), "x.yaml").path[0].kind == "stream"


def test_activation_needs_the_hop_in_the_run() -> None:
    fault = spec("stream.cut", hop="inner")
    with pytest.raises(FaultUnsupported, match="no hop named 'inner'"):
        fault.activate(RunContext(seed=1, target=TARGET, run_dir=Path("."), hops=(hop_info("outer"),)))
    with pytest.raises(FaultUnsupported, match="no control API"):
        fault.activate(RunContext(seed=1, target=TARGET, run_dir=Path("."), hops=(hop_info("inner", None),)))


def test_the_plan_is_seeded_from_the_run_and_the_fault_name(tmp_path: Path) -> None:
    def plan(seed: int, name: str) -> dict[str, Any]:
        fault = replace(spec("stream.drop", share=0.5), name=name)
        return fault.activate(RunContext(seed=seed, target=TARGET, run_dir=tmp_path, hops=(hop_info(),))).plan()

    first = plan(1, "drop")
    assert first == plan(1, "drop")
    assert first["seed"] != plan(2, "drop")["seed"] and first["seed"] != plan(1, "drop-2")["seed"]
    assert {k: first[k] for k in ("hop_control", "hop", "rule", "rule_kind", "share")} == {
        "hop_control": "http://127.0.0.1:9/", "hop": "stream", "rule": "drop", "rule_kind": "drop", "share": 0.5}
    assert TOKEN not in json.dumps(first)


def test_the_dry_run_says_what_changes_and_how_it_is_undone() -> None:
    scene = Scene(target=TARGET, hops=(hop_info(),))
    hold = spec("stream.hold", seconds="7s", keepalive="2s", share=0.25).describe(scene)
    assert hold.refused is None
    assert "sets rule 'stream-hold' (hold) on stream hop 'stream'" in hold.changes
    assert "25% of requests" in hold.changes and "7s after the upstream sent it" in hold.changes
    assert "`: keep-alive` every 2s" in hold.changes
    assert "deletes rule 'stream-hold'" in hold.undo and "finishes as planned" in hold.undo
    assert "released at once" in spec("stream.deadline", seconds="15s").describe(scene).undo
    cut = spec("stream.cut", after_events=3, how="bare_eof").describe(scene)
    assert "after 3 events" in cut.changes and "truncated HTTP 200" in cut.changes
    refused = spec("stream.cut").describe(Scene(target=TARGET))
    assert refused.refused is not None and "path: [{kind: stream}]" in refused.refused
    for kind in KINDS:  # every kind has its own words
        assert spec(kind, **MINIMAL[kind]).describe(scene).changes


def test_rollback_says_the_rule_died_with_a_hop_that_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = REGISTRY["stream.hold"]
    assert cls.rollback({})["skipped"] == "no stream hop recorded"
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    done = cls.rollback({"hop_control": url, "rule": "hold", "hop": "stream"})
    assert "died with it" in done["skipped"]
    with socket.create_server(("127.0.0.1", 0)) as listening:  # a port that answers, whatever holds it
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        proc.wait()  # a hop process that has exited: its pid no longer has the recorded start time
        done = cls.rollback({"hop_control": url, "rule": "hold", "hop": "stream", "pid": proc.pid, "start_time": 1})
        assert "died with it" in done["skipped"]
        me = {"hop_control": url, "rule": "hold", "hop": "stream", "pid": os.getpid(),
              "start_time": start_time(os.getpid())}  # a live process: only the token is missing
        monkeypatch.delenv("STREAMCHAOS_HOP_TOKEN", raising=False)
        assert "STREAMCHAOS_HOP_TOKEN is not set" in cls.rollback(me)["skipped"]


def test_rollback_contacts_no_address_but_loopback() -> None:
    """A journal is data: a stream fault's plan naming another host is refused without a connection."""
    cls = REGISTRY["stream.hold"]
    done = cls.rollback({"hop_control": "http://192.0.2.7:8474/", "rule": "hold", "hop": "stream"})
    assert "loopback only" in done["skipped"], done
