"""Connection limits for the builtin server: header, body and idle timeouts and a connection cap.

uvicorn (0.30 to 0.54) closes a keep-alive connection that stays idle after a response
(``timeout_keep_alive``), but has no deadline for a connection that never sends a request, for a
request whose headers trickle in (slowloris), or for a body that stops short of its Content-Length;
each held a socket and a file descriptor for good (issue 11, finding 8). ``limit_concurrency`` does
not cap connections either: over the limit it answers 503 per request but keeps the socket open.

So the server runs uvicorn's own h11 protocol with a small subclass (``chaos.stack.guarded_h11``,
imported only where the server starts) that adds, per connection:

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

from dataclasses import dataclass

__all__ = ["DEFAULT_LIMITS", "ServerLimits", "raw_response"]


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
    body = ('{"error":{"message":"%s","type":"invalid_request_error","param":null,"code":%d}}'
            % (message, status)).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"{extra}connection: close\r\n\r\n")
    return head.encode("latin-1") + body


_TIMEOUT_408 = raw_response(408, "Request Timeout", "the request did not arrive in time; the connection is closed")
_FULL_503 = raw_response(503, "Service Unavailable", "too many open connections; retry later", "retry-after: 1\r\n")
