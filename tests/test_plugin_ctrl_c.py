"""Under pytest (which owns SIGINT) a run is stopped through ``runner.interrupt``: the first Ctrl-C
reverts and stops it, a second forces the exit (issue 41, point 2). The plugin waits for the run and
hands each Ctrl-C on meanwhile. Before, it did not wait at all: on Python 3.11 a KeyboardInterrupt
inside ``Thread.join`` marks the thread ended (bpo-45274's clean-up), so its ``join(120)`` returned at
once, pytest went on while the run was still reverting, and a second Ctrl-C never reached the run.

A stand-in runner plays the run (its loop, its thread), and the Ctrl-Cs are KeyboardInterrupts
raised in the main thread as SIGINT would (``_thread.interrupt_main``).
"""

from __future__ import annotations

import _thread
import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import chaos.api
from chaos.experiment import experiment_from_dict
from chaos.pytest_plugin import _run_blocking

pytestmark = pytest.mark.timeout(30)


class TwoCtrlCs:
    """A run during which the user presses Ctrl-C, then again once the first has reached the run, if the
    plugin still waits for it (a Ctrl-C after the plugin returned would stop this pytest session)."""

    def __init__(self) -> None:
        self.heard: list[str] = []
        self.caller_left = threading.Event()  # the plugin returned (or raised)
        self.ended = threading.Event()

    def interrupt(self, name: str) -> None:
        self.heard.append(name)

    async def _heard(self, count: int, within_s: float) -> bool:
        end = time.monotonic() + within_s
        while len(self.heard) < count and time.monotonic() < end and not self.caller_left.is_set():
            await asyncio.sleep(0.01)
        return len(self.heard) >= count

    async def run(self) -> str:
        try:
            _thread.interrupt_main()  # the first Ctrl-C
            if await self._heard(1, 5.0) and not self.caller_left.is_set():
                _thread.interrupt_main()  # the second, while the plugin waits for the run to stop
                await self._heard(2, 5.0)
            await asyncio.sleep(0.3)  # the run's teardown: the plugin waits for it
            return "stopped"
        finally:
            self.ended.set()


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("a KeyboardInterrupt from SIGINT lands in the main thread only")
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _until_ended(fake: TwoCtrlCs) -> int:
    """Wait for the stand-in's end, taking any Ctrl-C it sent after the plugin stopped waiting; their count."""
    stray = 0
    while True:
        try:
            if fake.ended.wait(0.1):
                time.sleep(0.05)  # a Ctrl-C sent just before its end lands here
                return stray
        except KeyboardInterrupt:
            stray += 1


def test_the_run_is_waited_for_and_each_further_ctrl_c_reaches_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sigint_raises: None) -> None:
    fake = TwoCtrlCs()
    monkeypatch.setattr(chaos.api, "runner", lambda *args, **kwargs: fake)
    exp: Any = experiment_from_dict({"name": "ctrl-c", "target": {"url": "http://127.0.0.1:9"},
                                     "phases": [{"name": "p", "duration": "1s"}]})
    try:
        with pytest.raises(KeyboardInterrupt):
            _run_blocking(exp, out_dir=tmp_path / "run")
        ended_first = fake.ended.is_set()
    finally:
        fake.caller_left.set()
        stray = _until_ended(fake)
    assert ended_first  # the plugin waited for the run (before: it returned at the first Ctrl-C, run still going)
    assert fake.heard == ["KeyboardInterrupt", "KeyboardInterrupt"] and stray == 0  # before: the first only
