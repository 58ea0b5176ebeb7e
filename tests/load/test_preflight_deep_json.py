"""Deep JSON in an event at the preflight (issue 41, LOW): 100,000 nested brackets made ``json.loads``
raise ``RecursionError`` inside the load client, which left ``stream_request`` as a traceback. The
client now counts such an event as a JSON error like any malformed one, and a preflight stream that
carried nothing readable stops the run before any load with a clear error (``PreflightRefused``, exit 4)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from chaos.execution.preflight import PreflightRefused, PreflightResult, preflight
from chaos.model.engines import PROFILES
from chaos.model.errors import SetupFailed
from chaos.model.experiment import LoadSpec
from tests.load.conftest import loopback_server

pytestmark = pytest.mark.timeout(20)

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
DEEP = b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n"
TOKEN = b'data: {"choices":[{"index":0,"text":"a","finish_reason":"stop"}]}\n\n'


def _reply(body: bytes) -> Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    async def reply(_head: bytes, _r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(HEAD + body)
        await w.drain()
    return reply


async def _run(body: bytes) -> PreflightResult:
    async with loopback_server(_reply(body)) as url:
        return await preflight(LoadSpec(max_tokens=(3, 3)), base_url=url.removesuffix("/completions"), model="m",
                               seed=1, api_key=None, profile=PROFILES["openai"], timeout=5.0)


async def test_deep_json_alone_stops_the_run_with_a_clear_error() -> None:
    with pytest.raises(PreflightRefused) as caught:
        await _run(DEEP + b"data: [DONE]\n\n")
    assert isinstance(caught.value, SetupFailed) and caught.value.exit_code == 4
    assert "1 of 2 SSE events carried data that is not a JSON object" in str(caught.value)


async def test_deep_json_beside_readable_events_is_counted_not_raised() -> None:
    found = await _run(DEEP + TOKEN + b"data: [DONE]\n\n")
    assert found.record.json_errors == 1 and found.record.text == "a" and found.record.done_seen
