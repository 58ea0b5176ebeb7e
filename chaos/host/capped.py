"""Reading a target's answers within budgets: a byte cap, a total deadline, JSON that cannot blow up.

A target may misbehave (that is what a chaos run is for): a 150 MB ``/metrics``, a ``/v1/models``
nested 200,000 deep, a ``/health`` that drips a byte every second so no read timeout ever fires.
``get_capped`` streams the answer and stops at ``limit`` bytes (after decompression) and at
``deadline`` seconds in all; ``Capped.json`` parses with the project's one bounded loader
(``chaos.model.bounded_json.loads_bounded``). ``clip`` bounds what a target's words add to a report.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from chaos.model.bounded_json import JsonRefused, loads_bounded

__all__ = ["JSON_LIMIT", "METRICS_LIMIT", "REPORT_TEXT", "Capped", "clip", "clip_json", "get_capped"]

JSON_LIMIT = 1 << 20  # /health, /version, /info, /v1/models: a real server's are a few KiB
METRICS_LIMIT = 16 << 20  # a vLLM exposition is ~100 KiB; a large production one a few MiB
REPORT_TEXT = 200  # characters of one value a target adds to the journal or the report


@dataclass(frozen=True)
class Capped:
    """An answer read to at most ``limit`` bytes; ``over``: it had more (``body`` holds the start)."""

    url: str
    status_code: int
    headers: httpx.Headers
    body: bytes
    limit: int
    over: bool = False

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON within budgets; raise ``JsonRefused`` (a ``ValueError``) saying why not."""
        if self.over:
            raise JsonRefused(f"the answer of {self.url} is larger than {self.limit} bytes")
        return loads_bounded(self.body)

    def too_large(self) -> str:
        return f"the answer of {self.url} is larger than {self.limit} bytes: not read further"


async def get_capped(client: httpx.AsyncClient, url: str, *, limit: int, deadline: float,
                     headers: Mapping[str, str] | None = None) -> Capped:
    """GET ``url``, keeping at most ``limit`` bytes of the body and taking at most ``deadline`` seconds
    in all; raises ``httpx.HTTPError`` as ``client.get`` does (``httpx.ReadTimeout`` past the deadline)."""
    try:
        async with asyncio.timeout(deadline):
            return await _read(client, url, limit, headers)
    except TimeoutError:
        raise httpx.ReadTimeout(f"{url} did not answer in full within {deadline:g}s") from None


async def _read(client: httpx.AsyncClient, url: str, limit: int, headers: Mapping[str, str] | None) -> Capped:
    async with client.stream("GET", url, headers=dict(headers or {})) as response:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return Capped(url, response.status_code, response.headers, b"", limit, over=True)
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            room = limit - size
            if len(chunk) > room:
                chunks.append(chunk[:room])
                return Capped(url, response.status_code, response.headers, b"".join(chunks), limit, over=True)
            chunks.append(chunk)
            size += len(chunk)
        return Capped(url, response.status_code, response.headers, b"".join(chunks), limit)


def clip(value: object, limit: int = REPORT_TEXT) -> str | None:
    """``value`` as text of at most ``limit`` characters (longer: cut, with the original length)."""
    if value is None:
        return None
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def clip_json(value: Any, limit: int = 4 * REPORT_TEXT) -> Any:
    """``value`` itself when its JSON is at most ``limit`` characters, else its JSON clipped to text."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return clip(repr(value), limit)
    return value if len(text) <= limit else clip(text, limit)
