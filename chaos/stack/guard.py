"""Connection limits for the builtin server: header, body and idle timeouts and a connection cap.

uvicorn (0.30 to 0.54) closes a keep-alive connection that stays idle after a response
(``timeout_keep_alive``), but has no deadline for a connection that never sends a request, for a
request whose headers trickle in (slowloris), or for a body that stops short of its Content-Length;
each held a socket and a file descriptor for good (issue 11, finding 8). ``limit_concurrency`` does
not cap connections either: over the limit it answers 503 per request but keeps the socket open.

So the server runs uvicorn's own h11 protocol with a small subclass that adds, per connection:

- a header deadline: a request's line and headers must be complete ``header_timeout`` seconds after
  the connection opened or the previous response ended (then 408 if some of it came, and close);
- a body deadline: its body must be complete ``body_timeout`` seconds after its headers (408 if no
  response has started, and close; the app sees a disconnect);
- a cap: with ``max_connections`` open, the next one is answered 503 and closed at once.

The response phase has no deadline on purpose: a slow reader is a client behaviour the faults
provoke (``client.slow_reader``), and the server must keep streaming to it. Header size stays
bounded by h11 (16 KiB: a larger header block is a 400).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where the server starts, so importing chaos.stack.serve stays light
    from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["DEFAULT_LIMITS", "ServerLimits", "guarded_protocol", "raw_response"]


@dataclass(frozen=True)
class ServerLimits:
    """Timeouts in seconds and the connection cap (``streamchaos stack serve`` flags)."""

    header_timeout: float = 10.0  # a client on a slow link sends a request line and headers in well under 1 s
    body_timeout: float = 30.0  # the 1 MiB body cap at 35 KB/s; the load generator sends < 10 KB at once
    keep_alive_timeout: float = 5.0  # idle between requests (uvicorn's own timer)
    max_connections: int = 512  # far above max_num_seqs (64); a load of more streams gets 503s, not a full fd table


DEFAULT_LIMITS = ServerLimits()


def raw_response(status: int, reason: str, message: str, extra: str = "") -> bytes:
    """A complete ``Connection: close`` response with a JSON error object, written without h11."""
    body = ('{"error":{"message":"%s","type":"invalid_request_error","param":null,"code":%d}}' % (message, status)).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"{extra}connection: close\r\n\r\n")
    return head.encode("latin-1") + body


_TIMEOUT_408 = raw_response(408, "Request Timeout", "the request did not arrive in time; the connection is closed")
_FULL_503 = raw_response(503, "Service Unavailable", "too many open connections; retry later", "retry-after: 1\r\n")


def guarded_protocol(limits: ServerLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol class with ``limits`` applied (pass it as ``uvicorn.Config(http=...)``)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        _refused = False
        _deadline: asyncio.TimerHandle | None = None
        _stage: str | None = None  # "header" or "body": which deadline is armed

        def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
            if len(self.connections) >= limits.max_connections:
                self._refused = True
                self.transport = transport  # type: ignore[assignment]
                transport.write(_FULL_503)  # type: ignore[attr-defined]
                transport.close()
                return
            super().connection_made(transport)  # type: ignore[arg-type]
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
                self._arm("header", limits.header_timeout)
            elif state is h11.SEND_BODY:
                self._arm("body", limits.body_timeout)
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
                             limits.header_timeout if stage == "header" else limits.body_timeout)
            self.transport.close()

    return GuardedH11Protocol
