"""Issue 40: what the load client records of a response's framing and content, against a raw
loopback server that writes exactly the bytes a test gives it: the Content-Type (a 2xx that is not an
event stream fails as a protocol error naming it), X-Accel-Buffering, and content events repeated whole."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from chaos.load.client import make_http_client, stream_request
from chaos.model.observations import StreamRecord

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]


def _chunk(text: str, finish: str | None = None) -> dict[str, Any]:
    return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "text": text, "finish_reason": finish}]}


def sse(*events: dict[str, Any] | str, ids: list[str] | None = None) -> bytes:
    out = []
    for i, event in enumerate(events):
        data = event if isinstance(event, str) else json.dumps(event, separators=(",", ":"))
        head = f"id: {ids[i]}\n" if ids else ""
        out.append(f"{head}data: {data}\n\n")
    return "".join(out).encode()


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[bytes, dict[str, str]], Awaitable[str]]]:
    """``await serve(body, headers)`` → a URL whose every POST is answered 200 with those headers and body."""
    servers: list[asyncio.Server] = []

    async def serve(body: bytes, headers: dict[str, str]) -> str:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            writer.write(f"HTTP/1.1 200 OK\r\n{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                         + body)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions"

    yield serve
    for server in servers:
        server.close()
        await server.wait_closed()


async def fetch(url: str) -> StreamRecord:
    async with make_http_client(2) as http:
        body = {"model": "m", "stream": True, "max_tokens": 3}
        return await stream_request(http, url, body, StreamRecord(id="c-0", phase="p"), request_timeout=10.0)


STREAM = sse(_chunk("a"), _chunk("b"), _chunk("c", "length"), "[DONE]")


async def test_an_event_stream_records_its_content_type_and_x_accel_buffering(raw_server: Any) -> None:
    url = await raw_server(STREAM, {"Content-Type": "text/event-stream; charset=utf-8", "X-Accel-Buffering": "no"})
    rec = await fetch(url)
    assert rec.complete and rec.text == "abc", rec
    assert rec.content_type == "text/event-stream; charset=utf-8" and rec.x_accel_buffering == "no"
    assert rec.repeated_events == 0 and rec.sse_errors == 0


@pytest.mark.parametrize("ctype", ["application/json", "text/html; charset=utf-8", "text/event-streams"])
async def test_a_2xx_that_is_not_an_event_stream_fails_as_a_protocol_error_naming_it(
        raw_server: Any, ctype: str) -> None:
    url = await raw_server(STREAM, {"Content-Type": ctype})
    rec = await fetch(url)
    assert rec.text == "abc" and rec.done_seen  # parsed all the same: what came is still measured
    assert rec.content_type == ctype
    assert rec.error is not None and rec.error.kind == "protocol" and not rec.complete
    assert f"Content-Type {ctype!r}" in rec.error.message and "text/event-stream" in rec.error.message


@pytest.mark.parametrize("ctype", [None, "Text/Event-Stream", "text/event-stream ; charset=UTF-8"])
async def test_an_event_stream_without_a_content_type_or_in_another_case_is_complete(
        raw_server: Any, ctype: str | None) -> None:
    """A homemade server or a proxy that drops the header but streams valid SSE: parsed as SSE, no
    protocol error (it failed every stream as "not an event stream"); the case of the type is free."""
    rec = await fetch(await raw_server(STREAM, {"Content-Type": ctype} if ctype else {}))
    assert rec.error is None and rec.complete and rec.text == "abc", rec
    assert rec.content_type == (ctype or "")


async def test_a_content_event_repeated_whole_is_counted(raw_server: Any) -> None:
    body = sse(_chunk("a"), _chunk("a"), _chunk("b"), _chunk("b"), _chunk("c", "length"), "[DONE]")
    rec = await fetch(await raw_server(body, {"Content-Type": "text/event-stream"}))
    assert rec.complete and rec.text == "aabbc" and rec.repeated_events == 2


async def test_the_same_text_under_another_sse_id_is_not_a_repeat(raw_server: Any) -> None:
    body = sse(_chunk("a"), _chunk("a"), _chunk("b", "length"), "[DONE]", ids=["1", "2", "3", "4"])
    rec = await fetch(await raw_server(body, {"Content-Type": "text/event-stream"}))
    assert rec.text == "aab" and rec.repeated_events == 0


async def test_the_preflight_refuses_a_target_whose_answer_is_not_an_event_stream(raw_server: Any) -> None:
    """Issue 40: a server answering 200 text/html everywhere passed the preflight ("1 events, [DONE] not
    seen"), then took 681 requests and exited 1; the preflight now stops it (exit 4) naming the type."""
    from chaos.execution.preflight import PreflightRefused, preflight
    from chaos.model.engines import PROFILES
    from chaos.model.errors import SetupFailed
    from chaos.model.experiment import LoadSpec

    page = b"<html><body>It works!</body></html>\n"
    url = await raw_server(page, {"Content-Type": "text/html; charset=utf-8"})
    with pytest.raises(PreflightRefused) as caught:
        await preflight(LoadSpec(max_tokens=(3, 3)), base_url=url.removesuffix("/completions"), model="m", seed=1,
                        api_key=None, profile=PROFILES["openai"], timeout=5.0)
    first = str(caught.value).splitlines()[0]  # the line the dry run prints
    assert "not an event stream" in first and "Content-Type 'text/html; charset=utf-8'" in first, first
    assert isinstance(caught.value, SetupFailed)  # exit 4


async def _preflight(url: str) -> Any:
    from chaos.execution.preflight import preflight
    from chaos.model.engines import PROFILES
    from chaos.model.experiment import LoadSpec

    return await preflight(LoadSpec(max_tokens=(3, 3)), base_url=url.removesuffix("/completions"), model="m",
                           seed=1, api_key=None, profile=PROFILES["openai"], timeout=5.0)


@pytest.mark.parametrize("ctype", ["text/event-stream; charset=utf-8", "Text/Event-Stream"])
async def test_the_preflight_takes_an_event_stream_in_any_case_with_parameters(raw_server: Any, ctype: str) -> None:
    found = await _preflight(await raw_server(STREAM, {"Content-Type": ctype}))
    assert found.record.complete and found.warning is None
    assert found.facts()["content_type"] == ctype


async def test_the_preflight_takes_valid_sse_without_a_content_type_and_warns(raw_server: Any) -> None:
    """A missing Content-Type was refused outright (exit 4) although the body was a complete event
    stream; now it is taken, the note keeps the empty type and the warning the console prints."""
    found = await _preflight(await raw_server(STREAM, {}))
    assert found.record.complete and found.record.error is None
    facts = found.facts()
    assert facts["content_type"] == "" and "no Content-Type" in facts["warning"], facts


async def test_the_dry_run_prints_the_warning_for_an_answer_without_a_content_type(raw_server: Any) -> None:
    from chaos.execution.dryrun import DryRun
    from chaos.model.experiment import Experiment, LoadSpec

    url = await raw_server(STREAM, {})
    out = DryRun()
    await out.preflight(Experiment(name="x", load=LoadSpec(max_tokens=(3, 3))), url.removesuffix("/completions"), "m")
    warned = [line for line in out.lines if "no Content-Type" in line]
    assert out.exit_code == 0 and len(warned) == 1 and warned[0].strip().startswith("warning:"), out.lines


@pytest.mark.parametrize(("body", "headers", "named"), [
    (STREAM, {"Content-Type": "application/json"}, "Content-Type 'application/json'"),
    (b"<html><body>It works!</body></html>\n", {}, "no Content-Type and no SSE event"),
])
async def test_the_preflight_still_refuses_another_type_and_an_untyped_body_with_no_event(
        raw_server: Any, body: bytes, headers: dict[str, str], named: str) -> None:
    from chaos.execution.preflight import PreflightRefused

    with pytest.raises(PreflightRefused) as caught:
        await _preflight(await raw_server(body, headers))
    assert named in str(caught.value).splitlines()[0], caught.value
