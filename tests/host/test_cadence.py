"""The run's periodic work shares one grid of the monotonic clock (chaos.host.cadence): the halt
check, the host and GPU samplers, a load process's activity report and its records wake the idle
runner on the same ticks instead of each on its own timer."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

import pytest

from chaos.execution import halt as halt_module
from chaos.execution.halt import HaltWatcher
from chaos.experiment.loader import parse_experiment
from chaos.host.cadence import EARLY_S, next_tick, seconds_to_next_tick
from chaos.host.sampling import polled
from chaos.model.observations import MetricSample

EXPERIMENT = ("name: ticks\ntarget: {kind: openai, url: 'http://127.0.0.1:9', model: m}\n"
              "phases: [{name: a, duration: 1s}]\n")


def _on_grid(t: float, period: float) -> bool:
    return math.isclose(t / period, round(t / period), abs_tol=1e-6)


def test_the_next_tick_is_the_first_multiple_of_the_period_after_now() -> None:
    assert next_tick(0.5, 10.2) == 10.5
    assert next_tick(0.5, 10.5) == 11.0  # strictly after: a wake-up at a tick waits for the next one
    assert next_tick(1.0, 0.0) == 1.0
    for period in (0.1, 0.2, 0.5, 1.0):
        for now in (0.0, 0.05, 123.456789, 98765.4321):
            tick = next_tick(period, now)
            assert now < tick <= now + period + 1e-9 and _on_grid(tick, period)
    # periods that divide each other share their ticks: every 0.5 s tick is a 0.1 s tick too
    assert _on_grid(next_tick(0.5, 77.77), 0.1)
    with pytest.raises(ValueError, match="positive"):
        next_tick(0.0, 1.0)


def test_a_wake_up_just_before_a_tick_counts_as_at_it() -> None:
    """A timer that fires a millisecond early must not schedule a second run a millisecond later."""
    for _ in range(200):
        left = seconds_to_next_tick(0.1)
        assert EARLY_S < left <= 0.1 + EARLY_S + 1e-6


async def test_the_halt_check_is_armed_on_the_shared_tick() -> None:
    watcher = HaltWatcher(parse_experiment(EXPERIMENT).safety, lambda why: None, lambda note: None)
    assert watcher.active
    loop = asyncio.get_running_loop()
    assert abs(loop.time() - time.monotonic()) < 0.005  # the loop's timers are on the monotonic clock
    for _ in range(3):
        watcher._arm()
        assert watcher._timer is not None
        when = watcher._timer.when()
        # within the loop's own clock granularity (uvloop's is a millisecond) of a 0.5 s tick
        assert abs(when - round(when / halt_module.CHECK_EVERY_S) * halt_module.CHECK_EVERY_S) < 0.003, when
        watcher._disarm()


async def test_a_polled_sampler_runs_on_the_ticks_once_per_tick_never_before_one() -> None:
    period = 0.2
    at: list[float] = []

    def sample() -> list[MetricSample]:
        at.append(time.monotonic())
        return []

    async with polled(sample, lambda record: None, period_s=period, name="ticks", errors=(OSError,)):
        for _ in range(300):  # bounded: until six samples or 30 s
            if len(at) >= 6:
                break
            await asyncio.sleep(0.1)
    assert len(at) >= 6, at
    ticks = [math.floor((t + EARLY_S) / period) for t in at[1:]]  # the first runs at once, the rest on ticks
    assert ticks == sorted(set(ticks)), at  # one sample per tick at most: none ran twice for one tick
    late = sorted(t - tick * period for t, tick in zip(at[1:], ticks, strict=True))
    assert late[0] >= -EARLY_S, at  # none early
    # on the ticks: a sampler on its own timer lands anywhere in the period (0-200 ms after a tick);
    # these land as late as the loop's timers are, which even a loaded box keeps well under 60 ms
    assert late[len(late) // 2] < 0.06, late


def test_the_host_sampler_reads_proc_through_raw_descriptors(tmp_path: Any) -> None:
    """Undecodable bytes in a process's name do not lose the process (it may name itself anything)."""
    from chaos.host.contention import _read, parse_process_stat

    stat = tmp_path / "stat"
    stat.write_bytes(b"42 (bad \xff name) S 7 42 42 0 -1 0 0 0 0 0 11 5 0 0 20 0 1 0 0 0 0\n")
    assert parse_process_stat(_read(str(stat))) == (7, 16)
    big = tmp_path / "big"
    big.write_bytes(b"cpu  1 2 3 4 5 6 7 8 0 0\n" + b"x" * 200_000 + b"\n")
    assert len(_read(str(big))) == len(big.read_bytes())  # read to the end, not one buffer's worth


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux /proc only")
def test_kept_open_proc_files_read_fresh_figures_and_let_go_of_what_ended(tmp_path: Any) -> None:
    """The run's /proc files stay open between samples: a read at offset 0 regenerates them (the CPU
    ticks of a process that worked meanwhile have grown), a file of a process that exited fails and
    is closed, a file the last sample did not read is closed, and past the limit a file is read
    the plain way (nothing kept)."""
    import subprocess
    import sys

    from chaos.host.contention import _KeptOpen, parse_process_stat

    worker = subprocess.Popen([sys.executable, "-c", "import sys\nx = 0\nfor line in sys.stdin:\n"
                               "    x += sum(range(3_000_000))\n    print(x, flush=True)\n"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    files = _KeptOpen(limit=2)
    try:
        stat = f"/proc/{worker.pid}/stat"
        before = parse_process_stat(files.read(stat))[1]
        assert worker.stdin is not None and worker.stdout is not None
        for _ in range(5):  # a few hundred ms of CPU: enough clock ticks to see
            worker.stdin.write("go\n")
            worker.stdin.flush()
            worker.stdout.readline()
        assert parse_process_stat(files.read(stat))[1] > before  # the same descriptor, fresh figures
        assert list(files._fds) == [stat]
        files.read("/proc/stat")
        files.read("/proc/self/stat")  # over the limit of two: read, not kept
        assert set(files._fds) == {stat, "/proc/stat"}
        files.sweep()
        files.read("/proc/stat")
        files.sweep()  # the worker's stat went unread in that sample: closed
        assert set(files._fds) == {"/proc/stat"}
        files.read(stat)
        worker.stdin.close()
        worker.wait(timeout=20)
        with pytest.raises(OSError):
            files.read(stat)  # ended: ESRCH, and the descriptor is gone
        assert stat not in files._fds
    finally:
        files.close()
        worker.kill()
        worker.wait(timeout=20)
    assert not files._fds


async def test_a_quick_sample_runs_on_the_loop_and_a_blocking_one_in_a_thread() -> None:
    """The host sample (a few /proc files of the run's own tree) runs on the loop: no thread hand-off
    and no second wake-up for its result; the GPU's (a driver call that may block) in a thread."""
    import threading

    for in_thread, on_loop in ((lambda: False, True), (lambda: True, False)):
        threads: list[threading.Thread] = []

        def sample(threads: list[threading.Thread] = threads) -> list[MetricSample]:
            threads.append(threading.current_thread())
            return []

        async with polled(sample, lambda record: None, period_s=0.1, name="where", errors=(OSError,),
                          in_thread=in_thread):
            for _ in range(500):  # bounded: 5 s
                if threads:
                    break
                await asyncio.sleep(0.01)
        assert threads and (threads[0] is threading.main_thread()) == on_loop, threads
