"""A whole run with its load split across two local shard processes: merged, judged as one run, re-judged offline."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from chaos.api import runner as make_runner
from chaos.experiment import experiment_from_dict
from chaos.model.observations import Observations
from chaos.output.replay import replay

pytestmark = pytest.mark.timeout(180)

EXPERIMENT = {
    "name": "sharded", "seed": 9,
    "target": {"kind": "builtin", "kv_blocks": 128},
    "load": {"concurrency": 4, "max_tokens": 8, "shards": 2},
    "phases": [
        {"name": "baseline", "duration": "1.5s"},
        {"name": "storm", "duration": "1.5s", "faults": [
            {"kind": "client.disconnect", "fraction": "100%", "after_tokens": 2},
            {"kind": "kv.pressure", "method": "hog", "hog_streams": 2, "hog_prompt_chars": 64, "hog_max_tokens": 64},
        ]},
    ],
    "sla": [
        {"kind": "errors", "budget": "0%"},
        {"kind": "ttft", "phases": ["baseline"], "quantile": "p50", "budget": "5s"},
        {"kind": "early_close", "budget": "0%"},
    ],
    "safety": {"max_duration": "1m", "cleanup_window": "300ms", "drain_timeout": "5s"},
}


def test_a_sharded_run_is_merged_and_judged_as_one(tmp_path: Path) -> None:
    result = asyncio.run(make_runner(experiment_from_dict(EXPERIMENT), out_dir=tmp_path / "run",
                                     handle_signals=False).run())
    assert result.status == "completed", result.error
    assert result.ok, [v.to_dict() for v in result.failing()]
    run = tmp_path / "run"
    assert (run / "journal.shard-0.jsonl").is_file() and (run / "journal.shard-1.jsonl").is_file()

    streams = result.observations.population()
    assert {s.id.split("-")[0] for s in streams} == {"0", "1"}  # both shards' load, one population
    assert len({s.id for s in streams}) == len(streams)
    # The client rule reached both shards. A stream may join "storm" in the moment between the phase
    # change and the rule's arrival (streams join a phase before its injects, by design): at most one
    # such stream per slot, so every other storm stream hangs up.
    storm = [s for s in streams if s.phase == "storm"]
    hung_up = [s for s in storm if s.hangup is not None]
    assert {s.id.split("-")[0] for s in hung_up} == {"0", "1"}
    assert len(storm) - len(hung_up) <= EXPERIMENT["load"]["concurrency"], [(s.id, s.t_sent) for s in storm
                                                                            if s.hangup is None]
    assert all(s.hangup is None for s in streams if s.phase == "baseline")
    background = [s for s in result.observations.streams if s.background]
    assert {s.id.split("-")[0] for s in background} == {"0", "1"}  # the hog's streams split across the shards too

    (note,) = result.observations.notes_on("shards")
    assert [s["index"] for s in note.data["shards"].values()] == [0, 1]
    for shard in note.data["shards"].values():
        assert shard["records_live"] + shard["records_from_journal"] == shard["records_written"] > 0
        assert abs(shard["clock"]["offset_ns"]) <= shard["clock"]["bound_ns"]  # same host: the true offset is 0

    # the report shows each shard's clock offset and bound
    report = json.loads((run / "report.json").read_text(encoding="utf-8"))
    assert report["environment"]["shards"]["shards"]["1"]["clock"]["bound_ns"] > 0
    assert "load shards: clock offsets" in (run / "report.html").read_text(encoding="utf-8")

    # every record is in the main journal: `streamchaos verify` re-judges the merged run from it alone
    assert len(Observations.load(run / "journal.jsonl").streams) == len(result.observations.streams)
    again = replay(experiment_from_dict(EXPERIMENT), run)
    assert [(v.sla, v.phase, v.status) for v in again.verdicts] == [(v.sla, v.phase, v.status) for v in result.verdicts]
