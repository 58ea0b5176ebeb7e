"""The guarded h11 protocol (``chaos.stack.guard`` says what it adds and why); imported only where
the server starts, so importing the stack's other modules needs neither uvicorn nor h11."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from chaos.stack.guard import _FULL_503, _TIMEOUT_408, ServerLimits

__all__ = ["GuardedH11Protocol", "guarded_protocol"]


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the header and body deadlines and the connection cap of
    ``limits`` (set on a subclass by ``guarded_protocol`` below)."""

    limits: ClassVar[ServerLimits]
    _refused = False
    _deadline: asyncio.TimerHandle | None = None
    _stage: str | None = None  # "header" or "body": which deadline is armed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport, as uvicorn's protocols are given (uvloop's is no asyncio.Transport subclass)
        stream = cast(asyncio.Transport, transport)
        if len(self.connections) >= self.limits.max_connections:
            self._refused = True
            self.transport = stream
            stream.write(_FULL_503)
            stream.close()
            return
        super().connection_made(stream)
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if not self._refused:
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def _follow(self) -> None:
        """Arm the deadline that fits where the client's side of the exchange is now."""
        state = self.conn.their_state
        if state is h11.IDLE:
            self._arm("header", self.limits.header_timeout)
        elif state is h11.SEND_BODY:
            self._arm("body", self.limits.body_timeout)
        else:  # the request is in (or the connection is ending): the response has no deadline
            self._disarm()

    def _arm(self, stage: str, seconds: float) -> None:
        if self._stage == stage:
            return  # already counting from when this stage began
        self._disarm()
        self._stage = stage
        self._deadline = self.loop.call_later(seconds, self._expired, stage)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._stage = None, None

    def _expired(self, stage: str) -> None:
        self._deadline, self._stage = None, None
        if self.transport.is_closing():
            return
        started = self.conn.trailing_data[0] if stage == "header" else b"x"
        cycle: Any = self.cycle
        answered = stage == "body" and cycle is not None and cycle.response_started
        if started and not answered:
            self.transport.write(_TIMEOUT_408)
        self.logger.info("closing a connection from %s: its request %s did not arrive within %gs",
                         self.client, "headers" if stage == "header" else "body",
                         self.limits.header_timeout if stage == "header" else self.limits.body_timeout)
        self.transport.close()


def guarded_protocol(limits: ServerLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol class with ``limits`` applied (pass it as ``uvicorn.Config(http=...)``)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})
