"""SIGTERM while streaming: every stream ends (in-band error or close), every block is freed, exit 0."""

from __future__ import annotations

import json
import signal
import socket
from typing import Any

import pytest

from chaos.stack.process import READY_PREFIX, StackProcess
from chaos.stack.serve import READY_PREFIX as SERVE_READY_PREFIX

pytestmark = pytest.mark.timeout(60)


def _read_to_eof(sock: socket.socket) -> bytes:
    sock.settimeout(15)  # hang guard
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _events(raw: bytes) -> list[Any]:
    body = raw.split(b"\r\n\r\n", 1)[1].decode("utf-8", errors="replace")
    return [json.loads(line[6:]) if line[6:] != "[DONE]" else "[DONE]"
            for line in body.splitlines() if line.startswith("data: ")]


def test_ready_prefix_is_shared() -> None:
    assert READY_PREFIX == SERVE_READY_PREFIX


def test_sigterm_ends_streams_and_exits_zero(sse: Any, admin_for: Any) -> None:
    proc = StackProcess.start("--max-num-seqs", "1", "--log-level", "info")
    try:
        body = {"model": "tiny", "prompt": "long", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        decoding = sse.open_raw(proc.url, "/v1/completions", body)
        first = b""
        while first.count(b"data: ") < 3:
            first += decoding.recv(65536)
        queued = sse.open_raw(proc.url, "/v1/completions", body)
        admin_for(proc).wait(lambda s: s["num_waiting"] == 1, timeout=10)
        proc.proc.send_signal(signal.SIGTERM)
        code = proc.proc.wait(20)
        assert code == 0, proc.stderr_text()
        for raw, name in ((first + _read_to_eof(decoding), "decoding"), (_read_to_eof(queued), "queued")):
            events = _events(raw)
            # each stream ends with an in-band error, then [DONE], then the server closes it
            assert events[-1] == "[DONE]" and "error" in events[-2], (name, events[-3:])
            assert events[-2]["error"]["code"] == 503 and "shutting down" in events[-2]["error"]["message"]
            assert not any(e != "[DONE]" and e.get("choices") and e["choices"][0]["finish_reason"] == "length"
                           for e in events), name
        log = proc.stderr_text()
        assert "0 block(s) still held" in log and "KV blocks still held" not in log
    finally:
        proc.close()
