"""``--push-metrics http://user:password@host/`` with an ``HTTP_PROXY`` in the environment: the push
goes straight to the Pushgateway (``trust_env=False``), its credentials only as an ``Authorization``
header to that host, never through the proxy and never in a message.

Before issue 41 prometheus-client's urllib handler took the proxy from the environment and wrote the
whole URL, ``alice:s3cret@`` included, into the request line the proxy reads, in clear over http.
The proxy here is a real process: a tiny asyncio HTTP proxy that records every byte it receives and
answers 200 (as a proxy that forwards would, after reading the same bytes).
"""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from chaos.model.errors import UsageError
from chaos.output.exporter import PrometheusExporter

pytestmark = pytest.mark.timeout(60)

USER, PASSWORD = "alice", "s3cret-pw"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

PROXY = r'''
import asyncio, sys

async def serve(reader, writer):
    data = b""
    try:
        data = await asyncio.wait_for(reader.read(65536), 5)
    except Exception:
        pass
    with open(sys.argv[1], "ab") as log:
        log.write(data)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    await writer.drain()
    writer.close()

async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()

asyncio.run(main())
'''


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A recording HTTP proxy process: its URL and the file of everything it received."""
    log = tmp_path / "proxy.log"
    log.write_bytes(b"")
    process = subprocess.Popen([sys.executable, "-c", PROXY, str(log)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}", log
    finally:
        process.kill()
        process.wait(timeout=10)


class _Gateway(BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None]] = []

    def do_PUT(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.seen.append((self.path, self.headers.get("Authorization")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[tuple[int, list[tuple[str, str | None]]]]:
    """A Pushgateway stand-in: its port and the (path, Authorization) of every push."""
    _Gateway.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_port, _Gateway.seen
    server.shutdown()
    server.server_close()


def test_the_push_bypasses_an_env_proxy_and_its_credentials_reach_only_the_gateway(
        monkeypatch: pytest.MonkeyPatch, proxy: tuple[str, Path],
        gateway: tuple[int, list[tuple[str, str | None]]]) -> None:
    proxy_url, proxy_log = proxy
    port, seen = gateway
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, proxy_url)
    with PrometheusExporter(push_url=f"http://{USER}:{PASSWORD}@127.0.0.1:{port}", push_interval_s=3600) as exporter:
        exporter.experiment = "creds"
        pushed = exporter.push()
    received = proxy_log.read_bytes()
    assert PASSWORD.encode() not in received and BASIC.split()[1].encode() not in received, received[:300]
    assert pushed, exporter.push_errors
    assert seen == [("/metrics/job/streamchaos/experiment/creds", BASIC)], seen
    assert PASSWORD not in (exporter.push_url or "")


def test_a_failed_push_names_the_url_without_its_password(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with PrometheusExporter(push_url=f"http://{USER}:{PASSWORD}@127.0.0.1:{port}") as exporter:
        assert exporter.push() is False
    assert exporter.push_errors and f"127.0.0.1:{port}" in exporter.push_errors[0]
    assert PASSWORD not in " ".join(exporter.push_errors) + capsys.readouterr().err


def test_a_push_url_that_is_not_http_is_refused_without_quoting_its_password() -> None:
    with pytest.raises(UsageError) as caught:
        PrometheusExporter(push_url=f"ftp://{USER}:{PASSWORD}@127.0.0.1:9091")
    assert PASSWORD not in str(caught.value) and "http://" in str(caught.value)
