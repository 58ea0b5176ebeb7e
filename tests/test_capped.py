"""Bounded reads from a target (chaos.host.capped) against the hostile server process (tests/e2e/hostile_target.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chaos.execution.preflight import EngineFindings, PreflightResult, detect
from chaos.host.capped import JSON_LIMIT, clip, clip_json, get_capped
from chaos.host.children import first_line, spawn
from chaos.model.engines import identify
from chaos.model.experiment import LoadSpec
from chaos.model.observations import StreamRecord
from chaos.targets.scraper import MetricScraper

HOSTILE = Path(__file__).parent / "e2e" / "hostile_target.py"


@pytest.fixture(scope="module")
def hostile() -> Iterator[str]:
    proc = spawn([sys.executable, str(HOSTILE)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        line = first_line(proc, 30.0)
        assert line.startswith("PORT "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.kill()
        proc.wait(10)


async def fetch(url: str, limit: int, deadline: float = 5.0):  # type: ignore[no-untyped-def]
    async with httpx.AsyncClient(timeout=5.0) as client:
        return await get_capped(client, url, limit=limit, deadline=deadline)


def test_a_streamed_exposition_stops_at_the_cap(hostile: str) -> None:
    got = asyncio.run(fetch(hostile + "/metrics", 1 << 20))
    assert got.over and len(got.body) == 1 << 20 and got.status_code == 200


def test_a_declared_length_past_the_cap_is_not_read(hostile: str) -> None:
    got = asyncio.run(fetch(hostile + "/version", JSON_LIMIT))
    assert got.over and got.body == b""
    with pytest.raises(ValueError, match="larger than"):
        got.json()


def test_a_slow_drip_is_cut_at_the_deadline(hostile: str) -> None:
    with pytest.raises(httpx.ReadTimeout, match="within 1s"):
        asyncio.run(fetch(hostile + "/health", JSON_LIMIT, deadline=1.0))


def test_deep_json_is_refused_not_a_recursion_error(hostile: str) -> None:
    got = asyncio.run(fetch(hostile + "/v1/models", JSON_LIMIT))
    assert not got.over
    with pytest.raises(ValueError, match="nested more than"):
        got.json()


def test_detection_survives_the_hostile_routes_and_its_note_is_clipped(hostile: str) -> None:
    evidence = asyncio.run(detect(hostile + "/v1", hostile + "/metrics", {}))
    assert evidence.owned_by == () and evidence.health is None and evidence.version is None
    assert evidence.metric_names == ()  # the exposition passed the cap: no names, no parse of 150 MB
    prof, why = identify(evidence)
    assert prof.name == "tgi"
    record = StreamRecord(id="p", phase="preflight", endpoint="completions")
    note = EngineFindings(prof, why, PreflightResult(LoadSpec(), record), evidence).note()
    assert len(note["detected_by"]) < 500 and len(note["evidence"]["info_router"]) < 300


def test_the_scraper_notes_an_exposition_past_the_cap(hostile: str) -> None:
    sink: list[object] = []

    async def once() -> int:
        scraper = MetricScraper(hostile + "/metrics", 1.0, sink.append)
        try:
            return await scraper.scrape_once()
        finally:
            await scraper.stop()

    assert asyncio.run(once()) == 0
    assert [n.topic for n in sink] == ["scrape_error"]  # type: ignore[attr-defined]
    assert "larger than 16777216 bytes" in sink[0].data["error"]  # type: ignore[attr-defined]


def test_clip_bounds_text_and_json() -> None:
    assert clip("abc") == "abc" and clip(None) is None
    assert clip("x" * 1000, 10) == "x" * 10 + "... (1000 characters)"
    assert clip_json({"version": "0.8"}) == {"version": "0.8"}
    assert isinstance(clip_json({"v": "x" * 10_000}), str) and len(clip_json({"v": "x" * 10_000})) < 1000
