"""A small real SSE server under the streamchaos middleware, as vLLM runs it (``--middleware``).

``python tests/middleware/sse_app.py PORT`` serves ``POST /v1/completions``: ``n`` events (``max_tokens``),
``gap_ms`` apart, then ``[DONE]``; ``GET /test/stats`` says how many streams finished, were cancelled
(the handler unwound: what aborts an engine's request) and how many bodies were read. The app is
wrapped exactly as vLLM wraps it: ``app.add_middleware(StreamChaosMiddleware)``.
"""

from __future__ import annotations

import asyncio
import json
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from chaos.stack.vllm_middleware import StreamChaosMiddleware

STATS = {"finished": 0, "cancelled": 0, "bodies": 0}


async def completions(request: Request) -> StreamingResponse:
    body = json.loads(await request.body())
    STATS["bodies"] += 1
    n, gap = int(body.get("max_tokens", 8)), float(body.get("gap_ms", 5)) / 1000

    async def events():  # noqa: ANN202
        try:
            for i in range(n):
                chunk = {"id": "cmpl-t", "object": "text_completion", "choices": [
                    {"index": 0, "text": f"t{i} ", "finish_reason": "length" if i == n - 1 else None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
                await asyncio.sleep(gap)
            yield "data: [DONE]\n\n"
            STATS["finished"] += 1
        except (asyncio.CancelledError, GeneratorExit):
            STATS["cancelled"] += 1
            raise
        except BaseException:
            STATS["cancelled"] += 1
            raise

    return StreamingResponse(events(), media_type="text/event-stream")


async def stats(request: Request) -> JSONResponse:
    return JSONResponse(STATS)


app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]), Route("/test/stats", stats)])
app.add_middleware(StreamChaosMiddleware)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
