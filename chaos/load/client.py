"""One streaming request over httpx → a filled ``StreamRecord``, shaped by the request's ``ClientPlan``.

Every stamp comes from ``time.monotonic_ns()`` and is taken when bytes arrive, before any JSON is
parsed, so parsing cost never shows up as server latency. Nothing here raises for what a server
does wrong: errors, early closes and malformed events all end up as fields of the record. Only
cancellation (the generator draining) propagates, after the record has been marked ``cancelled``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from chaos.load.sse import SSEEvent, SSEParser
from chaos.observations import ErrorInfo, Hangup, StreamRecord
from chaos.context import ClientPlan

__all__ = ["make_http_client", "stream_request"]

_BODY_LIMIT = 64 * 1024  # how much of an error body to read
_RATE_SLICE_S = 0.05  # a rate-capped reader consumes this much time's worth of bytes per step
# httpcore trace events that mark the request leaving this process: a TCP connect begins (a new
# connection) or the request line and headers begin to be written (a kept-alive one)
_SENT_EVENTS = frozenset({
    "connection.connect_tcp.started", "connection.connect_unix_socket.started",
    "http11.send_request_headers.started", "http2.send_request_headers.started",
})
_HEADERS_EVENTS = frozenset({"http11.receive_response_headers.complete", "http2.receive_response_headers.complete"})


def make_http_client(connections: int, *, api_key: str | None = None, connect_timeout: float = 10.0) -> httpx.AsyncClient:
    """A keep-alive HTTP/1.1 client whose pool holds ``connections`` streams without queueing."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(
        http1=True,
        http2=False,
        headers=headers,
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=30.0),
        # read timeouts are ours (per plan, and the overall request timeout); httpx's would race them
        timeout=httpx.Timeout(connect=connect_timeout, read=None, write=connect_timeout, pool=None),
    )


class _Hangup(Exception):
    """Internal: the plan says hang up now."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _Stream:
    """The per-request state machine fed with (stamp, bytes)."""

    def __init__(self, record: StreamRecord) -> None:
        self.record = record
        self.parser = SSEParser()
        self.text: list[str] = []
        self.finished = False

    def feed(self, t: int, chunk: bytes) -> None:
        rec = self.record
        rec.read_count += 1
        rec.bytes_received += len(chunk)
        if rec.t_first_byte is None:
            rec.t_first_byte = t
        for event in self.parser.feed(chunk):
            self.event(t, event)

    def finish(self, t: int, *, flush: bool = True) -> None:
        """Close the books; ``flush``: the body ended, so an unterminated last event still counts."""
        if self.finished:
            return
        self.finished = True
        if flush:
            for event in self.parser.close():
                self.record.sse_errors += 1  # the stream ended inside an event
                self.event(t, event)
        self.record.utf8_errors = self.parser.utf8_errors
        self.record.split_chars = self.parser.split_chars
        self.record.text = "".join(self.text)

    def event(self, t: int, event: SSEEvent) -> None:
        rec = self.record
        rec.events += 1
        if rec.t_first_event is None:
            rec.t_first_event = t
        if event.data is None:
            rec.sse_errors += 1  # fields but no data line
            return
        if rec.done_seen:
            rec.sse_errors += 1  # anything after [DONE] is a framing error
            return
        data = event.data
        if data.strip() == "[DONE]":
            rec.done_seen = True
            rec.t_end = t
            return
        try:
            obj = json.loads(data)
        except ValueError:
            rec.json_errors += 1
            return
        if not isinstance(obj, dict):
            rec.json_errors += 1
            return
        if "error" in obj and obj["error"] is not None:
            err = obj["error"]
            message = err.get("message") if isinstance(err, dict) else None
            rec.in_band_error = str(message) if message else json.dumps(err, ensure_ascii=False)[:500]
        usage = obj.get("usage")
        if isinstance(usage, dict):
            rec.usage = usage
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # n=1 streams: only choice 0 is ours
            text = choice.get("text")
            if text is None:
                delta = choice.get("delta")
                text = delta.get("content") if isinstance(delta, dict) else None
            if text:
                self.text.append(str(text))
                rec.t_content.append(t)
                if rec.t_first_content is None:
                    rec.t_first_content = t
            if choice.get("finish_reason") is not None:
                rec.finish_reason = str(choice["finish_reason"])


def _error_kind(exc: BaseException) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect"
    if isinstance(exc, httpx.RemoteProtocolError):
        # a peer that closes mid-body is a cut stream, not a protocol violation
        return "read" if "peer closed" in str(exc) else "protocol"
    if isinstance(exc, (httpx.NetworkError, OSError)):
        return "read"
    if isinstance(exc, httpx.ProtocolError):
        return "protocol"
    return "read"


def _http_message(status: int, body: bytes) -> str:
    try:
        obj = json.loads(body)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:500]
        if isinstance(err, str):
            return err[:500]
    except ValueError:
        pass
    text = body.decode("utf-8", errors="replace").strip()
    return text[:500] or f"HTTP {status}"


async def _paced(raw: AsyncIterator[bytes], plan: ClientPlan) -> AsyncIterator[bytes]:
    """Yield network reads as a slow or impatient client would consume them."""
    rate = plan.read_rate_bps
    consumed = 0
    t0: float | None = None
    loop = asyncio.get_running_loop()
    while True:
        if plan.read_delay_s > 0:
            await asyncio.sleep(plan.read_delay_s)
        try:
            if plan.read_timeout_s is not None:
                async with asyncio.timeout(plan.read_timeout_s):
                    chunk = await anext(raw)
            else:
                chunk = await anext(raw)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise _Hangup("read_timeout") from None
        if rate is None or rate <= 0:
            yield chunk
            continue
        # A rate-capped reader takes the read apart and consumes it slice by slice on a budget;
        # the next network read is not issued until the budget allows, so the socket fills up.
        if t0 is None:
            t0 = loop.time()
        step = max(1, int(rate * _RATE_SLICE_S))
        for i in range(0, len(chunk), step):
            piece = chunk[i : i + step]
            wait = t0 + consumed / rate - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            consumed += len(piece)
            yield piece


async def stream_request(
    http: httpx.AsyncClient,
    url: str,
    body: Mapping[str, Any],
    record: StreamRecord,
    *,
    plan: ClientPlan | None = None,
    request_timeout: float = 600.0,
    headers: Mapping[str, str] | None = None,
    queued_grace_s: float = 0.05,
) -> StreamRecord:
    """Send ``body`` to ``url`` as a stream and fill ``record``; never raises except on cancellation.

    ``queued_grace_s``: a ``hangup_while_queued`` plan hangs up when the response headers arrive or
    after this long, whichever is first, and always before reading any body byte.
    """
    plan = plan or ClientPlan()
    fault = plan.faults[0] if plan.faults else ""
    state = _Stream(record)
    sent_at_network = False
    headers_at: int | None = None

    async def trace(event: str, info: Mapping[str, Any]) -> None:
        # Re-stamp t_sent where the request actually leaves: between the stamp below and the first
        # socket operation, httpx/httpcore pass several awaits (pool hand-out, connection and state
        # locks), and with many streams on the loop each of them waits behind other streams' reads;
        # that client-side wait (milliseconds at concurrency 16) is not the server's TTFT.
        # Likewise t_headers is the moment httpcore has parsed the status line and headers, not after
        # httpx's own response processing and the awaits on the way back up.
        nonlocal sent_at_network, headers_at
        if not sent_at_network and event in _SENT_EVENTS:
            sent_at_network = True
            record.t_sent = time.monotonic_ns()
        elif headers_at is None and event in _HEADERS_EVENTS:
            headers_at = time.monotonic_ns()

    request = http.build_request("POST", url, json=dict(body), headers=dict(headers or {}), extensions={"trace": trace})
    hang_after = plan.hangup_after_s
    if plan.hangup_while_queued:
        hang_after = queued_grace_s if hang_after is None else min(hang_after, queued_grace_s)
    response: httpx.Response | None = None
    record.t_sent = time.monotonic_ns()  # provisional: kept if the request never reaches a connection
    try:
        async with asyncio.timeout(hang_after) as hang_cm, asyncio.timeout(request_timeout) as req_cm:
            try:
                response = await http.send(request, stream=True)
                record.t_headers = headers_at or time.monotonic_ns()
                record.status = response.status_code
                if plan.hangup_while_queued:
                    raise _Hangup("while_queued")
                if not 200 <= response.status_code < 300:
                    raw = b""
                    async for part in response.aiter_raw():
                        raw += part
                        if len(raw) >= _BODY_LIMIT:
                            break
                    record.error = ErrorInfo("http", _http_message(response.status_code, raw), response.status_code)
                    record.t_end = time.monotonic_ns()
                    return record
                if "text/event-stream" not in response.headers.get("content-type", ""):
                    record.sse_errors += 1  # a 2xx that is not an event stream; parse what comes anyway
                async for chunk in _paced(response.aiter_raw(), plan):
                    t = time.monotonic_ns()
                    state.feed(t, chunk)
                    if plan.hangup_after_tokens is not None and len(record.t_content) >= plan.hangup_after_tokens:
                        raise _Hangup("after_tokens")
                t = time.monotonic_ns()
                state.finish(t)
                if record.t_end is None or not record.done_seen:
                    record.t_end = t
                return record
            except _Hangup as hang:
                record.hangup = Hangup(fault, hang.reason, time.monotonic_ns())
                record.t_end = record.hangup.t
                return record
            finally:
                if response is not None:
                    # an unfinished response closes its TCP connection (httpcore never pools it),
                    # so the server sees the disconnect
                    await _close(response)
    except TimeoutError:
        now = time.monotonic_ns()
        if hang_cm.expired() and not req_cm.expired():
            reason = "while_queued" if plan.hangup_while_queued and record.t_first_byte is None else "after_time"
            record.hangup = Hangup(fault, reason, now)
        else:
            record.error = ErrorInfo("timeout", f"no complete response within the request timeout of {request_timeout:g}s")
        record.t_end = now
        return record
    except asyncio.CancelledError:
        record.error = ErrorInfo("cancelled", "the stream was still open when the load generator stopped waiting")
        record.t_end = time.monotonic_ns()
        raise
    except (httpx.HTTPError, OSError) as exc:
        record.error = ErrorInfo(_error_kind(exc), f"{type(exc).__name__}: {exc}"[:500])
        record.t_end = time.monotonic_ns()
        return record
    finally:
        state.finish(record.t_end or time.monotonic_ns(), flush=False)


async def _close(response: httpx.Response) -> None:
    try:
        await response.aclose()
    except Exception:  # noqa: BLE001 - closing a broken connection may fail; it is closed either way
        pass
