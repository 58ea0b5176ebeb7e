"""One verifying TLS context per process, and every HTTP client of ours built with it.

httpx builds a context per client otherwise (37 ms of CPU each, the CA bundle loaded again); sharing
must not loosen verification, and every client trusts what the host trusts: a target behind a
private CA named by SSL_CERT_FILE is reached by the warm-up's httpx client and by the load alike.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.host.tls import tls_context

ROOT = Path(__file__).resolve().parents[2]
CLIENT = re.compile(r"httpx\.(?:Async)?Client\(")


def test_the_shared_context_verifies_certificates_and_host_names() -> None:
    context = tls_context()
    assert context is tls_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.cert_store_stats()["x509_ca"] > 0  # the CA bundle is loaded: https targets still verify


def test_every_client_of_the_packages_is_built_with_the_shared_context() -> None:
    missing = []
    for path in [*ROOT.glob("chaos/**/*.py"), *ROOT.glob("faults/**/*.py"), *ROOT.glob("sla/**/*.py")]:
        text = path.read_text(encoding="utf-8")
        for match in CLIENT.finditer(text):
            depth, end = 0, match.end() - 1
            for end in range(match.end() - 1, len(text)):  # to the call's closing parenthesis
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
            if "verify=tls_context()" not in text[match.start():end]:
                line = text.count("\n", 0, match.start()) + 1
                missing.append(f"{path.relative_to(ROOT)}:{line}")
    assert not missing, f"clients building their own TLS context (pass verify=tls_context()): {missing}"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture
def private_ca_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTPS server on 127.0.0.1 whose certificate a CA of this test's own signed: (its URL, the CA file)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a CA with")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=streamchaos test CA", cwd=tmp_path)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=127.0.0.1", cwd=tmp_path)
    (tmp_path / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n", encoding="utf-8")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.pem", "-days", "1", "-extfile", "san.cnf", cwd=tmp_path)

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Models)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.pem", tmp_path / "server.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/v1", tmp_path / "ca.pem"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


# Both kinds of client of a run, in a fresh process (the context is made once per process): httpx as the
# warm-up, preflight and scrapes use it, and the load generator's own HTTP/1.1 client.
CLIENTS = """
import asyncio, sys, httpx
from chaos.host.tls import tls_context
from chaos.load.http1 import H1Client
url = sys.argv[1]
async def main():
    results = []
    try:
        async with httpx.AsyncClient(trust_env=False, verify=tls_context(), timeout=10) as client:
            results.append(f"httpx {(await client.get(url + '/models')).status_code}")
    except httpx.HTTPError as exc:
        results.append(f"httpx failed: {exc}")
    async with H1Client(connections=1) as h1:
        try:
            conn = await h1.connect(h1.target(url + "/completions"))
            conn.close()
            results.append("load connected")
        except OSError as exc:
            results.append(f"load failed: {exc}")
    print("; ".join(results))
asyncio.run(main())
"""


def _clients(url: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", CLIENTS, url], capture_output=True, text=True, timeout=60,
                          env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_a_private_ca_named_by_ssl_cert_file_is_trusted_by_every_client(private_ca_server: tuple[str, Path]) -> None:
    url, ca = private_ca_server
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    untrusted = _clients(url, env)
    assert "httpx failed" in untrusted and "load failed" in untrusted, untrusted  # verification is on
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted
    trusted = _clients(url, {**env, "SSL_CERT_FILE": str(ca)})
    assert trusted == "httpx 200; load connected", trusted
