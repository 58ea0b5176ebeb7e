"""Fixtures for the load generator tests: a loopback mock SSE server and small load specs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from chaos.load.mock import ThreadedMockServer
from chaos.load.workload import LoadSettings, PromptSettings


@pytest.fixture
def mock_server() -> Iterator[ThreadedMockServer]:
    with ThreadedMockServer(tick_s=0.005) as server:
        yield server


def _make_spec(**overrides: Any) -> LoadSettings:
    """A stand-in for chaos.experiment.LoadSpec with small, fast defaults."""
    prompts = overrides.pop("prompts", PromptSettings(min_chars=16, max_chars=64))
    base: dict[str, Any] = {"concurrency": 2, "max_tokens": (4, 4), "request_timeout": 10.0, "prompts": prompts}
    base.update(overrides)
    return LoadSettings(**base)


@pytest.fixture
def make_spec() -> Callable[..., LoadSettings]:
    return _make_spec


@asynccontextmanager
async def loopback_server(reply: Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
                          ) -> AsyncIterator[str]:
    """A one-behaviour HTTP server on loopback, its completions URL yielded: each connection's request
    (head and Content-Length body) is read, then ``reply`` gets the head, the reader and the writer."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(v) for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n"))
                           if k.lower() == b"content-length"), 0)
            await reader.readexactly(length)
            await reply(head, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions"
    finally:
        server.close()
