"""Whether a server keeps an HTTP/1.1 connection open after a streamed response, as it says it will.

A server that answers ``Keep-Alive: timeout=5, max=100`` (or nothing, which in HTTP/1.1 means the
same) and then closes the connection right after the last chunk of a streamed response breaks
RFC 9112 §9.6 (a server that closes must say ``Connection: close``), and a client that reuses the
connection in the moment before the FIN arrives loses its next request unanswered. llama.cpp's
``llama-server`` (cpp-httplib) does it after every streamed response (measured: 1 of 20 sequential
streamed requests answered on one connection, 20 of 20 unstreamed). curl and the OpenAI SDK hide it
by sending again; a client that checks a kept connection for EOF before reuse (httpx) mostly opens a
new one. A load that reuses at once loses ~11% of its requests (cause ``stale_connection``): an
error rate that is the server's HTTP framing, not its serving.

``probe_keep_alive`` asks once, before the load: one short streamed request on a fresh connection,
then a look at that connection ``LINGER_S`` later. ``load.http.keep_alive`` decides what the load
does with the answer (``keep_alive_reuse``): ``auto`` opens a connection per request against such a
server and says so; ``on`` reuses whatever the server leaves open (its losses then count);
``off`` never reuses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from chaos.load.client import stream_request
from chaos.load.http1 import Connection, H1Client
from chaos.model.observations import StreamRecord

__all__ = ["LINGER_S", "KeepAliveFinding", "KeepAliveMode", "keep_alive_reuse", "probe_keep_alive", "undecided"]

KeepAliveMode = Literal["auto", "on", "off"]

# how long after a streamed response the connection must still be open: a closed loop sends its next
# request within a millisecond, a paced one within its gap; a server keeping connections for less
# than this is one whose connections a load cannot count on
LINGER_S = 0.15


@dataclass(frozen=True)
class KeepAliveFinding:
    """What one streamed request showed of the server's keep-alive."""

    closes_after_stream: bool
    said: str  # the response's Connection / Keep-Alive headers, in words ("none": HTTP/1.1's default)
    detail: str  # one line for the console and report.json
    decided: bool = True  # False: the probe got no complete answer, so nothing is known of the connection

    def to_dict(self) -> dict[str, Any]:
        return {"closes_after_stream": self.closes_after_stream, "said": self.said, "detail": self.detail,
                "decided": self.decided}


def undecided(why: str) -> KeepAliveFinding:
    """A probe that could not tell: the load reuses connections (and counts what is lost), and says why."""
    return KeepAliveFinding(False, "unknown", why, decided=False)


def keep_alive_reuse(mode: KeepAliveMode | str, finding: KeepAliveFinding | None) -> bool:
    """Whether the load reuses connections: ``auto`` unless the server closes them after a stream. Pure."""
    if mode == "off":
        return False
    if mode == "on":
        return True
    return not (finding is not None and finding.closes_after_stream)


class _ProbeClient(H1Client):
    """An ``H1Client`` that keeps the head of the response it takes back: the probe reads the keep-alive
    the server announced after the connection (and its head with it) may be gone. The load's client
    keeps nothing of the kind on its per-request path."""

    answer: Mapping[str, str] = {}

    def release(self, conn: Connection, *, in_band_error: bool = False) -> None:
        self.answer = conn.headers
        super().release(conn, in_band_error=in_band_error)


def _said(headers: Mapping[str, str]) -> str:
    parts = [f"{name}: {headers[name]}" for name in ("connection", "keep-alive") if name in headers]
    return ", ".join(parts) or "none"


async def probe_keep_alive(url: str, body: Mapping[str, Any], *, api_key: str | None = None,
                           headers: Mapping[str, str] | None = None, timeout_s: float = 10.0,
                           linger_s: float = LINGER_S) -> KeepAliveFinding:
    """Send ``body`` (a short streamed request) to ``url`` over HTTP/1.1 with ``headers`` (every header the
    load sends) and see whether the server left the connection open ``linger_s`` after the response; None
    where the request itself did not complete: ``undecided``, saying why (nothing is known of the connection)."""
    async with _ProbeClient(1, api_key=api_key, headers=headers) as http:  # headers: None sends the SDK's
        record = StreamRecord(id="keep_alive_probe", phase="preflight")
        await stream_request(http, url, body, record, request_timeout=timeout_s)
        if record.error is not None or record.status != 200:
            status = f"HTTP {record.status}" if record.status else "no answer"
            what = f"{status}: {record.error.message[:200]}" if record.error is not None else status
            return undecided(f"the probe request got no complete answer ({what})")
        target = http.target(url)
        answer = http.answer
        t_end = time.monotonic()
        await asyncio.sleep(linger_s)
        still_open = http.idle_connection(target) is not None
    said = _said(answer)
    if still_open:
        return KeepAliveFinding(False, said, f"kept the connection open {linger_s * 1000:.0f} ms after a streamed "
                                             f"response ({said})")
    closing = "connection" in answer and "close" in answer["connection"].lower()
    how = "as it said it would" if closing else "without Connection: close"
    waited = (time.monotonic() - t_end) * 1000
    return KeepAliveFinding(True, said, f"closed the connection within {waited:.0f} ms of a streamed response, "
                                        f"{how} (the response said {said})")
