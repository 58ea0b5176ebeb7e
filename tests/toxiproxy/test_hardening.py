"""The embedded Toxiproxy as a real process under a hostile local client (issue 23, point 3).

Each test starts ``python -m chaos.toxiproxy.server`` (or the runner's own way of starting it) on an
ephemeral loopback port and attacks it with real sockets: a slowloris request past the deadline, one
connection past the cap, body reservations past the shared budget, huge names, and listens on every
interface or a privileged port when the runner spawned it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chaos.execution.proxy import EMBEDDED_READY, ToxiproxyServer, resolve_server
from chaos.host.children import first_line, spawn

ROOT = Path(__file__).resolve().parents[2]


def start(*flags: str) -> tuple[subprocess.Popen[bytes], str]:
    proc = spawn([sys.executable, "-m", "chaos.toxiproxy.server", "--port", "0", *flags], cwd=ROOT,
                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    line = first_line(proc, 15.0)
    if not line.startswith(EMBEDDED_READY):
        proc.kill()
        proc.wait(5)
        pytest.fail(f"embedded toxiproxy did not start: {line!r}")
    return proc, line[len(EMBEDDED_READY):].strip()


@pytest.fixture
def strict() -> Iterator[str]:
    """A server with a 1 s request deadline and room for 8 API connections."""
    proc, url = start("--request-timeout", "1", "--max-connections", "8")
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def address(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("http://").rpartition(":")
    return host, int(port)


def connect(url: str) -> socket.socket:
    s = socket.create_connection(address(url), timeout=5)
    s.settimeout(5)
    return s


def closed_within(s: socket.socket, seconds: float, drip: bytes = b"") -> bool:
    """Whether the server closes ``s`` within ``seconds`` while ``drip`` is sent every 0.2 s."""
    deadline = time.monotonic() + seconds
    s.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            if drip:
                s.sendall(drip)
            if s.recv(4096) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset or broken pipe: closed too
            return True
    return False


def get_version(s: socket.socket) -> bytes:
    s.sendall(b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = b""
    while b"2.12.0" not in reply:
        chunk = s.recv(4096)
        if not chunk:
            break
        reply += chunk
    return reply


def test_slowloris_request_is_closed_past_the_deadline(strict: str) -> None:
    s = connect(strict)
    try:
        s.sendall(b"GET /version HTTP/1.1\r\n")
        # a header line every 0.2 s: each line is quick, the request never ends
        assert closed_within(s, 8.0, drip=b"X-Drip: 1\r\n")
    finally:
        s.close()
    assert httpx.get(strict + "/version", timeout=5).status_code == 200


def test_connection_past_the_cap_gets_503_and_a_freed_place_is_reused(strict: str) -> None:
    held = [connect(strict) for _ in range(8)]
    try:
        for s in held:  # each is being served (keep-alive), so each holds a place
            assert b"200 OK" in get_version(s)
        extra = connect(strict)
        try:
            reply = extra.recv(4096)
            assert reply.startswith(b"HTTP/1.1 503 ")
            assert closed_within(extra, 5.0)
        finally:
            extra.close()
        held.pop().close()
        deadline = time.monotonic() + 10
        while True:  # the server notices the close on its own schedule
            try:
                if httpx.get(strict + "/version", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "a freed place was never given to a new connection"
            time.sleep(0.1)
    finally:
        for s in held:
            s.close()


def test_bodies_share_one_budget(strict: str) -> None:
    """Four announced 8 MiB bodies fill the 32 MiB budget: a fifth gets a 503 before it is read."""
    waiting = [connect(strict) for _ in range(4)]
    try:
        head = b"POST /populate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (8 << 20)
        for s in waiting:
            s.sendall(head)
        time.sleep(0.3)  # the four have been read up to their bodies
        fifth = connect(strict)
        try:
            fifth.sendall(head)
            assert fifth.recv(4096).startswith(b"HTTP/1.1 503 ")
        finally:
            fifth.close()
    finally:
        for s in waiting:
            s.close()
    over = httpx.post(strict + "/populate", content=b"[" + b" " * (9 << 20) + b"]", timeout=10)
    assert over.status_code == 400


def test_huge_names_and_addresses_are_refused(strict: str) -> None:
    with httpx.Client(base_url=strict, timeout=10) as c:
        big = "n" * 1_000_000
        r = c.post("/proxies", json={"name": big, "upstream": "127.0.0.1:9"})
        assert r.status_code == 400 and "name too long" in r.json()["error"]
        r = c.post("/proxies", json={"name": "p", "upstream": "127.0.0.1:" + "9" * 5000})
        assert r.status_code == 400 and "upstream too long" in r.json()["error"]
        r = c.post("/populate", json=[{"name": big, "upstream": "127.0.0.1:9"}])
        assert r.status_code == 400 and "name too long" in r.json()["error"]
        assert c.post("/proxies", json={"name": "p", "upstream": "127.0.0.1:9", "enabled": False}).status_code == 201
        r = c.post("/proxies/p/toxics", json={"name": big, "type": "latency"})
        assert r.status_code == 400 and "name too long" in r.json()["error"]
        assert c.get("/proxies").json()["p"]["toxics"] == []


@pytest.fixture
def runner_spawned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ToxiproxyServer]:
    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    server = resolve_server("embedded", None, 7, tmp_path / "log", listen="127.0.0.1:0")
    try:
        yield server
    finally:
        server.stop()


def as_the_runner(server: ToxiproxyServer) -> httpx.Client:
    """A client holding the run's token, as the runner's own (``tests/toxiproxy/test_run_token.py``:
    without it, nothing passes)."""
    return httpx.Client(base_url=server.url, timeout=10, headers={"Authorization": f"Bearer {server.token}"})


@pytest.mark.parametrize("listen", ["0.0.0.0:0", ":0", "[::]:0", "127.0.0.1:1", "localhost:80"])
def test_runner_spawned_server_refuses_wide_and_privileged_listens(runner_spawned: ToxiproxyServer,
                                                                   listen: str) -> None:
    with as_the_runner(runner_spawned) as c:
        r = c.post("/proxies", json={"name": "wide", "listen": listen, "upstream": "127.0.0.1:9"})
        assert r.status_code == 403, r.text
        assert r.json() == {"error": r.json()["error"], "status": 403} and "allowed" in r.json()["error"]
        r = c.post("/populate", json=[{"name": "wide", "listen": listen, "upstream": "127.0.0.1:9"}])
        assert r.status_code == 403 and r.json()["proxies"] is None
        assert c.post("/proxies", json={"name": "off", "listen": listen, "upstream": "127.0.0.1:9",
                                        "enabled": False}).status_code == 201
        assert c.post("/proxies/off", json={"enabled": True}).status_code == 403
        assert c.post("/proxies", json={"name": "lo", "listen": "127.0.0.1:0",
                                        "upstream": "127.0.0.1:9"}).status_code == 201
        assert set(c.get("/proxies").json()) == {"lo", "off"}


def test_runner_spawned_server_allows_the_listen_the_experiment_asks_for(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    server = resolve_server("embedded", None, 7, tmp_path / "log", listen="0.0.0.0:0")
    try:
        with as_the_runner(server) as c:
            r = c.post("/proxies", json={"name": "asked", "listen": "0.0.0.0:0", "upstream": "127.0.0.1:9"})
            assert r.status_code == 201 and r.json()["listen"].startswith("[::]:")
            r = c.post("/proxies", json={"name": "priv", "listen": "127.0.0.1:1", "upstream": "127.0.0.1:9"})
            assert r.status_code == 403
    finally:
        server.stop()


def test_a_server_started_by_hand_keeps_toxiproxy_behaviour() -> None:
    proc, url = start()
    try:
        r = httpx.post(url + "/proxies", json={"name": "wide", "listen": "0.0.0.0:0", "upstream": "127.0.0.1:9"},
                       timeout=10)
        assert r.status_code == 201
    finally:
        proc.terminate()
        proc.wait(5)
