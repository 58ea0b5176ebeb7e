"""Benchmark: HTTP/1.1 response framing cost per SSE event, h11 vs httptools (why http1.py uses httptools).

Frames the same chunked ``text/event-stream`` response (headers, then N token events of the size
the builtin stack sends, usage, ``[DONE]``, the terminator), delivered one network read per event
as a streaming client receives it, through each parser, and prints microseconds per event (the
best of several repeats, so a busy machine inflates it least). Framing only: SSE and JSON parsing
cost the same on both sides and are left out. Prints figures; asserts nothing.

    python benchmarks/bench_http_parser.py [--events 64] [--responses 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import h11
import httptools


def response_reads(events: int) -> list[bytes]:
    """One chunked SSE response, cut into the reads a client would see (one per event)."""
    reads = [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n"
             b"cache-control: no-cache\r\nx-request-id: 0-1\r\n"
             b"date: Mon, 01 Jan 2024 00:00:00 GMT\r\nserver: uvicorn\r\n\r\n"]
    for i in range(events):
        obj = {"id": "cmpl-0123456789abcdef", "object": "text_completion", "created": 1700000000, "model": "tiny",
               "choices": [{"index": 0, "text": f"tok{i} ", "logprobs": None, "finish_reason": None}]}
        data = f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()
        reads.append(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    done = b"data: [DONE]\n\n"
    reads.append(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
    return reads


def run_h11(reads: list[bytes], responses: int) -> int:
    body = 0
    for _ in range(responses):
        conn = h11.Connection(h11.CLIENT)
        conn.send(h11.Request(method="POST", target="/v1/completions",
                              headers=[("Host", "x"), ("Content-Length", "2")]))
        conn.send(h11.Data(data=b"{}"))
        conn.send(h11.EndOfMessage())
        for data in reads:
            conn.receive_data(data)
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA or isinstance(event, h11.EndOfMessage):
                    break
                if isinstance(event, h11.Data):
                    body += len(event.data)
    return body


class _Sink:
    __slots__ = ("body", "headers", "done")

    def __init__(self) -> None:
        self.body = 0
        self.headers: dict[str, str] = {}
        self.done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body += len(body)

    def on_message_complete(self) -> None:
        self.done = True


def run_httptools(reads: list[bytes], responses: int) -> int:
    body = 0
    for _ in range(responses):
        sink = _Sink()
        parser = httptools.HttpResponseParser(sink)
        for data in reads:
            parser.feed_data(data)
        parser.get_status_code()
        body += sink.body
    return body


def best_us_per_event(fn: Callable[[list[bytes], int], int], reads: list[bytes], responses: int, repeats: int) -> float:
    events = len(reads) - 1
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn(reads, responses)
        best = min(best, time.process_time() - t0)
    return best / (responses * events) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=64)
    parser.add_argument("--responses", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    reads = response_reads(args.events)
    assert run_h11(reads, 1) == run_httptools(reads, 1)  # both frame the same body
    h11_us = best_us_per_event(run_h11, reads, args.responses, args.repeats)
    ht_us = best_us_per_event(run_httptools, reads, args.responses, args.repeats)
    print(f"{args.events} events per response, one read per event, {args.responses} responses, "
          f"best of {args.repeats} (CPU time)")
    print(f"h11 {h11.__version__:>8}: {h11_us:6.2f} µs per event")
    print(f"httptools {httptools.__version__:>5}: {ht_us:6.2f} µs per event   "
          f"(h11 / httptools = {h11_us / ht_us:.1f}x)")


if __name__ == "__main__":
    main()
