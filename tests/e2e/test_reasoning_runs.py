"""Whole runs against a reasoning model. The builtin stack started by the run with ``reasoning_tokens``, chat
load through a stream hop, and in one phase a ``stream.silence`` with ``during: reasoning``: the stall lands
inside the reasoning phase of every stream the rule took, ``itl`` within reasoning fails on it, within content
passes, ``ttft`` to the first token comes before the first output, and the verdicts are in report.json as
every other. Then chat load that forces a tool call (``load.tools``, ``tool_choice: required``): ``tool_calls``
passes against the builtin stack and fails against a server that truncates its calls
(tests/e2e/planted_tool_calls.py). About 45 s here."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from chaos.api import run
from chaos.experiment import experiment_from_dict
from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(180)

SILENCE_S = 4.0  # the stall inside each reasoning phase of the stall phase's streams
# the longest gap itl allows: 2.7x below the stall, 3x above the longest content gap seen on a busy box here
# (0.47 s, the box running other suites; 6 ms when idle)
MAX_STALL_S = 1.5

EXPERIMENT: dict[str, Any] = {
    "name": "reasoning-stall", "seed": 1,
    "target": {"kind": "builtin", "model": "tiny", "reasoning_tokens": [12, 16]},
    "path": [{"kind": "stream"}],
    "load": {"endpoint": "chat", "concurrency": 2, "max_tokens": 28, "request_timeout": "20s"},
    "phases": [
        {"name": "baseline", "duration": "3s"},
        {"name": "stall", "duration": "5s",
         "faults": [{"kind": "stream.silence", "name": "think-stall", "during": "reasoning", "after_events": 4,
                     "seconds": f"{SILENCE_S:g}s"}]},
    ],
    "sla": [
        {"kind": "ttft", "name": "ttft_token", "quantile": "p50", "budget": "5s"},
        {"kind": "ttft", "name": "ttft_output", "to": "output", "quantile": "p50", "budget": "10s"},
        # the whole run: in the stall phase the content events queued behind the silence flow out at once,
        # too few independent gaps to bound a quantile on that phase alone; max_stall decides either way
        {"kind": "itl", "name": "itl_reasoning", "within": "reasoning", "quantile": "p50", "budget": "1s",
         "max_stall": f"{MAX_STALL_S:g}s", "expect": "fail"},
        {"kind": "itl", "name": "itl_content", "within": "content", "quantile": "p50", "budget": "1s",
         "max_stall": f"{MAX_STALL_S:g}s"},
        {"kind": "itl", "name": "itl_reasoning_baseline", "within": "reasoning", "quantile": "p50", "budget": "1s",
         "max_stall": f"{MAX_STALL_S:g}s", "phases": ["baseline"]},
        {"kind": "tool_calls"},
        {"kind": "errors", "budget": "0%"},
    ],
    "safety": {"max_duration": "90s", "drain_timeout": "15s", "cleanup_window": "200ms"},
}


def test_a_stall_inside_the_reasoning_phase_is_seen_there_and_only_there(tmp_path: Path) -> None:
    result = run(experiment_from_dict(EXPERIMENT), out_dir=tmp_path / "run", handle_signals=False)
    assert result.exit_code != 4, result.error
    by = {((v.name or v.sla) if v.phase is None else f"{v.name or v.sla}[{v.phase}]"): v for v in result.verdicts}
    stalled = by["itl_reasoning"]
    assert stalled.status == "fail" and stalled.evidence["decided_by"] == "max_stall", stalled.evidence
    assert stalled.evidence["longest_stall_s"] >= SILENCE_S - 0.1, stalled.evidence
    assert by["itl_content"].status == "pass", by["itl_content"].evidence
    phase_of = {st.id: st.phase for st in result.observations.streams}
    assert phase_of[stalled.evidence["longest_stall_stream"]] == "stall"
    assert by["itl_reasoning_baseline[baseline]"].status == "pass", by["itl_reasoning_baseline[baseline]"].evidence
    assert by["errors"].status == "pass" and by["tool_calls"].status == "inconclusive"

    streams = [st for st in result.observations.streams if not st.background and st.phase in ("baseline", "stall")]
    assert len(streams) >= 6 and all(st.t_reasoning and st.t_content for st in streams if st.error is None)
    # the requests the hop says its rule silenced (those sent once it was in force, with a 5th reasoning event)
    revert = next(f for f in result.observations.faults if f.fault == "think-stall" and f.action == "revert")
    silenced = set(revert.evidence["request_ids"])
    assert silenced and silenced <= {st.id for st in streams if st.phase == "stall"}, revert.evidence
    for st in streams:  # the first token is reasoning, the first output no earlier (the same read on a busy box)
        if st.ttfo_ns is not None:
            assert st.ttft_ns is not None and st.ttft_ns <= st.ttfo_ns, st.id
            if st.id in silenced:  # the silence lies between the two
                assert st.ttfo_ns - st.ttft_ns >= (SILENCE_S - 0.1) * 1e9, st.id
    token, output = by["ttft_token"], by["ttft_output"]
    assert token.figure is not None and output.figure is not None and token.figure < output.figure
    print(f"ttft p50 {token.figure * 1000:.0f} ms to the first token, {output.figure * 1000:.0f} ms to the first "
          f"output; longest reasoning gap in the stall phase {stalled.evidence['longest_stall_s']:.2f} s, longest "
          f"content gap {by['itl_content'].evidence['longest_stall_s']:.3f} s")

    report = json.loads((tmp_path / "run" / "report.json").read_text(encoding="utf-8"))
    listed = {(v.get("name") or v["sla"], v.get("phase")) for v in report["verdicts"]}
    assert {("tool_calls", None), ("itl_reasoning", None), ("ttft_output", None)} <= listed, listed


TOOLS_RUN: dict[str, Any] = {
    "name": "tool-calls", "seed": 1,
    "target": {"kind": "builtin", "model": "tiny", "reasoning_tokens": [2, 4]},
    "load": {"endpoint": "chat", "concurrency": 2, "max_tokens": 16, "request_timeout": "20s",
             "tools": [{"type": "function", "function": {"name": "search", "parameters": {
                 "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}],
             "tool_choice": "required"},
    "phases": [{"name": "calls", "duration": "3s"}],
    "sla": [{"kind": "tool_calls"}, {"kind": "errors", "budget": "0%"}, {"kind": "early_close", "budget": "0%"}],
    "safety": {"max_duration": "60s", "drain_timeout": "10s", "cleanup_window": "200ms"},
}


@pytest.mark.parametrize("server", ["builtin", "truncate"])
def test_tool_calls_through_a_whole_run(server: str, tmp_path: Path) -> None:
    planted = None
    data, url = TOOLS_RUN, None
    if server != "builtin":
        planted = StackProcess.start(command=[sys.executable, str(Path(__file__).parent / "planted_tool_calls.py"),
                                              "--defect", server, "--port", "0", "--reasoning-tokens", "2,4"],
                                     timeout=60.0)
        data, url = dict(TOOLS_RUN, target={"kind": "openai", "model": "tiny"}), planted.base_url
    try:
        result = run(experiment_from_dict(data), target_url=url, out_dir=tmp_path / "run", handle_signals=False)
    finally:
        if planted is not None:
            planted.close()
    assert result.exit_code != 4, result.error
    by = {v.name or v.sla: v for v in result.verdicts}
    calls = by["tool_calls"]
    # the streams end cleanly either way: only the calls they carried are broken
    assert by["errors"].status == "pass" and by["early_close"].status == "pass", by["early_close"].evidence
    assert calls.samples >= 4 and calls.evidence["calls"] == calls.samples, calls.evidence
    if server == "builtin":
        assert calls.status == "pass" and calls.evidence["bad"] == 0, calls.evidence
    else:
        assert calls.status == "fail" and calls.figure == 1.0, calls.evidence
        assert calls.evidence["by_problem"] == {"invalid_json": calls.samples}
    report = json.loads((tmp_path / "run" / "report.json").read_text(encoding="utf-8"))
    (listed,) = [v for v in report["verdicts"] if v["sla"] == "tool_calls"]
    assert listed["status"] == calls.status and listed["evidence"]["bad_ids"] == calls.evidence["bad_ids"]
