"""One request's trip through the engine (``Generation``) and the shared state of a stack app.

A ``Generation`` is submitted synchronously (so prompt errors become a 400 before any header is
sent), then yields text deltas: engine outputs cross from the engine thread through a queue, go
past the ``detokenize`` hook point and the incremental detokenizer, and are timed into the
metrics. Closing it before the end (a disconnect, a cancelled task, an injected timeout) aborts
the engine request, which frees its KV blocks at the next step boundary. ``finalize`` counts the
outcome exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from chaos.model.errors import ChaosError

from .engine import Engine, IncrementalDetokenizer, SamplingParams, TokenOutput
from .hooks import Hooks
from .leases import Leases
from .metrics import StackMetrics
from .sockets import Connections

__all__ = ["Delta", "Generation", "GenerationFailed", "Stack", "stack_of"]

log = logging.getLogger("chaos.stack.server")


class GenerationFailed(ChaosError):
    """The engine ended a request with an error (or the server aborted it); sent in-band."""

    def __init__(self, message: str, type: str = "InternalServerError", code: int = 500) -> None:
        super().__init__(message)
        self.message = message
        self.type = type
        self.code = code


@dataclass(frozen=True)
class Delta:
    """Newly complete text of one request; ``finish_reason`` is set on the last one."""

    text: str
    finish_reason: str | None = None


class Stack:
    """What every route of one app shares: the engine, its tokenizer, metrics, hooks, live requests."""

    def __init__(self, engine: Engine, model_name: str, versions: dict[str, str],
                 admin_token: str | None, max_body_bytes: int) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name = model_name
        self.versions = versions
        self.admin_token = admin_token
        self.max_body_bytes = max_body_bytes
        self.metrics = StackMetrics(engine.stats, model_name, versions)
        self.connections = Connections()  # accepted TCP connections, registered by serve.py's protocol
        self.hooks = Hooks(engine, connections=self.connections)
        self.leases = Leases()  # hook faults and the KV reservation end by themselves unless renewed
        engine.step_hook = self.hooks.engine_step
        self.live: dict[str, Generation] = {}
        self.shutting_down = False

    def begin_shutdown(self, reason: str = "the server is shutting down") -> int:
        """Refuse new requests and fail every live one, so each stream ends with an in-band error."""
        self.shutting_down = True
        for rid in list(self.live):
            self.engine.fail(rid, reason)
        return len(self.live)


class Generation:
    """One request in the engine, consumed as ``Delta``s by exactly one response."""

    def __init__(self, stack: Stack, prefix: str, prompt_ids: list[int], params: SamplingParams) -> None:
        self.stack = stack
        self.request_id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.arrival = time.monotonic()
        self.prompt_tokens = len(prompt_ids)
        self.completion_tokens = 0
        self.cached_tokens = 0  # prompt tokens the engine served from its prefix cache
        self.outcome: str | None = None  # stop | length | error; None at finalize means abort
        self._queue: asyncio.Queue[TokenOutput] = asyncio.Queue()
        self._finished = False
        self._finalized = False
        loop = asyncio.get_running_loop()

        def on_output(out: TokenOutput) -> None:  # engine thread
            try:
                loop.call_soon_threadsafe(self._queue.put_nowait, out)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

        stack.hooks.begin(self.request_id)
        try:
            # raises InvalidRequest/PromptTooLong (→ 400) or EngineStopped (→ 503) before any header
            stack.engine.add_request(self.request_id, prompt_ids, params, on_output)
        except BaseException:
            stack.hooks.end(self.request_id)
            raise
        stack.live[self.request_id] = self

    async def deltas(self) -> AsyncGenerator[Delta, None]:
        """Text deltas until the finish; raises ``GenerationFailed`` or ``asyncio.TimeoutError``."""
        hooks, metrics = self.stack.hooks, self.stack.metrics
        detok = IncrementalDetokenizer(self.stack.tokenizer)
        last: float | None = None
        try:
            while True:
                out = await self._queue.get()
                now = time.monotonic()
                if out.token_ids:
                    if last is None:
                        metrics.ttft.observe(now - self.arrival)
                    else:
                        metrics.itl.observe(now - last)
                    last = now
                self.completion_tokens = out.completion_tokens
                self.cached_tokens = out.cached_tokens
                if out.finished:
                    self._finished = True
                    if out.finish_reason in ("error", "abort"):
                        raise self._failed(out)
                try:
                    hooks.check(self.request_id, "detokenize")
                except TimeoutError:
                    self.outcome = "error"
                    raise
                text = detok.push(out.token_ids)
                if out.finished:
                    self.outcome = out.finish_reason or "stop"
                    metrics.e2e.observe(now - self.arrival)
                    yield Delta(text + detok.flush(), self.outcome)
                    return
                if text:
                    yield Delta(text)
        finally:
            if not self._finished:
                self.stack.engine.abort(self.request_id)  # frees its blocks at the next step

    def _failed(self, out: TokenOutput) -> GenerationFailed:
        """An error or abort finish: the outcome is an error; the exception to raise says why."""
        self.outcome = "error"
        message = out.error or "the request was aborted by the server"
        if message.startswith("asyncio.TimeoutError"):  # the engine_step hook fired
            return GenerationFailed(message, "TimeoutError", 504)
        if self.stack.shutting_down:
            return GenerationFailed(message, "ServiceUnavailableError", 503)
        return GenerationFailed(message)

    def fail(self) -> None:
        """Mark the outcome as an error (a failure outside ``deltas``, e.g. at the send hook)."""
        self.outcome = "error"

    def finalize(self) -> None:
        """Count the outcome once, make sure the engine lets go of the request, forget it."""
        if self._finalized:
            return
        self._finalized = True
        if not self._finished:
            self.stack.engine.abort(self.request_id)
        self.stack.metrics.finished(self.outcome or "abort")
        self.stack.hooks.end(self.request_id)
        self.stack.live.pop(self.request_id, None)

    def usage(self) -> dict[str, Any]:
        use: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }
        if self.cached_tokens:  # as vLLM, which adds the details only when asked (--enable-prompt-tokens-details)
            use["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return use


def stack_of(request: Any) -> Stack:
    """The ``Stack`` of the app serving a Starlette request."""
    stack: Stack = request.app.state.stack
    return stack
