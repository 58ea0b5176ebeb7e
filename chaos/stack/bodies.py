"""Request bodies with budgets: a capped read, and JSON that cannot cost more than its size
(``chaos.model.bounded_json``, re-exported here); the caller turns a refusal into a 400.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chaos.model.bounded_json import MAX_DEPTH, MAX_INT_DIGITS, JsonRefused, loads_bounded

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "BodyTooLarge", "JsonRefused", "loads_bounded", "read_capped"]


class BodyTooLarge(ValueError):
    """The body passed the size limit (by its Content-Length, or while it was being read)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than {limit} bytes")
        self.limit = limit


async def read_capped(request: Request, limit: int) -> bytes:
    """The request body, refused as soon as it passes ``limit`` bytes: a declared Content-Length over
    the limit is refused before a byte of the body is read, a chunked body while it streams in."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)
