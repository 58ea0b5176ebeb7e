"""TCP_NODELAY on the builtin stack's accepted connections, read back from the live sockets, and the
``nagle`` hook fault that turns Nagle back on (live and new connections) and off again."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(60)


def health(sock: socket.socket) -> bytes:
    """One ``GET /health`` on a raw connection, read to the end of its body; the response."""
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: stack\r\n\r\n")
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = sock.recv(4096)
        assert chunk, "the stack closed a keep-alive connection"
        reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(4096)
        assert chunk, "the stack closed the connection mid-body"
        body += chunk
    return head + b"\r\n\r\n" + body


@contextmanager
def kept_alive(stack: StackProcess) -> Iterator[socket.socket]:
    """A raw keep-alive connection that has carried one request and stays open."""
    parts = urlsplit(stack.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        assert health(sock).startswith(b"HTTP/1.1 200")
        yield sock


def connections(stack: StackProcess) -> dict[str, Any]:
    state: dict[str, Any] = httpx.get(stack.admin_url + "/state", timeout=10, trust_env=False,
                                      headers=stack.admin_headers).json()
    return dict(state["connections"])


def test_every_accepted_connection_has_tcp_nodelay(stack: StackProcess) -> None:
    # Fails on a stack that binds its listener with protocol 0 and sets nothing itself: asyncio then
    # leaves Nagle on, and every keep-alive response waits ~40 ms for the client's delayed ACK.
    with kept_alive(stack), kept_alive(stack):
        seen = connections(stack)  # the admin request's own connection is counted too
    assert seen["open"] >= 3, seen
    assert seen["nagle_on"] == 0 and seen["nodelay_on"] == seen["open"], seen
    assert seen["nagle_wanted"] is False


def test_nagle_fault_switches_live_and_new_connections_and_reverts(stack: StackProcess) -> None:
    fault = stack.admin_url + "/faults/nagle-test"
    with kept_alive(stack) as live:
        installed = httpx.put(fault, json={"type": "nagle"}, timeout=10, trust_env=False,
                              headers=stack.admin_headers).json()
        try:
            assert installed["connections"]["nagle_wanted"] is True
            assert installed["connections"]["nagle_on"] == installed["connections"]["open"] >= 2, installed
            with kept_alive(stack):  # a connection accepted while the fault is in force
                during = connections(stack)
            assert during["nagle_on"] == during["open"] >= 3 and during["nodelay_on"] == 0, during
            listed = httpx.get(stack.admin_url + "/faults", timeout=10, trust_env=False,
                               headers=stack.admin_headers).json()["faults"]["nagle-test"]
            assert listed["spec"]["type"] == "nagle" and listed["connections"]["nagle_on"] >= 2
        finally:
            removed = httpx.delete(fault, timeout=10, trust_env=False, headers=stack.admin_headers).json()
        assert removed["removed"] is True
        assert health(live).startswith(b"HTTP/1.1 200")  # the live one is still usable
        after = connections(stack)
    assert after["nagle_on"] == 0 and after["nodelay_on"] == after["open"] >= 2, after
    assert after["nagle_wanted"] is False


def test_nagle_spec_rejects_unknown_keys(stack: StackProcess) -> None:
    reply = httpx.put(stack.admin_url + "/faults/bad", json={"type": "nagle", "delay": 1}, timeout=10,
                      trust_env=False, headers=stack.admin_headers)
    assert reply.status_code == 400 and "unknown key" in reply.json()["error"]["message"]
