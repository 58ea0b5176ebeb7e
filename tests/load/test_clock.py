"""Clock alignment and the shard wire format: pure functions, no sockets."""

from __future__ import annotations

import asyncio
import random

import pytest

from chaos.load.clock import Exchange, estimate, shift_record
from chaos.load.wire import (
    MAX_LINE_BYTES,
    ProtocolError,
    encode,
    read_message,
    rule_from_json,
    rule_to_json,
    settings_from_json,
    settings_to_json,
)
from chaos.load.workload import LoadSettings, PromptSettings
from chaos.model.client_rules import DisconnectRule, SlowReaderRule, TimeoutRule
from chaos.model.errors import ChaosError
from chaos.model.observations import Hangup, StreamRecord

MS = 1_000_000


def _exchange(true_offset: int, t0: int, out_delay: int, turnaround: int, back_delay: int) -> Exchange:
    """A round trip as it really happens: the shard's clock reads coordinator time + true_offset."""
    t1 = t0 + out_delay + true_offset
    t2 = t1 + turnaround
    return Exchange(t0, t1, t2, t0 + out_delay + turnaround + back_delay)


def test_a_symmetric_round_trip_recovers_the_offset_exactly() -> None:
    e = _exchange(7_500 * MS, 1_000 * MS, 2 * MS, 1 * MS, 2 * MS)
    assert e.offset == 7_500 * MS and e.delay == 4 * MS


def test_the_estimate_stays_within_its_bound_however_asymmetric_the_delays() -> None:
    rng = random.Random(5)
    for _ in range(500):
        true = rng.randint(-10**12, 10**12)
        exchanges = [_exchange(true, rng.randint(0, 10**12), rng.randint(0, 50 * MS), rng.randint(0, 5 * MS),
                               rng.randint(0, 50 * MS)) for _ in range(rng.randint(1, 16))]
        got = estimate(exchanges)
        assert abs(got.offset_ns - true) <= got.bound_ns
        assert got.bound_ns == (min(e.delay for e in exchanges) + 1) // 2 and got.samples == len(exchanges)


def test_the_least_delayed_exchange_wins() -> None:
    slow = _exchange(0, 0, 40 * MS, 0, 1 * MS)  # 19.5ms off, bound 20.5ms
    fast = _exchange(0, 0, 1 * MS, 0, 1 * MS)
    got = estimate([slow, fast, slow])
    assert got.offset_ns == 0 and got.bound_ns == 1 * MS and got.rtt_ns == 2 * MS
    with pytest.raises(ValueError):
        estimate([])


def test_shift_record_moves_every_stamp_and_no_duration() -> None:
    record = StreamRecord(id="1-3", phase="p", t_scheduled=1, t_sent=2, t_headers=3, t_first_byte=4, t_first_event=5,
                          t_first_content=6, t_content=[6, 7, 9], t_end=10, hangup=Hangup("dc", "after_tokens", 8))
    moved = shift_record(record, -1000)
    assert (moved.t_scheduled, moved.t_sent, moved.t_headers, moved.t_first_byte, moved.t_first_event,
            moved.t_first_content, moved.t_end) == (-999, -998, -997, -996, -995, -994, -990)
    assert moved.t_content == [-994, -993, -991] and moved.hangup == Hangup("dc", "after_tokens", -992)
    assert moved.ttft_ns == record.ttft_ns and moved.gaps_ns == record.gaps_ns
    assert record.t_sent == 2  # the original is untouched
    assert shift_record(StreamRecord(id="x", phase=""), 5).t_sent is None


@pytest.mark.parametrize("rule", [
    DisconnectRule("dc", 0.5, after_tokens=(1, 4)), DisconnectRule("q", 1.0, while_queued=True),
    SlowReaderRule("slow", 0.3, read_delay_s=0.01, read_rate_bps=1000.0), TimeoutRule("to", 1.0, timeout_s=0.2),
])
def test_client_rules_cross_the_wire_as_json(rule: object) -> None:
    import json

    assert rule_from_json(json.loads(json.dumps(rule_to_json(rule)))) == rule  # type: ignore[arg-type]


def test_only_known_rule_types_are_built() -> None:
    with pytest.raises(ProtocolError, match="unknown client rule type 'os.system'"):
        rule_from_json({"type": "os.system", "fault": "x"})
    with pytest.raises(ProtocolError, match="TimeoutRule"):
        rule_from_json({"type": "TimeoutRule", "fault": "x"})  # a required field missing


def test_load_settings_cross_the_wire() -> None:
    import json

    settings = LoadSettings(concurrency=3, max_tokens=(2, 9),
                            prompts=PromptSettings(mix=(("ascii", 0.5), ("cjk", 0.5))))
    assert settings_from_json(json.loads(json.dumps(settings_to_json(settings)))) == settings
    with pytest.raises(ProtocolError):
        settings_from_json({"prompts": 3})


def test_read_message_refuses_what_is_not_the_protocol() -> None:
    async def read(data: bytes, limit: int = MAX_LINE_BYTES) -> object:
        reader = asyncio.StreamReader(limit=limit)
        reader.feed_data(data)
        reader.feed_eof()
        return await read_message(reader)

    assert asyncio.run(read(encode({"op": "ping", "seq": 1}))) == {"op": "ping", "seq": 1}
    assert asyncio.run(read(b"")) is None
    for bad, why in ((b"not json\n", "not JSON"), (b"[1]\n", "with an 'op'"), (b'{"op": 1}\n', "with an 'op'"),
                     (b'{"op": "x"', "in the middle of a message")):
        with pytest.raises(ProtocolError, match=why):
            asyncio.run(read(bad))
    with pytest.raises(ProtocolError, match="longer than"):
        asyncio.run(read(b"x" * 200 + b"\n", limit=64))
    assert issubclass(ProtocolError, ChaosError)
