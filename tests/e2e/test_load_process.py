"""Where a run's load ran (issue 24): in a process of its own on uvloop by default, even with one
worker, and what it had buffered for the runner, journaled as the ``load_process`` note; with
``load.process: runner`` it shares the runner's (asyncio) loop, and the note says so."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(120)


def _experiment(**load: Any) -> dict[str, Any]:
    return {
        "name": "load-process",
        "seed": 3,
        "target": {"kind": "builtin", "model": "tiny"},
        "load": {"concurrency": 2, "max_tokens": 8, **load},
        "phases": [{"name": "steady", "duration": "1s"}],
        "sla": [{"kind": "errors", "budget": "0%"}],
        "safety": {"max_duration": "60s", "cleanup_window": "300ms"},
    }


@pytest.mark.parametrize(("load", "loops", "workers"), [({}, ["uvloop"], 1),
                                                         ({"process": "runner"}, ["asyncio"], None)])
def test_the_load_process_and_its_loop_are_journaled(chaos_run: Callable[..., Any], load: dict[str, Any],
                                                     loops: list[str], workers: int | None) -> None:
    result = chaos_run(_experiment(**load), check=True)
    (note,) = result.observations.notes_on("load_process")
    assert note.data["loops"] == loops, note.data
    assert note.data.get("workers") == workers, note.data
    assert note.data["sent"] >= 2 and note.data["in_flight"] == 0
    if workers:  # records crossed to the runner through the uplink, never held back long
        assert note.data["uplink_over_high_water_s"] == 0.0 and note.data["uplink_buffered_bytes"] >= 0
