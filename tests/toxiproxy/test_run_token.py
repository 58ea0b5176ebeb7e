"""The embedded Toxiproxy a run starts takes orders only from that run (issue 41, point 1).

Each test starts the server the runner's own way (``resolve_server("embedded")``: a real process on
an ephemeral loopback port, its token in its environment) and attacks it as another local user
would: a process on the same host without the run's token. Before the token, ``POST
/proxies/streamchaos {"upstream": <her relay>}`` was answered 200 and the load (the target's
``Authorization: Bearer`` key with it) went to her relay.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tpx_support import Upstreams

from chaos.execution.proxy import ToxiproxyServer, resolve_server
from chaos.host.children import first_line, spawn
from chaos.toxiproxy.client import ToxiproxyAPI
from chaos.toxiproxy.server.guard import TOKEN_ENV

ROOT = Path(__file__).resolve().parents[2]
KEY = b"Authorization: Bearer sk-target-key-0123456789"


class Relay:
    """The attacker's relay: accepts connections on loopback and keeps every byte it is sent."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received = bytearray()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(1.0)
                try:
                    while data := conn.recv(65536):
                        self.received += data
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def relay() -> Iterator[Relay]:
    r = Relay()
    yield r
    r.close()


@pytest.fixture
def run_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, upstreams: Upstreams) -> Iterator[ToxiproxyServer]:
    """The runner's embedded Toxiproxy with the run's proxy on it, in front of an echo server."""
    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    server = resolve_server("embedded", None, 7, tmp_path / "toxiproxy.log")
    try:
        assert server.token, "the runner's embedded server has a token"
        ToxiproxyAPI(server.url, server.token).create_proxy_sync(
            "streamchaos", f"127.0.0.1:{upstreams.echo_port}", "127.0.0.1:0")
        yield server
    finally:
        server.stop()


def as_the_runner(server: ToxiproxyServer) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=10, headers={"Authorization": f"Bearer {server.token}"})


def through_the_proxy(listen: str, data: bytes) -> bytes:
    host, _, port = listen.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(data)
        got = b""
        while len(got) < len(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def test_a_local_user_without_the_token_can_neither_redirect_nor_read_the_runs_proxy(
        run_server: ToxiproxyServer, relay: Relay) -> None:
    with as_the_runner(run_server) as runner:
        before = runner.get("/proxies/streamchaos").json()
    with httpx.Client(base_url=run_server.url, timeout=10) as her:
        r = her.post("/proxies/streamchaos", json={"upstream": f"127.0.0.1:{relay.port}"})
        assert r.status_code == 401, r.text  # was 200: the load went to her relay
        assert r.json()["status"] == 401 and "run's token" in r.json()["error"], r.text
        wrong = her.post("/proxies/streamchaos", json={"upstream": f"127.0.0.1:{relay.port}"},
                         headers={"Authorization": "Bearer " + "x" * 43})
        assert wrong.status_code == 403 and "not the run's token" in wrong.json()["error"], wrong.text
        for method, path, body in [("GET", "/proxies", None), ("GET", "/proxies/streamchaos", None),
                                   ("GET", "/proxies/streamchaos/toxics", None),
                                   ("POST", "/populate", [{"name": "streamchaos", "listen": "127.0.0.1:0",
                                                           "upstream": f"127.0.0.1:{relay.port}"}]),
                                   ("POST", "/proxies", {"name": "mine", "upstream": f"127.0.0.1:{relay.port}"}),
                                   ("POST", "/proxies/streamchaos/toxics", {"type": "latency"}),
                                   ("POST", "/reset", None), ("DELETE", "/proxies/streamchaos", None)]:
            r = her.request(method, path, json=body)
            assert r.status_code == 401 and "upstream" not in r.text, (method, path, r.text)
        assert her.get("/version").json() == {"version": "2.12.0"}  # reveals nothing: the runner's readiness check
    with as_the_runner(run_server) as runner:
        after = runner.get("/proxies/streamchaos").json()
    assert after == before and after["upstream"] != f"127.0.0.1:{relay.port}"
    assert through_the_proxy(after["listen"], KEY) == KEY  # the load still reaches the target ...
    assert bytes(relay.received) == b""  # ... and her relay saw nothing


def test_the_run_itself_never_moves_its_proxy_so_no_token_holder_can(run_server: ToxiproxyServer,
                                                                      relay: Relay) -> None:
    """The run creates its proxy once and never changes its listen or upstream: a guarded server
    refuses any change of them (a stolen token does not redirect the load either); what the faults
    do (toxics, enabled) still works."""
    with as_the_runner(run_server) as runner:
        created = runner.get("/proxies/streamchaos").json()
        moved = runner.post("/proxies/streamchaos", json={"upstream": f"127.0.0.1:{relay.port}"})
        assert moved.status_code == 403 and "fixed" in moved.json()["error"], moved.text
        assert runner.patch("/proxies/streamchaos", json={"listen": "127.0.0.1:0"}).status_code == 403
        populated = runner.post("/populate", json=[{"name": "streamchaos", "listen": created["listen"],
                                                    "upstream": f"127.0.0.1:{relay.port}"}])
        assert populated.status_code == 403 and "fixed" in populated.json()["error"], populated.text
        assert runner.post("/proxies/streamchaos", json={"enabled": False}).json()["enabled"] is False
        assert runner.post("/proxies/streamchaos", json={"enabled": True}).json()["enabled"] is True
        assert runner.post("/proxies/streamchaos/toxics", json={"name": "t", "type": "latency"}).status_code == 200
        assert runner.delete("/proxies/streamchaos/toxics/t").status_code == 204
        after = runner.get("/proxies/streamchaos").json()
    assert (after["upstream"], after["listen"]) == (created["upstream"], created["listen"])
    assert through_the_proxy(after["listen"], KEY) == KEY and bytes(relay.received) == b""


def test_the_token_travels_in_the_environment_never_on_the_command_line(run_server: ToxiproxyServer) -> None:
    assert run_server.process is not None and run_server.token
    cmdline = Path(f"/proc/{run_server.process.pid}/cmdline").read_bytes()
    assert run_server.token.encode() not in cmdline  # every local user reads /proc/PID/cmdline
    assert run_server.token not in repr(run_server)


def test_a_token_too_short_to_be_a_secret_is_refused_at_start() -> None:
    proc = spawn([sys.executable, "-m", "chaos.toxiproxy.server", "--port", "0"], cwd=ROOT,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, TOKEN_ENV: "short"})
    try:
        assert first_line(proc, 15.0) == ""
        assert proc.wait(10) == 1
        assert proc.stderr is not None and f"{TOKEN_ENV} must hold at least 16" in proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
