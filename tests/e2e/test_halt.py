"""Runner.halt: a listener stops a run mid-phase; every fault is reverted and the run ends 'halted'."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from chaos.api import runner as make_runner
from chaos.execution.runner import Runner
from chaos.experiment import experiment_from_dict
from chaos.model.observations import StreamRecord

pytestmark = pytest.mark.timeout(120)


def test_a_halted_run_reverts_and_says_why(tmp_path: Path) -> None:
    experiment = experiment_from_dict({
        "name": "halt", "target": {"kind": "builtin"}, "load": {"concurrency": 2, "max_tokens": 8},
        "phases": [{"name": "chaos", "duration": "30s", "faults": [{"kind": "client.disconnect", "after_tokens": 2}]}],
        "sla": [{"kind": "errors", "budget": "0%"}],
        "safety": {"max_duration": "2m", "cleanup_window": "200ms"},
    })

    class HaltAfter:
        def __init__(self, runner: Runner, streams: int) -> None:
            self.runner, self.left = runner, streams

        def on_event(self, event: Any) -> None:
            if isinstance(event, StreamRecord):
                self.left -= 1
                if self.left == 0:
                    self.runner.halt("test condition: 5 streams seen")

    runner = make_runner(experiment, out_dir=tmp_path / "run", handle_signals=False)
    runner.listeners.append(HaltAfter(runner, 5))
    result = asyncio.run(runner.run())
    assert result.status == "halted" and result.exit_code == 4 and "5 streams seen" in (result.error or "")
    actions = [e.action for e in result.observations.faults]
    assert actions == ["plan", "inject", "revert"]
    assert result.ended - result.started < 25  # it did not wait for the 30s phase


@pytest.mark.parametrize("shards", [1, 2])
def test_a_frozen_target_halts_within_its_window(tmp_path: Path, shards: int) -> None:
    """SIGSTOP the builtin stack mid-run: it still accepts connections, so no stream ends before the
    request timeout (60 s); ``target_down`` must see that the streams in flight get no byte and
    halt within its 3 s window (plus the check period and slack), not after the timeout. With two
    load shards (local processes) the in-flight stamps come from each shard, on the coordinator's
    clock."""
    import contextlib
    import os
    import signal
    import time

    window = 3.0
    experiment = experiment_from_dict({
        "name": "frozen", "target": {"kind": "builtin"},
        "load": {"concurrency": 2, "max_tokens": 8, "request_timeout": "60s", "shards": shards},
        "phases": [{"name": "steady", "duration": "60s"}],
        "safety": {"max_duration": "2m", "cleanup_window": "200ms", "drain_timeout": "2s",
                   "halt_on": [{"kind": "target_down", "window": f"{window:g}s"}]},
    })
    frozen: dict[str, int] = {}

    class FreezeAfter:
        def __init__(self, runner: Runner, streams: int) -> None:
            self.runner, self.left = runner, streams

        def on_event(self, event: Any) -> None:
            if isinstance(event, StreamRecord) and not frozen:
                self.left -= 1
                if self.left == 0 and self.runner.target is not None and self.runner.target.info.pid:
                    frozen["pid"], frozen["t"] = self.runner.target.info.pid, time.monotonic_ns()
                    os.kill(frozen["pid"], signal.SIGSTOP)

    runner = make_runner(experiment, out_dir=tmp_path / "run", handle_signals=False)
    runner.listeners.append(FreezeAfter(runner, 10))
    try:
        result = asyncio.run(runner.run())
    finally:
        if frozen:
            with contextlib.suppress(ProcessLookupError):  # gone once the runner stopped the stack
                os.kill(frozen["pid"], signal.SIGCONT)
    assert frozen, "the stack was never frozen"
    assert result.status == "halted", result.error
    assert "none of the" in (result.error or "") and "got a byte" in (result.error or ""), result.error
    halt = result.observations.notes_on("halt")[-1]
    after_s = (halt.t - frozen["t"]) / 1e9
    print(f"halted {after_s:.1f}s after the freeze (window {window:g}s)")
    # the halt record's time: the window from the streams' last bytes, which came before the freeze (by
    # up to a token's gap: 2.9988 s once), plus the check period and slack
    assert window - 0.1 <= after_s < window + 10
