"""A server may take a request field and ignore it (llama-cpp-python's ends streams on ``stop`` whatever
``ignore_eos`` says, and sends no usage chunk): ``field_checks`` reads from the preflight's stream which
field took effect. Pure."""

from __future__ import annotations

from typing import Any

import pytest

from chaos.execution.preflight import AFFECTS, FieldCheck, StreamFacts, field_checks
from chaos.model.observations import StreamRecord

BODY: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": 32, "ignore_eos": True,
                        "stream_options": {"include_usage": True}}


def facts(tokens: int, finish: str | None, usage: bool = True, ended: bool = True) -> StreamFacts:
    return StreamFacts(tokens, "token events", finish, usage, ended)


def outcomes(checks: list[FieldCheck]) -> dict[str, str]:
    return {c.field: c.outcome for c in checks}


def test_a_stream_that_stopped_before_max_tokens_and_carried_no_usage_names_both_fields() -> None:
    checks = field_checks(BODY, facts(7, "stop", usage=False))
    assert outcomes(checks) == {"ignore_eos": "ignored", "stream_options.include_usage": "ignored"}
    eos, usage = checks
    assert eos.evidence == "the preflight stream stopped at 7 of 32 tokens with finish_reason stop"
    assert usage.evidence == "no usage chunk"
    assert eos.ignored_dict()["affects"] == list(AFFECTS["ignore_eos"]) and eos.affects
    assert any(a.startswith("integrity: events_over_usage") for a in usage.affects)


def test_a_stream_that_reached_max_tokens_with_usage_honoured_both() -> None:
    assert outcomes(field_checks(BODY, facts(32, "length"))) == {
        "ignore_eos": "honoured", "stream_options.include_usage": "honoured"}
    # the count alone says it reached max_tokens, whatever the reason the engine named
    assert outcomes(field_checks(BODY, facts(32, "stop")))["ignore_eos"] == "honoured"
    assert all(not c.affects for c in field_checks(BODY, facts(32, "length")))


@pytest.mark.parametrize(("stream", "eos", "usage"), [
    (facts(12, None, usage=False, ended=False), "not_shown", "not_shown"),  # cut by the preflight: no end seen
    (facts(3, "tool_calls"), "not_shown", "honoured"),  # a tool call ends a stream whatever ignore_eos says
    (facts(3, None, usage=False), "not_shown", "ignored"),  # ended without a reason: not a stop
    (facts(32, "length", usage=False, ended=False), "honoured", "not_shown"),  # max_tokens reached, cut before usage
])
def test_what_a_stream_cannot_tell_is_not_shown(stream: StreamFacts, eos: str, usage: str) -> None:
    assert outcomes(field_checks(BODY, stream)) == {"ignore_eos": eos, "stream_options.include_usage": usage}


def test_only_fields_the_request_asked_for_are_checked() -> None:
    assert field_checks({"max_tokens": 32}, facts(7, "stop", usage=False)) == []
    assert field_checks({"max_tokens": 32, "ignore_eos": False, "stream_options": {"include_usage": False}},
                        facts(7, "stop", usage=False)) == []
    no_limit = field_checks({"ignore_eos": True}, facts(7, "stop"))
    assert outcomes(no_limit) == {"ignore_eos": "not_shown"}


@pytest.mark.parametrize(("stream", "outcome"), [
    (facts(12, "stop"), "honoured"),
    (facts(5, "stop"), "ignored"),
    (facts(5, "length"), "not_shown"),  # a max_tokens below min_tokens ends it
    (facts(5, None, ended=False), "not_shown"),
])
def test_min_tokens(stream: StreamFacts, outcome: str) -> None:
    (check,) = field_checks({"max_tokens": 64, "min_tokens": 10}, stream)
    assert (check.field, check.outcome) == ("min_tokens", outcome)


def test_stream_facts_count_tokens_by_usage_where_it_covers_the_events() -> None:
    rec = StreamRecord(id="p", phase="preflight", t_content=[1, 2, 3], finish_reason="stop",
                       usage={"completion_tokens": 9})
    assert StreamFacts.of(rec) == StreamFacts(9, "usage.completion_tokens", "stop", True, True)
    rec.usage = {"completion_tokens": 1}  # fewer than the events: the events count
    assert StreamFacts.of(rec).tokens == 3 and StreamFacts.of(rec).counted == "token events"
    assert not StreamFacts.of(rec, cut="stream cut by the preflight").ended


def test_every_field_the_load_may_send_has_its_affects_listed() -> None:
    assert set(AFFECTS) == {"ignore_eos", "stream_options.include_usage", "min_tokens"}
    assert all(a.partition(":")[1] for items in AFFECTS.values() for a in items)  # "kind: how"
