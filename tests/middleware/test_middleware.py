"""The streamchaos middleware in front of a real SSE server process (as vLLM loads it): the admin
protocol, and each ASGI fault point observable on the wire and in the handler."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chaos.admin.client import proof_of
from tests.load.phased import errors, fault_then_clean

ROOT = Path(__file__).resolve().parents[2]
APP = Path(__file__).with_name("sse_app.py")


def _eventually(check, what: str, within_s: float = 5.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, port: int, token: str) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.token = token
        self.auth = {"Authorization": f"Bearer {token}"}

    def arm(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        response = httpx.put(f"{self.url}/admin/faults/{name}", json=spec, headers=self.auth, timeout=5)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def disarm(self) -> None:
        httpx.delete(f"{self.url}/admin/faults", headers=self.auth, timeout=5).raise_for_status()

    def stats(self) -> dict[str, int]:
        return dict(httpx.get(f"{self.url}/test/stats", timeout=5).json())

    def stream(self, n: int = 8, gap_ms: float = 5) -> tuple[int, list[str], bool]:
        """(status, data payloads, whether the body ended cleanly)."""
        payloads: list[str] = []
        with httpx.stream("POST", f"{self.url}/v1/completions", json={"max_tokens": n, "gap_ms": gap_ms},
                          timeout=10) as r:
            try:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        payloads.append(line[len("data: "):])
            except httpx.RemoteProtocolError:
                return r.status_code, payloads, False
            return r.status_code, payloads, True


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    port, token = _free_port(), secrets.token_urlsafe(24)
    env = {**os.environ, "STREAMCHAOS_ADMIN_TOKEN": token, "PYTHONPATH": str(ROOT)}
    log = tmp_path / "server.log"
    # a file, not a pipe nobody reads: a server that logs a traceback a request would block on a full pipe
    with log.open("wb") as stderr:
        proc = subprocess.Popen([sys.executable, str(APP), str(port)], env=env, stdout=subprocess.DEVNULL,
                                stderr=stderr)
    srv = Server(port, token)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(srv.url + "/test/stats", timeout=1)
                break
            except httpx.HTTPError:
                assert proc.poll() is None, log.read_text(errors="replace")
                assert time.monotonic() < deadline, "the test server did not answer within 20s"
                time.sleep(0.1)
        yield srv
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def test_admin_needs_the_token_and_proves_it_without_revealing_it(server: Server) -> None:
    assert httpx.get(server.url + "/admin/state", timeout=5).status_code == 403
    wrong = {"Authorization": "Bearer " + "x" * 32}
    assert httpx.put(server.url + "/admin/faults/a", json={"type": "abort", "every_n": 1}, headers=wrong,
                     timeout=5).status_code == 403
    nonce = secrets.token_urlsafe(16)
    proof = httpx.get(server.url + "/admin/proof", params={"nonce": nonce}, timeout=5).json()
    assert proof == {"server": "streamchaos", "proof": proof_of(server.token, nonce)}
    state = httpx.get(server.url + "/admin/state", headers=server.auth, timeout=5).json()
    assert state["server"] == "streamchaos-middleware" and state["faults"] == []


def test_bad_specs_get_a_400_that_says_what_is_right(server: Server) -> None:
    cases = {
        "engine point": {"type": "timeout", "where": "engine_step", "every_n": 1},
        "engine stall": {"type": "stall", "where": "engine", "duration": 0.1, "every": 1},
        "after_events off mid_stream": {"type": "timeout", "where": "first_byte", "every_n": 1, "after_events": 2},
        "not json": "{",
    }
    for what, spec in cases.items():
        body = spec if isinstance(spec, str) else json.dumps(spec)
        r = httpx.put(server.url + "/admin/faults/bad", content=body, headers=server.auth, timeout=5)
        assert r.status_code == 400, (what, r.text)
        assert r.json()["error"]["message"], what
    kv = httpx.post(server.url + "/admin/kv/reserve", json={"blocks": 1}, headers=server.auth, timeout=5)
    assert kv.status_code == 404 and "hog streams" in kv.json()["error"]["message"]


def test_a_disarmed_server_streams_every_request_whole(server: Server) -> None:
    server.arm("never", {"type": "timeout", "where": "first_byte", "fraction": 0.0})
    for _ in range(5):
        status, payloads, clean = server.stream(n=6)
        assert (status, clean, payloads[-1], len(payloads)) == (200, True, "[DONE]", 7)
    assert server.stats()["finished"] == 5


def test_first_byte_timeout_is_a_500_before_any_byte(server: Server) -> None:
    server.arm("fb", {"type": "timeout", "where": "first_byte", "every_n": 2})
    results = [server.stream(n=4) for _ in range(6)]
    assert [status for status, _, _ in results] == [200, 500] * 3  # every second request, before its headers
    assert all(not payloads for status, payloads, _ in results if status == 500)
    fired = httpx.get(server.url + "/admin/faults", headers=server.auth, timeout=5).json()["faults"]["fb"]
    assert fired["requests_seen"] == 6 and fired["fired"] == 3


def test_mid_stream_timeout_cuts_the_stream_after_n_events_and_unwinds_the_handler(server: Server) -> None:
    server.arm("mid", {"type": "timeout", "where": "mid_stream", "every_n": 1, "after_events": 3})
    status, payloads, clean = server.stream(n=10, gap_ms=5)
    assert status == 200 and len(payloads) == 3 and "[DONE]" not in payloads and not clean
    _eventually(lambda: server.stats()["cancelled"] == 1, f"the handler was not unwound: {server.stats()}")
    assert server.stats()["finished"] == 0
    server.disarm()
    status, payloads, clean = server.stream(n=4)
    assert clean and payloads[-1] == "[DONE]"  # disarmed: whole again


def test_abort_ends_the_stream_with_an_error_event_and_done(server: Server) -> None:
    server.arm("ab", {"type": "abort", "every_n": 1, "after_events": 2})
    status, payloads, clean = server.stream(n=10, gap_ms=5)
    assert status == 200 and clean
    assert len(payloads) == 4 and payloads[-1] == "[DONE]"
    error = json.loads(payloads[2])["error"]
    assert error["type"] == "server_error" and "abort" in error["message"]
    # the handler was unwound: an engine would abort the request
    _eventually(lambda: server.stats()["cancelled"] == 1, f"the handler was not unwound: {server.stats()}")


def test_request_body_timeout_stops_the_handler_before_it_reads_the_body(server: Server) -> None:
    server.arm("body", {"type": "timeout", "where": "request_body", "every_n": 1})
    status, payloads, _ = server.stream(n=4)
    assert status == 500 and not payloads
    assert server.stats()["bodies"] == 0


def test_event_loop_stall_delays_every_stream(server: Server) -> None:
    def longest_gap() -> float:
        stamps: list[float] = []
        with httpx.stream("POST", server.url + "/v1/completions", json={"max_tokens": 40, "gap_ms": 10},
                          timeout=10) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    stamps.append(time.monotonic())
        return max(b - a for a, b in zip(stamps, stamps[1:], strict=False))

    quiet = longest_gap()
    server.arm("stall", {"type": "stall", "where": "event_loop", "duration": 0.25, "every": 0.3})
    stalled = longest_gap()
    assert stalled >= 0.2 > quiet, (quiet, stalled)  # the loop held for 250 ms shows as one long gap


def test_a_lease_that_is_not_renewed_disarms_the_fault(server: Server) -> None:
    server.arm("short", {"type": "timeout", "where": "first_byte", "every_n": 1, "ttl": 0.3})
    assert server.stream(n=2)[0] == 500
    deadline = time.monotonic() + 5
    while httpx.get(server.url + "/admin/faults", headers=server.auth, timeout=5).json()["faults"]:
        assert time.monotonic() < deadline, "the lease did not expire"
        time.sleep(0.1)
    assert server.stream(n=2)[0] == 200
    expired = httpx.get(server.url + "/admin/state", headers=server.auth, timeout=5).json()["expired_leases"]
    assert [e["name"] for e in expired] == ["fault:short"]


def _raw_post(url: str, body: bytes = b'{"max_tokens": 4}') -> bytes:
    """One POST over a bare socket, without ``Connection: close``: everything until the server closes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        raw = b""
        while chunk := sock.recv(65536):  # a server that kept the connection open fails here (timeout)
            raw += chunk
    return raw


@pytest.mark.parametrize("where", ["first_byte", "request_body"])
def test_a_fault_500_closes_its_connection(server: Server, where: str) -> None:
    """A framework's own 500 goes out keep-alive and the connection closes a moment later: a client
    that reused it lost its next request too. The fault's answer says ``Connection: close`` and the
    server closes after it; the body names the fault."""
    server.arm("close", {"type": "timeout", "where": where, "every_n": 1})
    head, _, body = _raw_post(server.url).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 500 ") and b"\r\nconnection: close" in head.lower(), head
    assert f"injected at {where} by fault 'close'" in json.loads(body)["error"]["message"]


def test_a_first_byte_fault_costs_one_error_a_request_and_none_to_the_next_phase(server: Server) -> None:
    """The load client through a phase with every request hit at first_byte, then a clean phase: each
    fault phase error is the fault's own 500 (none a request lost on a connection the 500 left
    closing), and the clean phase has none."""
    server.arm("fb", {"type": "timeout", "where": "first_byte", "fraction": 1.0})
    phases = asyncio.run(fault_then_clean(server.url + "/v1", server.disarm))
    fault, clean = phases["fault"], phases["clean"]
    assert set(errors(fault)) == {("http", 500, None)}, errors(fault)
    assert errors(clean) == []
    assert len(fault) >= 8 and len(clean) >= 4, (len(fault), len(clean))
