"""A probe's verdict from what the client and the taps saw: how the client saw a cut, which hop cut
(the segment outward of the outermost stream hop whose client left, else the first hop from the
target outward that did not pass the whole stream on), the rule each dimension sets, the path check,
and the page that shows the matrix."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from chaos.model.context import HopInfo
from chaos.model.errors import UsageError
from chaos.model.experiment import Experiment, HopSpec
from chaos.model.observations import NS, ErrorInfo, StreamRecord, TapRecord
from chaos.survival.probe import DIMENSIONS, client_saw, cut_by, hint_s, rule_for
from chaos.survival.run import SurvivalSettings, check_path, dimensions_of

pytestmark = pytest.mark.timeout(30)

T0 = 1000 * NS


def hop(name: str, kind: str) -> HopInfo:
    return HopInfo(name=name, kind=kind, listen="127.0.0.1:1", upstream="http://127.0.0.1:2")


PATH = (hop("outer", "stream"), hop("nginx", "nginx"), hop("inner", "stream"))


def tap(name: str, up_end: str = "done", down_end: str = "done", gone: bool = False) -> TapRecord:
    return TapRecord(hop=name, seq=1, request_id="r", target="/v1/completions", t_accept=T0, up_end=up_end,
                     down_end="client_gone" if gone else down_end, t_client_gone=T0 + 5 * NS if gone else None)


def test_the_gateway_that_closed_on_the_inner_stream_hop_is_named() -> None:
    taps = {"outer": tap("outer", up_end="bare_eof", down_end="bare_eof"), "inner": tap("inner", gone=True)}
    assert cut_by(PATH, taps) == "nginx"


def test_a_client_that_gave_up_is_named_not_a_hop() -> None:
    taps = {"outer": tap("outer", gone=True), "inner": tap("inner", gone=True)}
    assert cut_by(PATH, taps) == "the client"
    two_gateways = (hop("lb", "haproxy"), *PATH)
    assert cut_by(two_gateways, taps) == "lb"


def test_a_cut_from_inside_names_the_target_or_the_hop_that_did_not_pass_it_on() -> None:
    assert cut_by(PATH, {"outer": tap("outer", "bare_eof", "bare_eof"), "inner": tap("inner", "reset", "bare_eof")}) \
        == "the target"
    # inner passed the whole stream on, outer did not receive it whole: nginx (e.g. it lost [DONE])
    assert cut_by(PATH, {"outer": tap("outer", "eof", "eof"), "inner": tap("inner")}) == "nginx"
    # a stream hop that received it whole and did not deliver it (a rule of its own)
    assert cut_by(PATH, {"outer": tap("outer", "done", "cut"), "inner": tap("inner")}) == "outer"
    # every tap whole: what broke it lies outward of the outermost stream hop
    assert cut_by(PATH, {"outer": tap("outer"), "inner": tap("inner")}) == "the client"


def test_without_every_stream_hops_tap_the_hop_is_not_guessed() -> None:
    assert cut_by(PATH, {"inner": tap("inner", gone=True)}) is None


def record(**fields: object) -> StreamRecord:
    base: dict[str, object] = {"id": "r", "phase": "survival", "t_sent": T0, "t_headers": T0 + NS // 100,
                               "t_end": T0 + 5 * NS, "status": 200}
    base.update(fields)
    return StreamRecord(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("fields", "how", "words"), [
    ({"finish_reason": "length", "done_seen": True}, "whole", "finish_reason 'length' and [DONE]"),
    ({"status": 504, "error": ErrorInfo("http", "HTTP 504", 504)}, "http_status", "HTTP 504"),
    ({"error": ErrorInfo("read", "peer closed connection without sending complete message body")}, "bare_eof",
     "HTTP 200, then a bare EOF"),
    ({"error": ErrorInfo("read", "ConnectionResetError: [Errno 104] Connection reset by peer")}, "reset",
     "HTTP 200, then a TCP reset"),
    ({"in_band_error": "stream cut by streamchaos", "done_seen": True}, "error_event", "then an error event"),
    ({"finish_reason": None, "done_seen": False}, "eof_without_done", "a clean EOF without [DONE]"),
    ({"done_seen": True}, "done_without_finish", "[DONE] without a finish_reason"),
    ({"error": ErrorInfo("timeout", "no complete response within the request timeout")}, "timeout",
     "the client's own timeout"),
    ({"status": None, "t_headers": None, "error": ErrorInfo("connect", "refused")}, "connect", "no response head"),
])
def test_how_the_client_saw_the_end(fields: dict[str, object], how: str, words: str) -> None:
    found = client_saw(record(**fields))
    assert found[0] == how and words in found[1]


def test_the_hint_is_measured_into_the_hold_or_into_the_silence() -> None:
    cut = record(t_first_content=T0 + 2 * NS, t_end=T0 + 7 * NS + NS // 100)
    assert hint_s(DIMENSIONS["hold"], cut) == pytest.approx(7.0)  # from the response head
    assert hint_s(DIMENSIONS["silence"], cut) == pytest.approx(5.01)  # from the first event
    assert hint_s(DIMENSIONS["silence"], record(t_first_content=None)) is None


def test_each_dimension_sets_its_rule() -> None:
    def rule(name: str) -> dict[str, object]:
        return rule_for(DIMENSIONS[name], 7.0, keepalive_s=2.0, resolution_s=0.5)

    assert rule("hold") == {"kind": "hold", "params": {"seconds": 7.0, "keepalive_s": None, "headers": "send"}}
    assert rule("hold_keepalive")["params"]["keepalive_s"] == 2.0  # type: ignore[index]
    assert rule("silence") == {"kind": "silence", "params": {"after_events": 1, "seconds": 7.0, "keepalive_s": None}}
    assert rule("silence_keepalive")["params"]["keepalive_s"] == 2.0  # type: ignore[index]
    assert rule("deadline")["params"]["keepalive_s"] == 0.5  # type: ignore[index]  # min(1 s, resolution)


def test_the_path_must_end_with_a_tapping_stream_hop() -> None:
    with pytest.raises(UsageError, match=r"survival needs a path ending with a stream hop.*path: \[\{kind: stream"):
        check_path(Experiment(name="e"))
    with pytest.raises(UsageError, match=r"path ends with 'nginx' \(nginx\).*add `- \{kind: stream, name: inner\}` "
                                         r"as the last item of path:"):
        check_path(Experiment(name="e", path=(HopSpec("stream", "outer"), HopSpec("nginx", "nginx"))))
    with pytest.raises(UsageError, match="tap: false"):
        check_path(Experiment(name="e", path=(HopSpec("stream", "inner", tap=False),)))
    assert check_path(Experiment(name="e", path=(HopSpec("nginx", "nginx"), HopSpec("stream", "inner")))).name \
        == "inner"


def test_settings_are_checked_and_dimensions_read() -> None:
    assert dimensions_of("all") == tuple(DIMENSIONS)
    assert dimensions_of("hold, hold_keepalive") == ("hold", "hold_keepalive")
    assert SurvivalSettings().problems() == []
    bad = SurvivalSettings(dimensions=("hold", "idle"), max_s=1.0, resolution_s=2.0, keepalive_s=0.0).problems()
    assert any("unknown dimension 'idle'" in p for p in bad)
    assert any("--keepalive" in p for p in bad) and any("must be below --max" in p for p in bad)


def test_the_page_has_the_matrix_and_one_plot() -> None:
    from chaos.output.reports.survival import render_survival

    probes = [{"duration_s": 8.0, "outcome": "cut", "wall_s": 5.1, "cut_by": "nginx",
               "client_saw": "HTTP 200, then a bare EOF", "request_id": "survival-hold-1"},
              {"duration_s": 4.5, "outcome": "whole", "wall_s": 4.6},
              {"duration_s": 5.5, "outcome": "cut", "wall_s": 5.1, "cut_by": "nginx"}]
    body = {"experiment": "gw", "path": [{"name": "outer", "kind": "stream"}, {"name": "nginx", "kind": "nginx",
                                                                                "version": "1.22.1"}],
            "rule_hop": "inner", "max_s": 8.0, "resolution_s": 1.0, "keepalive_s": 2.0, "budget_s": 100.0,
            "took_s": 30.0, "exit_code": 3, "not_finished": ["silence"], "errors": [],
            "dimensions": [
                {"dimension": "hold", "what": "first event held", "finished": True, "why": "resolved",
                 "longest_whole_s": 4.5, "shortest_cut_s": 5.5, "resolution_s": 1.0, "survives_max": False,
                 "cut_by": "nginx", "client_saw": "HTTP 200, then a bare EOF", "probes": probes},
                {"dimension": "hold_keepalive", "what": "with comments", "finished": True, "why": "survives",
                 "longest_whole_s": 8.0, "shortest_cut_s": None, "survives_max": True,
                 "probes": [{"duration_s": 8.0, "outcome": "whole", "wall_s": 8.2}]},
                {"dimension": "silence", "what": "after 1 event", "finished": False, "why": "not searched",
                 "longest_whole_s": None, "shortest_cut_s": None, "probes": []}]}
    page = render_survival(body)
    assert page.count('<figure class="plot"') == 1 and 'data-plot="survival" data-points="4"' in page
    assert re.search(r'<tr data-dimension="hold">.*?cut between 4.5s and 5.5s.*?nginx.*?bare EOF', page, re.S)
    assert re.search(r'<tr data-dimension="hold_keepalive">.*?survives &ge; 8s', page, re.S)
    assert "Not finished: silence" in page and "sc-data-boundary-hold" in page
    assert "<script" not in page


def test_a_probes_taps_are_read_by_its_request_id(tmp_path: Path) -> None:
    from chaos.model.observations import to_json
    from chaos.survival.probe import read_taps

    inner = tmp_path / "inner.taps.jsonl"
    lines = [to_json(TapRecord(hop="x", seq=i, request_id=rid, target="/v1/completions", t_accept=T0,
                               down_end=end))
             for i, (rid, end) in enumerate([("a", "done"), ("b", "client_gone"), ("c", "done")], 1)]
    inner.write_text("\n".join(lines) + '\n{"type": "tap", "half', encoding="utf-8")  # a line still being written
    found = read_taps({"inner": inner, "outer": tmp_path / "not-yet.taps.jsonl"}, "b")
    assert list(found) == ["inner"] and found["inner"].down_end == "client_gone" and found["inner"].hop == "inner"


def test_the_command_refuses_a_path_it_cannot_measure_before_starting_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from chaos.cli import main

    experiment = tmp_path / "e.yaml"
    experiment.write_text("name: e\ntarget: {kind: builtin, model: tiny}\npath:\n  - {kind: stream, name: outer}\n"
                          "  - {kind: nginx, name: gw}\nphases:\n  - {name: p, duration: 1s}\n", encoding="utf-8")
    out = tmp_path / "run"
    assert main(["survival", str(experiment), "--out", str(out)]) == 2
    assert "path ends with 'gw' (nginx)" in capsys.readouterr().err
    experiment.write_text(experiment.read_text(encoding="utf-8").replace("{kind: nginx, name: gw}",
                                                                         "{kind: stream, name: inner}"))
    assert main(["survival", str(experiment), "--dimensions", "hold,idle", "--out", str(out)]) == 2
    assert "unknown dimension 'idle'" in capsys.readouterr().err
    assert main(["survival", str(experiment), "--max", "1s", "--resolution", "2s", "--out", str(out)]) == 2
    assert "must be below --max" in capsys.readouterr().err
    assert not out.exists()  # nothing was started or written


def test_a_probe_goes_out_uuid_shaped_and_its_taps_are_read_back_to_its_id(tmp_path: Path) -> None:
    """A probe's id is sent UUID-shaped (strict servers refuse any other X-Request-Id); the taps file holds it as
    sent, and reading it finds the probe by its own id."""
    from chaos.model.observations import to_json
    from chaos.model.request_ids import is_uuid4, record_id_of
    from chaos.survival.probe import Prober, read_taps

    api: Any = None  # no rule is set here
    prober = Prober(path=[], api=api, url="http://127.0.0.1:9/v1/completions", body={}, taps={}, seed=3)
    ids = [prober.request_id("baseline"), *(prober.request_id(name) for name in DIMENSIONS)]
    wires = [prober.wire_id(rid) for rid in ids]
    assert all(is_uuid4(w) for w in wires) and [record_id_of(w) for w in wires] == ids
    assert len({w[:8] for w in wires}) == 1  # one prober, one run tag
    assert Prober(path=[], api=api, url="", body={}, taps={}, request_ids="sequence").wire_id(ids[0]) == ids[0]
    taps = tmp_path / "inner.taps.jsonl"
    taps.write_text("".join(to_json(TapRecord(hop="x", seq=i, request_id=w, target="/v1/completions", t_accept=T0))
                            + "\n" for i, w in enumerate(wires, 1)), encoding="utf-8")
    found = read_taps({"inner": taps}, ids[2])
    assert found["inner"].request_id == ids[2] and found["inner"].wire_id == wires[2]
