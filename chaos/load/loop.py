"""Which event loop the load generator's own processes run: uvloop when installed (measured faster).

``STREAMCHAOS_LOOP=asyncio`` forces the standard loop, ``=uvloop`` requires uvloop. Only processes
the generator owns (worker processes, benchmark clients) are switched; a caller's loop (the runner
in the CLI or in pytest) is never replaced from here.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from chaos.model.errors import SetupFailed

__all__ = ["loop_factory", "loop_name", "run"]

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory when wanted and installed; None means asyncio's default loop."""
    wanted = os.environ.get("STREAMCHAOS_LOOP", "auto").strip().lower() or "auto"
    if wanted not in ("auto", "asyncio", "uvloop"):
        raise SetupFailed(f"STREAMCHAOS_LOOP={wanted!r}: use auto, asyncio or uvloop")
    if wanted == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if wanted == "uvloop":
            raise SetupFailed("STREAMCHAOS_LOOP=uvloop but uvloop is not installed (a core dependency, "
                              "except on Windows): pip install uvloop") from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def loop_name() -> str:
    return "asyncio" if loop_factory() is None else "uvloop"


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)
