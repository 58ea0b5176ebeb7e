"""A stop (signal, halt, Ctrl-C in pytest) reaches the run even when its first cancellation is lost."""

from __future__ import annotations

import asyncio

import pytest

from chaos.api import runner as make_runner
from chaos.experiment import experiment_from_dict

EXPERIMENT = experiment_from_dict({
    "name": "stop", "target": {"kind": "builtin"},
    "phases": [{"name": "baseline", "duration": "60s"}],
    "sla": [{"kind": "errors", "budget": "0%"}],
})


async def _work_that_loses_one_cancellation(swallowed: list[int]) -> str:
    """What Python 3.11's ``asyncio.wait_for`` does when a cancellation meets a result: keeps going."""
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        asyncio.current_task().uncancel()  # type: ignore[union-attr]
        swallowed.append(1)
    await asyncio.sleep(30)  # the rest of the phase
    return "ran to the end"


@pytest.mark.timeout(20)
@pytest.mark.parametrize("stop", ["interrupt", "halt"])
def test_a_stop_is_delivered_again_until_the_work_ends(stop: str) -> None:
    runner = make_runner(EXPERIMENT, handle_signals=False)

    async def main() -> tuple[bool, float]:
        swallowed: list[int] = []
        task = runner._main_task = asyncio.create_task(_work_that_loses_one_cancellation(swallowed))
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0.05)
        t0 = loop.time()
        runner.interrupt("SIGINT") if stop == "interrupt" else runner.halt("a condition tripped")
        with pytest.raises(asyncio.CancelledError):
            await task
        return bool(swallowed), loop.time() - t0

    swallowed, took = asyncio.run(main())
    assert swallowed  # the first cancellation really was lost
    assert took < 5  # and the repeat ended the work, not the end of its phase
    assert runner._stopped() is not None


def test_no_repeat_once_teardown_has_begun() -> None:
    runner = make_runner(EXPERIMENT, handle_signals=False)

    async def main() -> int:
        task = runner._main_task = asyncio.create_task(asyncio.sleep(3))
        runner.cleaning = True  # teardown: unwinding code must not be cancelled again
        runner.interrupt("SIGTERM")
        await asyncio.sleep(1.5)
        cancelled = task.cancelling()
        task.cancel()
        return cancelled

    assert asyncio.run(main()) == 0
