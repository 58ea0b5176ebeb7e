"""A loopback mock of an OpenAI-compatible streaming server, for self-calibration, tests and benchmarks.

Raw asyncio HTTP/1.1 (keep-alive, chunked transfer encoding) so that it costs the client machine as
little as possible and so that every misbehaviour a checker must catch can be produced on demand.
``GET /health``, ``GET /v1/models`` and ``GET /metrics`` (running streams and requests served, under
vLLM's names) answer plainly, so the mock can also stand in for a server pod (the Kubernetes tests
run it as their pods' process). A request may carry a ``"mock"`` object in its JSON body to shape
its own response:

    tokens: int         number of content events (default: the body's max_tokens, else 16)
    tick_s: float       pause between content events (default: the server's tick)
    text: str|list      the text of each content event (a list cycles)
    status: int         answer with this non-2xx status and an OpenAI error body instead
    headers_delay_s     wait before sending the response headers (a queued request)
    first_delay_s       wait after the headers before the first content event (prefill)
    drop_done: bool     end the body without ``data: [DONE]``
    error_after: int    after N content events send an in-band ``{"error": ...}`` then [DONE]
    close_after: int    after N content events cut the connection (no chunked terminator)
    invalid_utf8_at: int  put a raw 0xFF byte into that content event's text
    bad_json_at: int    send a data line that is not JSON in place of that content event
    split_writes: bool  write every byte as its own chunk (multibyte characters split anywhere)
    long_line: int      first send this many bytes of one ``data:`` line that never ends (64 KiB writes)
    crlf / no_space / comments / data_after_done: bool   framing variants

Two server options play an engine that takes a field and ignores it, as llama-cpp-python's server does
(both off by default): ``ignores_ignore_eos`` ends every stream at the model's own end, ``eos_at``
content events, with finish_reason ``stop`` (``length`` when max_tokens comes first), whatever
``ignore_eos`` says; ``ignores_include_usage`` never sends the usage chunk ``stream_options`` asks for.

The server records each request (``MockRequest``): tokens sent, whether and when the client
disconnected, so tests can see a client hang up from the server's side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MockRequest", "MockSSEServer", "ThreadedMockServer", "main"]


@dataclass
class MockRequest:
    """One request as the mock saw it."""

    id: str
    path: str
    body: dict[str, Any]
    t_start: int
    tokens_sent: int = 0
    disconnected: bool = False  # the client closed the connection before the response ended
    t_disconnect: int | None = None
    finished: bool = False  # the response was written to its end
    write_wait_ns: list[int] = field(default_factory=list)  # time each write waited on drain()
    id_header: str | None = None  # its X-Request-Id as sent (None: it sent none; ``id`` is then a count)


class MockSSEServer:
    """Serve ``POST /v1/completions`` and ``POST /v1/chat/completions`` as token streams."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, tick_s: float = 0.01,
                 default_tokens: int = 16, uuid_request_ids: bool = False, ignores_ignore_eos: bool = False,
                 eos_at: int = 7, ignores_include_usage: bool = False, closes_after_stream: bool = False) -> None:
        # uuid_request_ids: a POST whose X-Request-Id is not a UUID is answered 400, as llama-cpp-python's
        # server does (its request-id plugin validates the header); a request without one is served
        self.uuid_request_ids = uuid_request_ids
        self.ignores_ignore_eos = ignores_ignore_eos  # streams end on stop after eos_at events, as if not asked
        self.eos_at = eos_at
        self.ignores_include_usage = ignores_include_usage  # no usage chunk, whatever stream_options asks
        # closes_after_stream: the connection is closed after each streamed response, though the response said
        # keep-alive (no Connection: close), as llama.cpp's llama-server does (chaos.load.keepalive)
        self.closes_after_stream = closes_after_stream
        self.host = host
        self.port = port
        self.tick_s = tick_s
        self.default_tokens = default_tokens
        self.requests: list[MockRequest] = []
        self.refused_ids: list[str] = []  # X-Request-Ids answered 400 (uuid_request_ids)
        self.connections_opened = 0
        self.connections_closed = 0
        self.active = 0  # responses being written now
        self.max_active = 0
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._connection, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def nodelay(self) -> list[bool]:
        """TCP_NODELAY of every live accepted connection, as the kernel reports it (call on its loop)."""
        states = []
        for writer in list(self._writers):
            sock = writer.get_extra_info("socket")
            if sock is not None and sock.fileno() >= 0:
                states.append(bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)))
        return states

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections_opened += 1
        self._writers.add(writer)
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # small SSE writes must go out at once; asyncio sets this only for listeners made with IPPROTO_TCP
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                _method, path, _version = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                length = int(headers.get("content-length", "0"))
                raw = await reader.readexactly(length) if length else b""
                body = json.loads(raw) if raw else {}
                if _method == "GET":
                    await self._answer_get(path, writer)
                    if headers.get("connection", "").lower() == "close":
                        break
                    continue
                sent_id = headers.get("x-request-id")
                if self.uuid_request_ids and sent_id is not None and not _is_uuid(sent_id):
                    self.refused_ids.append(sent_id)
                    await self._refuse_id(sent_id, writer)
                    continue
                request = MockRequest(sent_id or str(len(self.requests)), path, body, time.monotonic_ns(),
                                      id_header=sent_id)
                self.requests.append(request)
                keep = await self._respond(request, reader, writer)
                if not keep or headers.get("connection", "").lower() == "close":
                    break
                if self.closes_after_stream and body.get("stream"):
                    # a moment after the last chunk, as a server closes once its handler returns: a client
                    # that reuses at once has written its next request into the connection by then
                    await asyncio.sleep(0.005)
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self.connections_closed += 1
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._tasks.discard(task)

    @staticmethod
    async def _refuse_id(sent_id: str, writer: asyncio.StreamWriter) -> None:
        payload = json.dumps({"error": {"message": f"invalid X-Request-Id {sent_id[:64]!r}: not a UUID",
                                        "type": "invalid_request_error", "code": 400}}).encode()
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        await writer.drain()

    async def _answer_get(self, path: str, writer: asyncio.StreamWriter) -> None:
        """``/health``, ``/v1/models``, ``/metrics``; 404 for anything else."""
        route = path.split("?", 1)[0]
        status, ctype = 200, "application/json"
        if route == "/health":
            payload = b'{"status":"ok"}'
        elif route == "/v1/models":
            payload = json.dumps({"object": "list", "data": [{"id": "mock", "object": "model"}]}).encode()
        elif route == "/metrics":
            ctype = "text/plain; version=0.0.4"
            payload = (
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{model_name="mock"}} {self.active}\n'
                "# TYPE vllm:num_requests_waiting gauge\n"
                'vllm:num_requests_waiting{model_name="mock"} 0\n'
                "# TYPE vllm:request_success counter\n"
                f'vllm:request_success_total{{model_name="mock"}} {sum(1 for r in self.requests if r.finished)}\n'
            ).encode()
        else:
            status, payload = 404, b'{"error":{"message":"not found","type":"NotFoundError","code":404}}'
        writer.write(f"HTTP/1.1 {status} OK\r\nContent-Type: {ctype}\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
                     + payload)
        await writer.drain()

    async def _respond(self, req: MockRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Write one response; return whether the connection may be reused."""
        mock: dict[str, Any] = dict(req.body.get("mock") or {})
        if mock.get("headers_delay_s"):
            await asyncio.sleep(float(mock["headers_delay_s"]))
        status = int(mock.get("status", 200))
        if status != 200:
            payload = json.dumps({"error": {"message": f"mock error {status}", "type": "BadRequestError",
                                            "code": status}}).encode()
            writer.write(
                f"HTTP/1.1 {status} Mock\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
            req.finished = True
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        # An HTTP/1.1 client sends nothing while it waits, so EOF on the reader means it hung up.
        eof = asyncio.ensure_future(reader.read(1))
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await writer.drain()
            return await self._stream(req, mock, writer, eof)
        except ConnectionError:
            self._mark_disconnected(req)
            return False
        finally:
            self.active -= 1
            eof.cancel()
            with contextlib.suppress(BaseException):
                await eof

    def _mark_disconnected(self, req: MockRequest) -> None:
        if not req.disconnected:
            req.disconnected = True
            req.t_disconnect = time.monotonic_ns()

    async def _stream(self, req: MockRequest, mock: dict[str, Any], writer: asyncio.StreamWriter,
                      eof: asyncio.Future[bytes]) -> bool:
        reply = _MockReply(req, mock, writer, eof, self.default_tokens, self.tick_s)
        if self.ignores_ignore_eos and "tokens" not in mock and self.eos_at < reply.tokens:
            reply.tokens, reply.finish = self.eos_at, "stop"  # the model's own end, ignore_eos or not
        reply.usage = not self.ignores_include_usage
        if not await reply.body():
            return False
        if eof.done():
            self._mark_disconnected(req)
            return False
        # stop watching for EOF before the terminator: the client's next request must not be eaten
        eof.cancel()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        req.finished = True
        return True


class _MockReply:
    """One streamed mock response, shaped by the request's ``mock`` options (tokens, pace, framing,
    planted defects: a cut, an in-band error, bad JSON, invalid UTF-8, a line without end, no [DONE])."""

    def __init__(self, req: MockRequest, mock: dict[str, Any], writer: asyncio.StreamWriter, eof: asyncio.Future[bytes],
                 default_tokens: int, tick_s: float) -> None:
        self.req, self.mock, self.writer, self.eof = req, mock, writer, eof
        self.chat = req.path.endswith("/chat/completions")
        self.tokens = int(mock.get("tokens", req.body.get("max_tokens", default_tokens)))
        self.tick = float(mock.get("tick_s", tick_s))
        texts = mock.get("text", "tok ")
        self.texts = [texts] if isinstance(texts, str) else list(texts)
        self.sep = "\r\n" if mock.get("crlf") else "\n"
        self.prefix = "data:" if mock.get("no_space") else "data: "
        self.split = bool(mock.get("split_writes"))
        self.finish = "length"  # the last content event's finish_reason
        self.usage = True  # send the usage chunk when stream_options asks for it

    async def send(self, payload: bytes) -> None:
        if self.eof.done():
            raise ConnectionResetError("client closed")
        t0 = time.monotonic_ns()
        if self.split:
            for i in range(len(payload)):
                self.writer.write(b"1\r\n" + payload[i : i + 1] + b"\r\n")
                await self.writer.drain()
                await asyncio.sleep(0)
        else:
            self.writer.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
            await self.writer.drain()
        self.req.write_wait_ns.append(time.monotonic_ns() - t0)

    def event(self, obj: Any) -> bytes:
        data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
        return f"{self.prefix}{data}{self.sep}{self.sep}".encode()

    def chunk(self, text: str | None, finish: str | None, usage: dict[str, int] | None = None) -> dict[str, Any]:
        if self.chat:
            choices = [] if usage else [{"index": 0, "delta": {"content": text} if text is not None else {},
                                         "finish_reason": finish}]
            body: dict[str, Any] = {"id": "mock", "object": "chat.completion.chunk", "created": 0, "model": "mock",
                                    "choices": choices}
        else:
            choices = [] if usage else [{"index": 0, "text": text or "", "finish_reason": finish}]
            body = {"id": "mock", "object": "text_completion", "created": 0, "model": "mock", "choices": choices}
        if usage:
            body["usage"] = usage
        body["mock_t"] = time.monotonic_ns()
        return body

    async def pause(self, seconds: float) -> None:
        if seconds > 0:
            done, _ = await asyncio.wait({self.eof}, timeout=seconds)
            if done:
                raise ConnectionResetError("client closed")

    async def body(self) -> bool:
        """Send every event; False when the body was cut on purpose (``close_after``)."""
        mock, req = self.mock, self.req
        if self.chat:  # the role chunk goes out at once, as servers that announce early do
            await self.send(self.event(self.chunk(None, None) | {
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}))
        await self.pause(float(mock.get("first_delay_s", 0.0)))
        if mock.get("long_line"):  # a server gone wrong: one line without end, megabytes long
            await self._long_line(int(mock["long_line"]))
        for i in range(self.tokens):
            if i:
                await self.pause(self.tick)
            outcome = await self._token(i)
            if outcome == "cut":
                return False
            if outcome == "error":
                break
        if self.usage and req.body.get("stream_options", {}).get("include_usage") and mock.get("error_after") is None:
            usage = {"prompt_tokens": 1, "completion_tokens": req.tokens_sent, "total_tokens": req.tokens_sent + 1}
            await self.send(self.event(self.chunk(None, None, usage=usage)))
        if not mock.get("drop_done"):
            await self.send(self.event("[DONE]"))
        if mock.get("data_after_done"):
            await self.send(self.event(self.chunk("late", None)))
        return True

    async def _long_line(self, left: int) -> None:
        await self.send(b"data: ")
        while left > 0:
            piece = min(left, 65536)
            await self.send(b"x" * piece)
            left -= piece

    async def _token(self, i: int) -> str:
        """Token ``i`` (or the defect planted at it): ``sent``, ``cut`` or ``error``."""
        mock, sep = self.mock, self.sep
        if mock.get("comments"):
            await self.send(f": ping{sep}".encode())
        if i == mock.get("close_after"):
            self.writer.transport.abort()  # cut mid-body: no chunked terminator
            return "cut"
        if i == mock.get("error_after"):
            await self.send(self.event({"error": {"message": "mock in-band error", "type": "InternalServerError",
                                                  "code": 500}}))
            return "error"
        finish = self.finish if i == self.tokens - 1 else None
        if i == mock.get("bad_json_at"):
            await self.send(f"{self.prefix}{{not json{sep}{sep}".encode())
        elif i == mock.get("invalid_utf8_at"):
            await self.send(self.event(self.chunk("@@", finish)).replace(b"@@", b"\xff"))
        else:
            await self.send(self.event(self.chunk(self.texts[i % len(self.texts)], finish)))
        self.req.tokens_sent += 1
        return "sent"


class ThreadedMockServer:
    """Run a ``MockSSEServer`` on its own event loop in a daemon thread (for sync and async tests)."""

    def __init__(self, **kwargs: Any) -> None:
        self.server = MockSSEServer(**kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mock-sse", daemon=True)

    def __enter__(self) -> ThreadedMockServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def requests(self) -> list[MockRequest]:
        return self.server.requests

    def nodelay(self) -> list[bool]:
        """``MockSSEServer.nodelay`` read on the server's own loop."""
        async def read() -> list[bool]:
            return self.server.nodelay()

        return asyncio.run_coroutine_threadsafe(read(), self._loop).result(10)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Poll ``predicate`` (it reads state the server thread writes) until true or timeout."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return True
            time.sleep(0.01)
        return predicate()


    async def until(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """``wait_for`` for async tests: polls without blocking the caller's event loop."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return True
            await asyncio.sleep(0.01)
        return predicate()


def main(argv: list[str] | None = None) -> None:
    """``python -m chaos.load.mock [--host H] [--port P] [--tick S]``: serve until killed; prints ``PORT n``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tick", type=float, default=0.02, help="seconds between content events")
    args = parser.parse_args(argv)

    async def serve() -> None:
        server = MockSSEServer(host=args.host, port=args.port, tick_s=args.tick)
        port = await server.start()
        print(f"PORT {port}", flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
