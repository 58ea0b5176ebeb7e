"""The stream hop's rules (chaos.hops.streamhop.rules): params checked with a one-line reason, which
requests a rule acts on (``share``, seeded and reproducible), and what the event kinds do to each
event. Pure, sub-second."""

from __future__ import annotations

from typing import Any

import pytest

from chaos.hops.streamhop.rules import KINDS, RequestRules, Rule, RuleError, parse_rule

GOOD: dict[str, dict[str, Any]] = {
    "hold": {"seconds": 7, "keepalive_s": 2, "headers": "send"},
    "silence": {"after_events": 3, "seconds": 4.5},
    "cut": {"after_events": 2, "how": "reset"},
    "status": {"code": 429, "retry_after_s": 1.5, "storm_above": 8},
    "drop": {"share_events": 0.5, "skip_first": 1},
    "duplicate": {"share_events": 0.25},
    "split": {"share_events": 1.0, "inside_utf8": True},
    "rewrite": {"content_type": "text/plain", "gzip": True, "gzip_buffer_bytes": 4096, "x_accel_buffering": "yes",
                "remove": ["Cache-Control"]},
    "deadline": {"seconds": 15, "how": "status"},
    "h2_rst_stream": {"after_events": 3, "error": "cancel"},
    "h2_goaway": {"after_streams": 10},
    "h2_max_streams": {"streams": 2},
    "h2_window": {"bytes": 1024, "seconds": 2},
    "h2_header_leak": {"how": "neighbour"},
}


def _rule(kind: str, params: dict[str, Any], name: str = "r", seed: int = 1, share: float = 1.0) -> Rule:
    return parse_rule(name, {"kind": kind, "params": params, "seed": seed, "share": share}, 0)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_takes_its_params_and_fills_its_defaults(kind: str) -> None:
    rule = _rule(kind, GOOD[kind])
    assert rule.kind == kind
    assert set(rule.params) == set(KINDS[kind])


def test_defaults_and_normal_forms() -> None:
    assert _rule("hold", {"seconds": 1}).params == {"seconds": 1.0, "keepalive_s": None, "headers": "send"}
    assert _rule("cut", {}).params == {"after_events": 0, "how": "bare_eof"}
    assert _rule("rewrite", {"remove": ["X-A"]}).params["remove"] == ["x-a"]
    assert _rule("rewrite", {}).params["gzip_buffer_bytes"] == 8192
    assert _rule("deadline", {"seconds": 2}).params["how"] == "clean"


@pytest.mark.parametrize("body, reason", [
    ({"kind": "hold", "params": {}}, "hold: param 'seconds' is required"),
    ({"kind": "holdx"}, "kind must be one of"),
    ({"kind": "hold", "params": {"seconds": -1}}, "hold.seconds must be between 0"),
    ({"kind": "hold", "params": {"seconds": "7"}}, "hold.seconds must be a number"),
    ({"kind": "hold", "params": {"seconds": True}}, "hold.seconds must be a number"),
    ({"kind": "hold", "params": {"seconds": 1, "keepalive_s": 0}}, "hold.keepalive_s must be null or at least"),
    ({"kind": "hold", "params": {"seconds": 1, "keepalive_s": 1, "headers": "hold"}}, "keepalive_s needs headers"),
    ({"kind": "hold", "params": {"seconds": 1, "extra": 1}}, "unknown param 'extra'"),
    ({"kind": "cut", "params": {"how": "explode"}}, "cut.how must be one of bare_eof, reset, error_event, fake_done"),
    ({"kind": "cut", "params": {"after_events": 1.5}}, "cut.after_events must be a whole number"),
    ({"kind": "status", "params": {"code": 418}}, "status.code must be one of 429, 500, 502, 503, 504"),
    ({"kind": "drop", "params": {"share_events": 2}}, "drop.share_events must be between 0 and 1"),
    ({"kind": "split", "params": {"share_events": 1, "inside_utf8": "yes"}}, "split.inside_utf8 must be true or"),
    ({"kind": "rewrite", "params": {"content_type": "a\r\nX-Evil: 1"}}, "rewrite.content_type must be null or"),
    ({"kind": "rewrite", "params": {"remove": ["bad name"]}}, "is not a header name"),
    ({"kind": "rewrite", "params": {"gzip_buffer_bytes": 0}}, "rewrite.gzip_buffer_bytes must be between 1"),
    ({"kind": "deadline", "params": {"seconds": 0}}, "deadline.seconds must be more than 0"),
    ({"kind": "hold", "params": {"seconds": 1}, "share": 1.5}, "share must be between 0 and 1"),
    ({"kind": "hold", "params": {"seconds": 1}, "seed": "x"}, "seed must be a whole number"),
    ({"kind": "hold", "params": {"seconds": 1}, "when": 1}, "unknown field 'when'"),
    (["hold"], "the body must be a JSON object"),
])
def test_a_bad_rule_gets_a_one_line_reason(body: Any, reason: str) -> None:
    with pytest.raises(RuleError) as caught:
        parse_rule("r", body, 0)
    assert reason in str(caught.value)
    assert "\n" not in str(caught.value)


def test_rule_names_are_bounded() -> None:
    with pytest.raises(RuleError):
        parse_rule("", {"kind": "cut"}, 0)
    with pytest.raises(RuleError):
        parse_rule("a/b", {"kind": "cut"}, 0)
    with pytest.raises(RuleError):
        parse_rule("x" * 129, {"kind": "cut"}, 0)
    assert parse_rule("fault: cut-1", {"kind": "cut"}, 0).name == "fault: cut-1"


def _acted_on(rule: Rule, n: int) -> set[int]:
    return {seq for seq in range(1, n + 1) if RequestRules([rule], f"req-{seq}", seq, 1).all}


def test_share_acts_on_about_that_fraction_and_replays_for_the_same_seed() -> None:
    rule = _rule("cut", {}, seed=42, share=0.5)
    first = _acted_on(rule, 400)
    assert 160 <= len(first) <= 240  # binomial(400, 0.5): 6 sigma either side
    assert _acted_on(_rule("cut", {}, seed=42, share=0.5), 400) == first  # the same seed: the same requests
    assert _acted_on(_rule("cut", {}, seed=43, share=0.5), 400) != first
    assert _acted_on(_rule("cut", {}, share=1.0), 50) == set(range(1, 51))
    assert _acted_on(_rule("cut", {}, share=0.0), 50) == set()


def test_share_without_a_request_id_is_seeded_by_the_sequence_number() -> None:
    rule = _rule("cut", {}, seed=5, share=0.5)
    by_seq = {seq for seq in range(1, 101) if RequestRules([rule], None, seq, 1).all}
    assert by_seq == {seq for seq in range(1, 101) if rule.selects(str(seq))}


def test_a_storm_acts_only_above_its_in_flight_bound() -> None:
    rule = _rule("status", {"code": 503, "storm_above": 2})
    assert not RequestRules([rule], "a", 1, in_flight=2).all
    assert RequestRules([rule], "a", 1, in_flight=3).get("status") is not None


def test_the_first_rule_of_a_single_kind_acts_and_silences_all_act() -> None:
    first, second = _rule("hold", {"seconds": 1}, name="a"), _rule("hold", {"seconds": 9}, name="b")
    s1, s2 = _rule("silence", {"seconds": 1}, name="s1"), _rule("silence", {"after_events": 2, "seconds": 1}, name="s2")
    plan = RequestRules([first, second, s1, s2], "x", 1, 1)
    hold = plan.get("hold")
    assert hold is not None and hold.rule is first
    assert [s.rule.name for s in plan.silence_after(0)] == ["s1"]
    assert [s.rule.name for s in plan.silence_after(2)] == ["s2"]
    assert first.running == 1 and second.running == 0
    plan.release()
    assert first.running == 0


def _run(rule: Rule, events: list[tuple[str, bytes]], key: str = "k") -> tuple[list[list[list[bytes]]], list[str]]:
    plan = RequestRules([rule], key, 1, 1)
    out = []
    index = 0
    for kind, raw in events:
        out.append(plan.decide(kind, raw, index))
        if kind in ("data", "usage", "finish", "error"):
            index += 1
    return out, plan.release()


EVENTS = [("data", f"data: tok{i} é\n\n".encode()) for i in range(6)] + [("comment", b": ka\n\n"),
                                                                       ("done", b"data: [DONE]\n\n")]


def test_drop_never_drops_done_or_comments_and_skips_the_first() -> None:
    out, acted = _run(_rule("drop", {"share_events": 1.0, "skip_first": 2}), EVENTS)
    assert [len(copies) for copies in out] == [1, 1, 0, 0, 0, 0, 1, 1]
    assert acted == ["r"]


def test_duplicate_writes_twice_and_a_zero_share_does_nothing() -> None:
    out, acted = _run(_rule("duplicate", {"share_events": 1.0}), EVENTS)
    assert [len(copies) for copies in out] == [2] * 6 + [1, 1]
    out, acted = _run(_rule("duplicate", {"share_events": 0.0}), EVENTS)
    assert [len(copies) for copies in out] == [1] * 8 and acted == []


def test_drop_decisions_are_seeded_per_request() -> None:
    rule = _rule("drop", {"share_events": 0.5}, seed=3)
    many = [("data", b"data: x\n\n")] * 64
    first, _ = _run(rule, many, key="a")
    again, _ = _run(_rule("drop", {"share_events": 0.5}, seed=3), many, key="a")
    other, _ = _run(rule, many, key="b")
    assert first == again and first != other
    assert 16 <= sum(not c for c in first) <= 48


def test_split_cuts_inside_a_utf8_character_when_asked() -> None:
    out, _ = _run(_rule("split", {"share_events": 1.0, "inside_utf8": True}), EVENTS[:6])
    for (_, raw), copies in zip(EVENTS, out, strict=False):
        assert len(copies) == 1 and len(copies[0]) == 2
        head, tail = copies[0]
        assert head + tail == raw
        with pytest.raises(UnicodeDecodeError):
            head.decode()
    plain, _ = _run(_rule("split", {"share_events": 1.0}), [("data", b"data: ascii only\n\n")])
    head, tail = plain[0][0]
    assert head + tail == b"data: ascii only\n\n" and head and tail


def test_evidence_counts_requests_and_details() -> None:
    rule = _rule("drop", {"share_events": 1.0})
    for seq in range(1, 4):
        _run(rule, EVENTS, key=f"req-{seq}")
    assert rule.acted_on == 3
    assert rule.request_ids == ["req-1", "req-2", "req-3"]
    assert rule.details == {"events_dropped": 18}
    plan = RequestRules([rule], None, 9, 1)
    plan.decide("data", b"data: x\n\n", 0)
    assert rule.request_ids[-1] == "seq:9"


def test_a_reasoning_silence_waits_for_reasoning_events_and_leaves_the_others_to_count() -> None:
    any_kind = _rule("silence", {"after_events": 2, "seconds": 1}, name="a")
    thinking = _rule("silence", {"after_events": 2, "seconds": 1, "during": "reasoning"}, name="b")
    assert any_kind.params["during"] == "any" and thinking.params["during"] == "reasoning"
    rules = RequestRules([any_kind, thinking], "req-1", 1, 0)
    assert rules.watches_reasoning and not RequestRules([any_kind], "req-1", 1, 0).watches_reasoning
    assert [a.rule.name for a in rules.silence_after(2)] == ["a"]  # events of any kind: only the any silence
    assert [a.rule.name for a in rules.silence_before_reasoning(2)] == ["b"]  # before the 3rd reasoning event
    assert rules.silence_before_reasoning(1) == []
    with pytest.raises(RuleError, match="silence.during must be one of any, reasoning"):
        _rule("silence", {"seconds": 1, "during": "content"})


@pytest.mark.parametrize("payload, reasoning", [
    (b'{"choices":[{"delta":{"reasoning_content":"hm"}}]}', True),
    (b'{"choices":[{"delta":{"reasoning": "hm"}}]}', True),
    (b'{"choices":[{"delta":{"reasoning_content":null,"content":"a"}}]}', False),
    (b'{"choices":[{"delta":{"reasoning_content":"","content":"a"}}]}', False),
    (b'{"choices":[{"delta":{"content":"reasoning_content"}}]}', False),
    (b'{"choices":[{"text":"x"}]}', False),
])
def test_a_reasoning_event_is_one_with_reasoning_text(payload: bytes, reasoning: bool) -> None:
    from chaos.hops.streamhop.sse import carries_reasoning

    assert carries_reasoning(payload) is reasoning
