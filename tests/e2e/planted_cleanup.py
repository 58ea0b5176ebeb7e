"""The builtin stack with one planted clean-up defect: what a server does wrong when a client leaves.

    python tests/e2e/planted_cleanup.py --defect DEFECT [--defect DEFECT ...] [stack serve flags]

(several ``--defect``: each planted, so one run can show two defects that two verdicts catch)

- ``leak_before_first_token``: a request aborted before it produced its first token keeps the KV
  blocks its prefill claimed, for good (aborts of requests that already streamed free theirs).
- ``late_free``: an aborted request stops running at once, but its KV blocks go back to the pool
  only ``--free-after`` seconds (10) later.
- ``orphans_on_timeout``: a departure noticed more than ``--notice-within`` (20 ms) after the stream's
  last write is not acted on: the request generates on for nobody. A client that hangs up right
  after a token is aborted; one whose read timed out (it waited its read timeout for the next write) is not.
- ``stall_on_hangup``: every departure runs a synchronous clean-up that blocks the server's event
  loop for ``--stall-for`` (250 ms): every other stream stalls with it.
- ``leak_cached_ref``: an aborted request's blocks that were prefix-cache hits keep an extra ref that
  is never dropped, so they stay held (a leak hidden behind cached blocks: the same blocks a healthy
  server leaves cached but free once their last holder is gone). Its other blocks are freed.

The builtin engine's own leak self-check and its exact block gauge still run: what a scrape shows
is what a user's server would show. These defects live here, in the tests, and nowhere in the product.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from chaos.stack.engine import Engine
from chaos.stack.runtime import Delta, Generation
from chaos.stack.serve import serve_main

DEFECTS = ("leak_before_first_token", "late_free", "orphans_on_timeout", "stall_on_hangup", "leak_cached_ref")
_LAST_WRITE: dict[str, float] = {}  # request id -> monotonic s of its stream's last write
_STREAMED: set[str] = set()  # request ids whose first content was written to the client


def _hide_blocks(engine: Engine, request_id: str, claim: bool) -> str | None:
    """Move a request's block table under another name, so finishing it frees nothing; with ``claim``,
    give a request still without blocks the ones its prefill would take. The name they are held under."""
    bm = engine.bm
    seq = engine._seqs.get(request_id)  # noqa: SLF001 - a planted defect reaches inside on purpose
    if seq is None:
        return None
    if bm.num_blocks_of(request_id) == 0:
        if not claim or not bm.can_allocate(seq.num_tokens):
            return None
        bm.allocate(request_id, seq.num_tokens)
    held = f"held-{request_id}"
    bm.tables[held] = bm.tables.pop(request_id)
    return held


def plant_leak_before_first_token() -> None:
    deltas = Generation.deltas
    finish = Engine._finish

    async def marked(self: Generation) -> AsyncGenerator[Delta, None]:
        async with contextlib.aclosing(deltas(self)) as inner:
            async for delta in inner:
                yield delta
                _STREAMED.add(self.request_id)  # resumed: the first content went out to the client

    def leaky(self: Engine, seq: Any, reason: str, outs: Any, new_ids: tuple[int, ...] = (),
              error: str | None = None) -> None:
        streamed = seq.request_id in _STREAMED
        _STREAMED.discard(seq.request_id)
        if reason == "abort" and not streamed:
            _hide_blocks(self, seq.request_id, claim=True)  # its client left before its first token
        finish(self, seq, reason, outs, new_ids, error)

    Generation.deltas = marked  # type: ignore[method-assign]
    Engine._finish = leaky  # type: ignore[method-assign]


def plant_late_free(after_s: float) -> None:
    finish = Engine._finish

    def late(self: Engine, seq: Any, reason: str, outs: Any, new_ids: tuple[int, ...] = (),
             error: str | None = None) -> None:
        held = _hide_blocks(self, seq.request_id, claim=False) if reason == "abort" else None
        finish(self, seq, reason, outs, new_ids, error)
        if held is not None:
            timer = threading.Timer(after_s, _free_later, (self, held))
            timer.daemon = True
            timer.start()

    Engine._finish = late  # type: ignore[method-assign]


def _free_later(engine: Engine, held: str) -> None:
    with engine._cond:  # noqa: SLF001 - the engine's own lock guards its block manager
        engine.bm.free(held)
        engine._cond.notify_all()  # noqa: SLF001


def plant_orphans_on_timeout(notice_within_s: float) -> None:
    deltas = Generation.deltas
    abort = Engine.abort

    async def timed(self: Generation) -> AsyncGenerator[Delta, None]:
        _LAST_WRITE[self.request_id] = time.monotonic()  # the headers just went out
        try:
            async with contextlib.aclosing(deltas(self)) as inner:
                async for delta in inner:
                    yield delta
                    _LAST_WRITE[self.request_id] = time.monotonic()  # resumed: its write is done
        finally:
            _LAST_WRITE.pop(self.request_id, None)

    def deaf(self: Engine, request_id: str) -> None:
        last = _LAST_WRITE.get(request_id)
        if request_id in missed or (last is not None and time.monotonic() - last > notice_within_s):
            missed.add(request_id)  # the departure came during a wait, not right after a write: missed for good
            return  # (the request runs on for nobody, until its own end)
        abort(self, request_id)

    missed: set[str] = set()

    Generation.deltas = timed  # type: ignore[method-assign]
    Engine.abort = deaf  # type: ignore[method-assign]


def plant_leak_cached_ref() -> None:
    finish = Engine._finish

    def keeps_a_ref(self: Engine, seq: Any, reason: str, outs: Any, new_ids: tuple[int, ...] = (),
                    error: str | None = None) -> None:
        hits = seq.num_cached_tokens // self.bm.block_size  # its leading blocks came from the prefix cache
        if reason == "abort" and hits and self.bm.num_blocks_of(seq.request_id) >= hits:
            self.bm.fork(seq.request_id, f"cached-ref-{seq.request_id}", hits)  # the ref nobody drops
        finish(self, seq, reason, outs, new_ids, error)

    Engine._finish = keeps_a_ref  # type: ignore[method-assign]


def plant_stall_on_hangup(stall_s: float) -> None:
    finalize = Generation.finalize

    def blocking(self: Generation) -> None:
        if not self._finalized and not self._finished:  # noqa: SLF001 - a client left mid-request
            time.sleep(stall_s)  # a synchronous clean-up on the event loop: every stream waits for it
        finalize(self)

    Generation.finalize = blocking  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--defect", required=True, choices=DEFECTS, action="append")
    parser.add_argument("--free-after", type=float, default=10.0, help="late_free: seconds until blocks are freed")
    parser.add_argument("--notice-within", type=float, default=0.02,
                        help="orphans_on_timeout: a departure later than this after a write is missed")
    parser.add_argument("--stall-for", type=float, default=0.25, help="stall_on_hangup: seconds per departure")
    args, rest = parser.parse_known_args(argv)
    plants: dict[str, Callable[[], None]] = {
        "leak_before_first_token": plant_leak_before_first_token,
        "late_free": lambda: plant_late_free(args.free_after),
        "orphans_on_timeout": lambda: plant_orphans_on_timeout(args.notice_within),
        "stall_on_hangup": lambda: plant_stall_on_hangup(args.stall_for),
        "leak_cached_ref": plant_leak_cached_ref,
    }
    for defect in dict.fromkeys(args.defect):
        plants[defect]()
    return serve_main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
