"""A fault's 500 on the builtin stack closes its connection, and costs the load one error, not two."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import httpx
import pytest

from chaos.stack.process import StackProcess
from tests.load.phased import errors, fault_then_clean

pytestmark = pytest.mark.timeout(60)


def _raw_post(stack: StackProcess, body: dict[str, Any]) -> bytes:
    """One POST over a bare socket, without ``Connection: close``: everything until the server closes."""
    payload = json.dumps(body).encode()
    host, port = stack.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        raw = b""
        while chunk := sock.recv(65536):  # a server that kept the connection open fails here (timeout)
            raw += chunk
    return raw


@pytest.mark.parametrize("where", ["first_byte", "request_body"])
def test_a_fault_500_closes_its_connection_and_spares_the_next_phase(stack: StackProcess, admin: Any,
                                                                      where: str) -> None:
    """The 500 says ``Connection: close`` and the server closes after it; the load client through a
    phase with every request hit, then a clean phase: every fault-phase error is the fault's own 500
    (none a request written into a connection the 500 left closing), and the clean phase has none."""
    spec = {"type": "timeout", "where": where, "fraction": 1.0}
    assert admin.call("PUT", "/faults/conn", json=spec).status_code == 200
    head, _, body = _raw_post(stack, {"model": "tiny", "prompt": "go", "max_tokens": 4, "stream": True}
                              ).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 500 ") and b"\r\nconnection: close" in head.lower(), head
    assert f"injected at {where} by fault 'conn'" in json.loads(body)["error"]["message"]

    def disarm() -> None:
        httpx.delete(stack.admin_url + "/faults", headers=stack.admin_headers, timeout=5).raise_for_status()

    phases = asyncio.run(fault_then_clean(stack.base_url, disarm, fault_s=0.3, clean_s=0.3))
    fault, clean = phases["fault"], phases["clean"]
    assert set(errors(fault)) == {("http", 500, None)}, errors(fault)
    assert errors(clean) == []
    assert len(fault) >= 8 and len(clean) >= 4, (len(fault), len(clean))
