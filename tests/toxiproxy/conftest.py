"""Fixtures for the Toxiproxy conformance suite.

``toxiproxy`` is parametrized over servers: the embedded one (thread-hosted, ephemeral port)
always, and a real ``toxiproxy-server`` when ``TOXIPROXY_SERVER_BIN`` or ``PATH`` provides one.
Upstreams are real loopback servers on their own asyncio loop thread: an echo server, and a
"ticker" that answers a line ``"N INTERVAL_MS\\n"`` with N lines ``"i <monotonic send time>\\n"``,
one every INTERVAL_MS, and then closes (same process, so the same monotonic clock).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from chaos.toxiproxy.server import ToxiproxyThread

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tpx_support import Server, Upstreams


def real_binary() -> str | None:
    return os.environ.get("TOXIPROXY_SERVER_BIN") or shutil.which("toxiproxy-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def upstreams() -> Iterator[Upstreams]:
    u = Upstreams()
    yield u
    u.stop()


@pytest.fixture(scope="session")
def embedded_server() -> Iterator[ToxiproxyThread]:
    t = ToxiproxyThread(seed=1234)
    t.start()
    yield t
    t.stop()


@pytest.fixture(scope="session")
def real_server() -> Iterator[str]:
    binary = real_binary()
    if not binary:
        pytest.skip("no toxiproxy-server (PATH or TOXIPROXY_SERVER_BIN)")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "-host", "127.0.0.1", "-port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/version", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("toxiproxy-server did not come up")
    yield url
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(params=["embedded", "real"])
def toxiproxy(request: pytest.FixtureRequest) -> Iterator[Server]:
    if request.param == "embedded":
        url = request.getfixturevalue("embedded_server").url
    else:
        if request.node.get_closest_marker("embedded_only"):
            pytest.skip("embedded-only behaviour")
        url = request.getfixturevalue("real_server")
    with httpx.Client(base_url=url, timeout=10) as client:
        srv = Server(request.param, url, client)
        srv.cleanup()
        try:
            yield srv
        finally:
            srv.cleanup()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "embedded_only: behaviour only the embedded server has")
