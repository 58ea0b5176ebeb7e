"""An open-loop run reports the generator's own send delay per phase (in the client_lag note and the
report), and the ttft evidence gives TTFT from the scheduled time beside TTFT from the send."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(120)

EXPERIMENT: dict[str, Any] = {
    "name": "open-loop-send-delay",
    "seed": 5,
    "target": {"kind": "builtin", "model": "tiny"},
    "load": {"rate": 20, "max_tokens": 8},
    "phases": [{"name": "one", "duration": "2s"}, {"name": "two", "duration": "2s"}],
    "sla": [{"kind": "ttft", "quantile": "p50", "budget": "2s"}, {"kind": "errors", "budget": "0%"}],
    "safety": {"max_duration": "60s", "cleanup_window": "500ms"},
}


def test_send_delay_is_reported_per_phase(chaos_run: Callable[..., Any]) -> None:
    result = chaos_run(EXPERIMENT, check=True)
    delays = result.client_lag["send_delay"]
    assert set(delays) == {"one", "two"}, delays
    sent = {p: sum(1 for s in result.observations.population(p) if s.t_scheduled is not None) for p in ("one", "two")}
    for phase, summary in delays.items():
        assert summary["samples"] == sent[phase] > 10
        assert 0 <= summary["p50_ms"] <= summary["p99_ms"] <= summary["max_ms"]
    note = next(n for n in reversed(result.observations.notes) if n.topic == "client_lag")
    assert note.data["send_delay"] == delays  # journaled: `streamchaos verify` re-judges with it
    report = json.loads((result.out_dir / "report.json").read_text())
    assert report["load"]["client_lag"]["send_delay"]["one"]["samples"] == sent["one"]
    ttft = next(v for v in result.verdicts if v.sla == "ttft")
    # per stream, TTFT from the schedule is TTFT from the send plus the send's delay; but a send may
    # leave a little before its scheduled time (12 of 74 in one run, up to 0.8 ms early: schedule_delay
    # counts those as 0), so the p50s are ordered up to the earliest send, not exactly (once in CI
    # 12.262 ms against 12.304 ms)
    streams = [s for s in result.observations.population() if s.t_scheduled is not None and s.t_sent is not None]
    early_s = max(0, *(s.t_scheduled - s.t_sent for s in streams)) / 1e9
    assert ttft.evidence["ttft_from_scheduled"]["p50"] >= ttft.evidence["ttft"]["p50"] - early_s
    assert ttft.evidence["ttft"]["p50"] > 0
    assert ttft.evidence["schedule_delay"]["p50"] >= 0
