"""The observation model survives its JSON-lines round trip losslessly."""

import io

from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.model.observations import (
    ErrorInfo,
    FaultEvent,
    Hangup,
    MetricSample,
    Note,
    Observations,
    PhaseWindow,
    StreamRecord,
    from_json,
    read_jsonl,
    to_json,
    write_jsonl,
)

ns = st.integers(min_value=0, max_value=2**62)
text = st.text(max_size=40)

streams = st.builds(
    StreamRecord,
    id=text,
    phase=text,
    t_sent=st.none() | ns,
    t_first_content=st.none() | ns,
    t_content=st.lists(ns, max_size=5),
    finish_reason=st.none() | st.sampled_from(["stop", "length", "abort"]),
    done_seen=st.booleans(),
    error=st.none() | st.builds(ErrorInfo, kind=text, message=text, status=st.none() | st.integers(100, 599)),
    hangup=st.none() | st.builds(Hangup, fault=text, reason=text, t=ns),
    text=text,
    usage=st.none() | st.dictionaries(text, st.integers(), max_size=3),
)
metrics = st.builds(MetricSample, name=text, labels=st.dictionaries(text, text, max_size=3),
                    value=st.floats(allow_nan=False), t=ns)
faults = st.builds(
    FaultEvent, fault=text, kind=text, action=st.sampled_from(["plan", "inject", "revert", "error", "rollback"]), t=ns,
    phase=text, evidence=st.dictionaries(text, st.integers() | text, max_size=3),
    undo=st.dictionaries(text, text, max_size=2), message=text, scope=st.sampled_from(["in_flight", "phase"]),
)
records = st.one_of(streams, metrics, faults, st.builds(PhaseWindow, name=text, t_start=ns, t_end=st.none() | ns),
                    st.builds(Note, topic=text, t=ns, data=st.dictionaries(text, text, max_size=3)))


@settings(max_examples=150, deadline=None)
@given(st.lists(records, max_size=8))
def test_jsonl_round_trip_is_lossless(items: list) -> None:
    buffer = io.StringIO()
    write_jsonl(items, buffer)
    assert list(read_jsonl(buffer.getvalue().splitlines())) == items


def test_observations_dump_and_load(tmp_path) -> None:
    obs = Observations(experiment="x", t0=5, wall_t0=1.5)
    obs.add(PhaseWindow("baseline", 10))
    obs.add(PhaseWindow("baseline", 10, 20))  # the end replaces the start
    obs.add(StreamRecord(id="r1", phase="baseline", t_sent=11, t_first_content=13, t_content=[13, 15],
                         finish_reason="stop", done_seen=True))
    obs.add(StreamRecord(id="bg", phase="baseline", background=True))
    obs.add(MetricSample("vllm:num_requests_running", {"engine": "0"}, 1.0, 12))
    path = tmp_path / "journal.jsonl"
    obs.dump(path)
    again = Observations.load(path)
    assert again == obs
    assert [s.id for s in again.population()] == ["r1"]
    assert again.streams[0].ttft_ns == 2 and again.streams[0].gaps_ns == [2]
    assert again.streams[0].complete


def test_completeness_rule() -> None:
    good = StreamRecord(id="a", phase="p", finish_reason="stop", done_seen=True)
    assert good.complete
    assert not StreamRecord(id="b", phase="p", finish_reason="stop").complete  # no [DONE]
    assert not StreamRecord(id="c", phase="p", done_seen=True).complete  # no finish_reason
    assert not StreamRecord(id="d", phase="p", finish_reason="stop", done_seen=True, in_band_error="boom").complete


def test_single_record_json_shape() -> None:
    line = to_json(FaultEvent("f", "network.latency", "inject", 1, evidence={"toxic": {"latency": 100}}))
    assert '"type":"fault"' in line
    assert from_json(line) == FaultEvent("f", "network.latency", "inject", 1, evidence={"toxic": {"latency": 100}})


def test_a_journal_cut_short_by_a_kill_still_loads(tmp_path) -> None:
    path = tmp_path / "journal.jsonl"
    obs = Observations(experiment="x")
    obs.add(PhaseWindow("a", 1))
    obs.dump(path)
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"type":"stream","id":"cut-mid-wri')  # the runner was SIGKILLed mid-write
    assert Observations.load(path).phases == [PhaseWindow("a", 1)]


def test_a_stream_record_is_written_as_asdict_would_write_it() -> None:
    """The journal's fast path for stream records (no deep copies) writes exactly what ``asdict`` did."""
    import dataclasses
    import json

    full = StreamRecord(id="s1", phase="p", endpoint="chat", prompt_chars=12, max_tokens=64, expected_text="ab",
                        background=True, t_scheduled=1, t_sent=2, t_headers=3, t_first_byte=4, t_first_event=5,
                        t_first_content=6, t_content=[6, 7, 8], t_end=9, status=200, server="nginx", via="1.1 caddy",
                        content_encoding="gzip", finish_reason="length", done_seen=True, in_band_error="x",
                        error=ErrorInfo("read", "reset", 502), hangup=Hangup("f", "after_tokens", 8), bytes_received=10,
                        events=3, text="a\u2028b", usage={"completion_tokens": 3, "nested": {"k": [1, 2]}})
    for record in (full, StreamRecord(id="s2", phase="p")):
        expected = dict(dataclasses.asdict(record), type="stream")
        assert json.loads(to_json(record)) == expected
        assert from_json(to_json(record)) == record


def test_a_stream_record_keeps_one_line_and_survives_what_orjson_refuses() -> None:
    """Stream records go through orjson: the Unicode line breaks JSON allows raw are still escaped (one
    record a line for any splitter), and a value orjson refuses (an int over 64 bits, a lone
    surrogate) falls back to ``json`` instead of losing the record; a metric's NaN stays NaN."""
    import math

    record = StreamRecord(id="s", phase="p", text="a\u2028b\u2029c\x85d", usage={"big": 2**70})
    line = to_json(record)
    assert len(line.splitlines()) == 1 and "\u2028" not in line and "\x85" not in line
    assert from_json(line) == record
    lone = StreamRecord(id="s", phase="p", text="x\ud800y")
    assert from_json(to_json(lone)) == lone
    nan = from_json(to_json(MetricSample(name="m", labels={}, value=float("nan"), t=1)))
    assert isinstance(nan, MetricSample) and math.isnan(nan.value)
