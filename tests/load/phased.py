"""A closed-loop load through two phases with a server fault in force during the first: the load
client as a run drives it (``LoadGenerator``: one ``run``, the phase switched under it), for tests that
check what a fault costs the phase after it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from chaos.load.generator import LoadGenerator
from chaos.load.workload import LoadSettings, LoadTarget, PromptSettings
from chaos.model.context import ClientPolicy
from chaos.model.observations import StreamRecord

S = 1_000_000_000


async def fault_then_clean(base_url: str, disarm: Callable[[], object], *, fault_s: float = 0.4,
                           clean_s: float = 0.4, concurrency: int = 4, model: str = "tiny",
                           ) -> dict[str, list[StreamRecord]]:
    """The streams of phase ``fault`` (the fault armed by the caller beforehand, ``disarm``ed at its end,
    in a thread) and of phase ``clean`` right after it, load running throughout."""
    records: list[StreamRecord] = []
    spec = LoadSettings(concurrency=concurrency, max_tokens=(4, 4), request_timeout=10.0,
                        prompts=PromptSettings(min_chars=16, max_chars=64))
    gen = LoadGenerator(spec, LoadTarget(base_url, model, 1), policy=ClientPolicy(), sink=records.append)
    gen.phase = "fault"
    run = asyncio.ensure_future(gen.run(time.monotonic_ns() + 60 * S))
    try:
        await asyncio.sleep(fault_s)
        await asyncio.to_thread(disarm)  # the fault is out before the next phase begins, as a runner reverts
        gen.phase = "clean"
        await gen.move_deadline(time.monotonic_ns() + int(clean_s * S))
        await run
        await gen.drain(10)
    finally:
        run.cancel()
        await gen.aclose()
    return {phase: [r for r in records if r.phase == phase] for phase in ("fault", "clean")}


def errors(records: list[StreamRecord]) -> list[tuple[str, int | None, str | None]]:
    """``(kind, status, cause)`` of each failed stream, for assertion messages."""
    return [(r.error.kind, r.error.status, r.error.cause) for r in records if r.error is not None]
