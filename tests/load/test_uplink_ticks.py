"""A load process's records go to the runner on the run's shared ticks, in frames of at most
``FRAME_RECORDS`` written one per loop turn, and a reply still comes after every record made before
it (issue 24: each pipe write woke the idle runner, which starts cold)."""

from __future__ import annotations

import asyncio
import math
import os
import time
from typing import Any

import pytest

from chaos.host.cadence import EARLY_S
from chaos.load import uplink as uplink_module
from chaos.load.uplink import FRAME_RECORDS, FrameReader, Uplink

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


async def _pair() -> tuple[Uplink, list[tuple[float, Any]], asyncio.BaseTransport]:
    """An uplink and a reader on one pipe; the reader notes when each message arrived."""
    read_end, write_end = os.pipe()
    uplink = await Uplink.open(write_end)
    os.close(write_end)
    got: list[tuple[float, Any]] = []
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: FrameReader(lambda message: got.append((time.monotonic(), message)), lambda: None),
        os.fdopen(read_end, "rb", buffering=0))
    return uplink, got, transport


async def _until(predicate: Any) -> None:
    for _ in range(2000):  # bounded: 20 s
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def test_records_wait_for_the_next_tick_and_go_in_frames_of_at_most_frame_records(
        monkeypatch: pytest.MonkeyPatch) -> None:
    period = 0.2
    monkeypatch.setattr(uplink_module, "FLUSH_EVERY_S", period)
    uplink, got, transport = await _pair()
    try:
        records = [("r", i) for i in range(2 * FRAME_RECORDS + 22)]
        made_at = time.monotonic()
        for record in records:
            uplink.record(record)
        await asyncio.sleep(0)  # a loop turn: per-turn flushing (the old way) would have sent them now
        assert uplink.frames == 0 and uplink.pending == records
        tick = math.floor((made_at + EARLY_S) / period + 1) * period
        await _until(lambda: sum(len(m[1]) for _t, m in got) == len(records))
        assert [r for _t, m in got for r in m[1]] == records  # all of them, in order
        assert [len(m[1]) for _t, m in got] == [FRAME_RECORDS, FRAME_RECORDS, 22]
        assert got[0][0] >= tick - EARLY_S, (got[0][0], tick)  # none before the tick

        # a reply goes after every record made before it, without waiting for a tick
        more = [("s", i) for i in range(FRAME_RECORDS + 5)]
        for record in more:
            uplink.record(record)
        uplink.send(("reply", 7, True, "done"))
        assert uplink.pending == []  # written at once, not held for a tick
        await _until(lambda: got[-1][1][0] == "reply")
        assert [r for _t, m in got[3:-1] for r in m[1]] == more
        assert got[-1][1] == ("reply", 7, True, "done")
    finally:
        await uplink.aclose(timeout=5)
        transport.close()
