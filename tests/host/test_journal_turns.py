"""The journal on a running loop: a turn's records reach the file together at the turn's end, in
order; a durable record (a fault step) writes what is held before it at once, and off a loop every
record is on disk when ``append`` returns."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from chaos.execution.journal import Journal
from chaos.model.observations import FaultEvent, Note


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _note(i: int) -> Note:
    return Note(topic="test", t=i, data={"i": i})


def test_a_turns_records_reach_the_file_at_the_turns_end_in_order(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"

    async def main() -> tuple[int, list[dict]]:
        journal = Journal(path, "x", 0, 0.0)
        for i in range(5):
            journal.append(_note(i))
        during = len(_lines(path))  # the run line only: the five are held
        await asyncio.sleep(0)  # the turn ends: the flush set for it runs
        after = _lines(path)
        journal.close("ok")
        return during, after

    during, after = asyncio.run(main())
    assert during == 1
    assert [line["data"]["i"] for line in after[1:]] == [0, 1, 2, 3, 4]


def test_a_durable_record_writes_what_is_held_before_it(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"

    async def main() -> list[dict]:
        journal = Journal(path, "x", 0, 0.0)
        journal.append(_note(0))
        journal.append(FaultEvent(fault="f", kind="k", action="inject", t=1))
        seen = _lines(path)  # in the same turn, before any flush set for it
        journal.close("ok")
        return seen

    seen = asyncio.run(main())
    assert [line["type"] for line in seen] == ["run", "note", "fault"]


def test_off_a_loop_every_record_is_on_disk_when_append_returns(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    journal = Journal(path, "x", 0, 0.0)
    journal.append(_note(7))
    assert _lines(path)[-1]["data"] == {"i": 7}
    journal.close("ok")


def test_close_writes_what_is_held(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"

    async def main() -> None:
        journal = Journal(path, "x", 0, 0.0)
        journal.append(_note(1))
        journal.close("ok")  # in the same turn: the held note goes first, then the end

    asyncio.run(main())
    assert [line["type"] for line in _lines(path)] == ["run", "note", "end"]


def test_a_held_write_that_fails_stops_the_run_at_the_next_record(tmp_path: Path) -> None:
    """The journal failing to write is a real failure (the event bus raises it and the run stops): a
    flush at a turn's end has no listener to raise from, so the next record raises it."""
    import errno

    class Full:
        closed = False

        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    async def main() -> None:
        journal = Journal(tmp_path / "journal.jsonl", "x", 0, 0.0)
        journal._file._file = Full()  # type: ignore[assignment]
        journal.append(_note(1))  # held: nothing written yet
        await asyncio.sleep(0)  # the turn's end: the write fails
        with pytest.raises(OSError, match="No space left"):
            journal.append(_note(2))

    asyncio.run(main())
