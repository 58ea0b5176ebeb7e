"""The uplink from a load process to the runner holds bounded memory when the runner stops reading:
past ``SPILL_AT_BYTES`` frames go to an unlinked file, and every record still arrives, in order,
once the runner reads again (issue 24). Thresholds are scaled down so megabytes stand for the
hundreds of megabytes a real run would need."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from chaos.load import uplink as uplink_module
from chaos.load.uplink import FrameReader, Uplink

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

SPILL_AT = 1024 * 1024


async def _scaled_uplink(monkeypatch: pytest.MonkeyPatch) -> tuple[Uplink, int]:
    """An uplink on a fresh pipe with megabyte thresholds; (uplink, the pipe's read end)."""
    monkeypatch.setattr(uplink_module, "HIGH_WATER_BYTES", 256 * 1024)
    monkeypatch.setattr(uplink_module, "SPILL_AT_BYTES", SPILL_AT)
    monkeypatch.setattr(uplink_module, "SPILL_CHUNK_BYTES", 64 * 1024)
    read_end, write_end = os.pipe()
    uplink = await Uplink.open(write_end)
    os.close(write_end)
    return uplink, read_end


async def test_a_runner_that_stops_reading_costs_the_worker_bounded_memory_and_no_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    uplink, read_end = await _scaled_uplink(monkeypatch)
    records = [("r", i, f"{i:06d}" + "x" * 4000) for i in range(2000)]  # ~8 MB, each its own; nobody reads yet
    most_buffered = 0
    for i, record in enumerate(records):
        uplink.record(record)
        if i % 20 == 19:
            uplink.flush()
            most_buffered = max(most_buffered, uplink.transport.get_write_buffer_size())
    uplink.send(("reply", 1, True, "after the records"))
    stats = uplink.stats()
    assert most_buffered <= SPILL_AT, most_buffered  # memory bounded: the rest went to the file
    assert stats["uplink_spilled_bytes"] > 6 * 1024 * 1024, stats

    # the runner reads again: every record arrives, in the order made, the reply after them
    got: list[Any] = []
    lost = asyncio.get_running_loop().create_future()
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: FrameReader(got.append, lambda: lost.done() or lost.set_result(None)),
        os.fdopen(read_end, "rb", buffering=0))
    await uplink.aclose(timeout=30)
    await asyncio.wait_for(lost, 30)
    transport.close()
    delivered = [r for message in got if message[0] == "records" for r in message[1]]
    assert delivered == records
    assert got[-1] == ("reply", 1, True, "after the records")
    assert uplink.spill is None


async def test_a_spill_drains_into_the_pipe_while_the_worker_runs_not_only_at_close(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """resume_writing feeds the spill back as the runner reads: records arrive before any close."""
    uplink, read_end = await _scaled_uplink(monkeypatch)
    records = [("r", i, f"{i:06d}" + "y" * 4000) for i in range(1000)]
    for i in range(0, len(records), 20):
        for record in records[i:i + 20]:
            uplink.record(record)
        uplink.flush()
    assert uplink.spill is not None and uplink.spilled_bytes > 0
    got: list[Any] = []
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: FrameReader(got.append, lambda: None), os.fdopen(read_end, "rb", buffering=0))
    delivered = lambda: [r for m in got if m[0] == "records" for r in m[1]]  # noqa: E731
    for _ in range(3000):  # bounded: 30 s
        if len(delivered()) == len(records):
            break
        await asyncio.sleep(0.01)
    assert delivered() == records and uplink.spill is None  # all of it, in order, and the file closed
    await uplink.aclose(timeout=5)
    transport.close()
