"""`stack serve --tls` and `--http 2`: HTTPS with a certificate of its own, HTTP/2 by ALPN and h2c with prior
knowledge (Hypercorn), one SSE event per DATA frame, SIGTERM mid-stream over h2, the connection cap over h2,
and the flag combinations refused with exit 2."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import h2.config
import h2.connection
import h2.events
import httpx
import pytest

from chaos.host.certs import make_local_certs
from chaos.host.tls import tls_context, trust
from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(90)

H2 = ("h2", "http/1.1")
BODY = {"model": "tiny", "prompt": "hello", "max_tokens": 32, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}}


def _trust(proc: StackProcess, keep: Path) -> None:
    """Trust the CA the stack made, through a copy in ``keep``: the stack removes its own at exit, and
    ``trust`` reads a CA file again for every client context made later in this process."""
    assert proc.ca is not None
    copy = keep / f"ca-{proc.pid}.pem"
    copy.write_bytes(Path(proc.ca).read_bytes())
    trust(copy)


async def _stream(client: httpx.AsyncClient, proc: StackProcess, body: dict[str, Any]) -> tuple[str, list[bytes]]:
    """One streaming completion: the HTTP version and the body's chunks as the client got them."""
    async with client.stream("POST", proc.base_url + "/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        chunks = [chunk async for chunk in response.aiter_raw() if chunk]
    return response.http_version, chunks


def _events(raw: bytes) -> list[Any]:
    return [json.loads(b[6:]) if b != b"data: [DONE]" else "[DONE]" for b in raw.split(b"\n\n") if b]


async def _admin_and_metrics(client: httpx.AsyncClient, proc: StackProcess, version: str) -> None:
    """The admin API and /metrics answer over the same client (and protocol)."""
    state = await client.get(proc.admin_url + "/state", headers=proc.admin_headers)
    assert state.status_code == 200 and state.http_version == version
    assert state.json()["connections"]["open"] >= 1
    metrics = await client.get(proc.metrics_url)
    assert metrics.status_code == 200 and metrics.http_version == version
    assert "vllm:num_requests_running" in metrics.text


def test_tls_with_a_certificate_of_its_own_streams_over_https(tmp_path: Path) -> None:
    with StackProcess.start("--tls", timeout=60) as proc:
        assert proc.url.startswith("https://127.0.0.1:"), proc.url
        assert proc.ca is not None and Path(proc.ca).is_file()
        made = Path(proc.ca).parent
        assert stat.S_IMODE(made.stat().st_mode) == 0o700
        assert f"CA {proc.ca}" in proc.stderr_text()
        _trust(proc, tmp_path)

        async def go() -> None:
            async with httpx.AsyncClient(verify=tls_context(), timeout=30, trust_env=False) as client:
                version, chunks = await _stream(client, proc, BODY)
                assert version == "HTTP/1.1"  # uvicorn: no ALPN, HTTP/1.1
                events = _events(b"".join(chunks))
                assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 32
                await _admin_and_metrics(client, proc, "HTTP/1.1")

        asyncio.run(go())
        # a client that does not trust the CA is refused: the TLS is real
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(proc.url + "/health", verify=True, trust_env=False, timeout=5)
    assert not made.exists(), "the certificate directory outlived the stack"


def test_http2_over_tls_by_alpn_one_event_per_data_frame(tmp_path: Path) -> None:
    """ALPN picks h2; each SSE event is one DATA frame (httpcore hands one chunk per frame): the events
    written back to back at the end (the last token's, usage, [DONE]) are not bunched into one frame."""
    with StackProcess.start("--tls", "--http", "2", timeout=60) as proc:
        assert proc.url.startswith("https://") and proc.ca is not None
        _trust(proc, tmp_path)

        async def go() -> None:
            async with httpx.AsyncClient(http2=True, verify=tls_context(H2), timeout=30, trust_env=False) as client:
                version, chunks = await _stream(client, proc, BODY)
                assert version == "HTTP/2"
                events = _events(b"".join(chunks))
                assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 32
                # exact, not a ratio: the server yields to its sender after every event, and the client
                # sees frames as sent, so any chunk holding two events is a coalescing server
                assert [c.count(b"data: ") for c in chunks] == [1] * len(events), [c[:60] for c in chunks]
                assert all(c.endswith(b"\n\n") for c in chunks)
                await _admin_and_metrics(client, proc, "HTTP/2")
            async with httpx.AsyncClient(verify=tls_context(), timeout=30, trust_env=False) as plain:
                version, _ = await _stream(plain, proc, BODY)  # no ALPN offer: HTTP/1.1 on the same port
                assert version == "HTTP/1.1"

        asyncio.run(go())


def test_h2c_with_prior_knowledge_and_http11_on_one_port() -> None:
    with StackProcess.start("--http", "2", timeout=60) as proc:
        assert proc.url.startswith("http://") and proc.ca is None

        async def go() -> None:
            async with httpx.AsyncClient(http1=False, http2=True, timeout=30, trust_env=False) as client:
                version, chunks = await _stream(client, proc, BODY)
                assert version == "HTTP/2"
                assert _events(b"".join(chunks))[-1] == "[DONE]"
                await _admin_and_metrics(client, proc, "HTTP/2")
                # server.nagle reaches h2 connections: Nagle on for the live one, read back from its socket
                nagle = await client.put(proc.admin_url + "/faults/n", json={"type": "nagle", "ttl": 30},
                                         headers=proc.admin_headers)
                assert nagle.status_code == 200, nagle.text
                state = (await client.get(proc.admin_url + "/state", headers=proc.admin_headers)).json()
                assert state["connections"]["nagle_on"] == state["connections"]["open"] >= 1, state["connections"]
            async with httpx.AsyncClient(timeout=30, trust_env=False) as h11:
                version, _ = await _stream(h11, proc, BODY)
                assert version == "HTTP/1.1"

        asyncio.run(go())


def test_hook_faults_over_h2_end_their_stream_and_spare_the_connection() -> None:
    """A mid_stream timeout cuts its stream at once (END_STREAM without [DONE]: Hypercorn alone left it open
    until the idle connection was closed, 5 s on); a first_byte fault's 500 arrives over h2; the
    connection carries the next request either way."""
    with StackProcess.start("--http", "2", timeout=60) as proc:

        async def go() -> None:
            async with httpx.AsyncClient(http1=False, http2=True, timeout=3, trust_env=False) as client:
                cut = {"type": "timeout", "where": "mid_stream", "fraction": 1.0, "after_events": 3}
                assert (await client.put(proc.admin_url + "/faults/cut", json=cut,
                                         headers=proc.admin_headers)).status_code == 200
                _, chunks = await _stream(client, proc, BODY)  # within the client's 3 s
                raw = b"".join(chunks)
                assert raw.count(b"data: ") == 3 and b"[DONE]" not in raw, raw[-200:]
                await client.delete(proc.admin_url + "/faults", headers=proc.admin_headers)
                early = {"type": "timeout", "where": "first_byte", "fraction": 1.0}
                assert (await client.put(proc.admin_url + "/faults/early", json=early,
                                         headers=proc.admin_headers)).status_code == 200
                refused = await client.post(proc.base_url + "/completions", json=BODY)
                assert refused.status_code == 500 and "injected at first_byte" in refused.text
                await client.delete(proc.admin_url + "/faults", headers=proc.admin_headers)
                _, chunks = await _stream(client, proc, BODY)
                assert _events(b"".join(chunks))[-1] == "[DONE]"
                state = (await client.get(proc.admin_url + "/state", headers=proc.admin_headers)).json()
                assert state["connections"]["accepted_total"] == 1  # one h2 connection carried it all

        asyncio.run(go())


def _h2_connect(url: str) -> tuple[socket.socket, h2.connection.H2Connection]:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    return sock, conn


def _h2_events(sock: socket.socket, conn: h2.connection.H2Connection, until: type) -> list[Any]:
    """Events until one of type ``until`` (or the server closes; the socket's timeout bounds the wait)."""
    seen: list[Any] = []
    while not any(isinstance(e, until) for e in seen):
        data = sock.recv(65536)
        if not data:
            break
        seen += conn.receive_data(data)
        sock.sendall(conn.data_to_send())
    return seen


def test_the_connection_cap_holds_over_h2c() -> None:
    """--max-connections 1: a second h2c connection gets a GOAWAY saying no stream was processed, an
    HTTP/1.1 one the 503; the first connection still works."""
    with StackProcess.start("--http", "2", "--max-connections", "1", timeout=60) as proc:
        first, conn = _h2_connect(proc.url)
        try:
            assert any(isinstance(e, h2.events.RemoteSettingsChanged)
                       for e in _h2_events(first, conn, h2.events.RemoteSettingsChanged))
            second, conn2 = _h2_connect(proc.url)
            with second:
                goaway = [e for e in _h2_events(second, conn2, h2.events.ConnectionTerminated)
                          if isinstance(e, h2.events.ConnectionTerminated)]
                assert goaway and goaway[0].last_stream_id == 0, goaway
                assert goaway[0].additional_data == b"too many open connections"
            with socket.create_connection((urlsplit(proc.url).hostname, urlsplit(proc.url).port), timeout=10) as h11:
                h11.sendall(b"GET /health HTTP/1.1\r\nHost: s\r\n\r\n")
                assert h11.recv(65536).startswith(b"HTTP/1.1 503 ")
            stream_id = conn.get_next_available_stream_id()
            conn.send_headers(stream_id, [(":method", "GET"), (":path", "/health"), (":scheme", "http"),
                                          (":authority", "s")], end_stream=True)
            first.sendall(conn.data_to_send())
            response = [e for e in _h2_events(first, conn, h2.events.StreamEnded)
                        if isinstance(e, h2.events.ResponseReceived)]
            assert response and dict(response[0].headers)[b":status"] == b"200"
        finally:
            first.close()


def test_an_h2c_connection_with_no_request_is_closed_after_the_header_timeout() -> None:
    """The preface and nothing else: Hypercorn's idle timer never runs for it (module docstring of
    chaos.stack.hyper); the accept loop's first-request deadline closes it after --header-timeout."""
    with StackProcess.start("--http", "2", "--header-timeout", "1s", "--keep-alive-timeout", "30s",
                            timeout=60) as proc:
        sock, conn = _h2_connect(proc.url)
        with sock:
            t0 = time.monotonic()
            _h2_events(sock, conn, h2.events.ConnectionTerminated)  # until the server closes (10 s socket timeout)
            waited = time.monotonic() - t0
        assert 0.9 <= waited < 5, waited


def test_sigterm_during_live_h2_streams_ends_each_in_band_and_exits_zero(tmp_path: Path) -> None:
    """Two streams multiplexed on one h2 connection (one decoding, one queued behind it): SIGTERM ends
    each with the in-band 503 error and [DONE], and the server exits 0 with every KV block free."""
    proc = StackProcess.start("--tls", "--http", "2", "--max-num-seqs", "1", "--log-level", "info", timeout=60)
    try:
        _trust(proc, tmp_path)
        long = {"model": "tiny", "prompt": "long", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        code = asyncio.run(_sigterm_mid_stream(proc, long))
        assert code == 0, proc.stderr_text()[-3000:]
        log = proc.stderr_text()
        assert "failing 2 live request(s)" in log, log[-3000:]
        assert "0 block(s) still held" in log and "KV blocks still held" not in log
    finally:
        proc.close()


async def _sigterm_mid_stream(proc: StackProcess, body: dict[str, Any]) -> int:
    async with httpx.AsyncClient(http2=True, verify=tls_context(H2), timeout=30, trust_env=False) as client:
        started = asyncio.Event()
        queued_in = asyncio.Event()

        async def read(first: bool) -> bytes:
            raw = b""
            async with client.stream("POST", proc.base_url + "/completions", json=body) as response:
                assert response.http_version == "HTTP/2"
                async for chunk in response.aiter_raw():
                    raw += chunk
                    if first and raw.count(b"data: ") >= 3:
                        started.set()
            return raw

        decoding = asyncio.create_task(read(True))
        await asyncio.wait_for(started.wait(), 20)
        queued = asyncio.create_task(read(False))
        while not queued_in.is_set():  # bounded by wait_for below
            state = (await client.get(proc.admin_url + "/state", headers=proc.admin_headers)).json()
            if state["num_waiting"] == 1:
                queued_in.set()
            else:
                await asyncio.sleep(0.01)
        proc.proc.send_signal(signal.SIGTERM)
        raws = await asyncio.wait_for(asyncio.gather(decoding, queued), 20)
    for raw, name in zip(raws, ("decoding", "queued"), strict=True):
        events = _events(raw)
        assert events[-1] == "[DONE]" and "error" in events[-2], (name, events[-3:])
        assert events[-2]["error"]["code"] == 503 and "shutting down" in events[-2]["error"]["message"], name
    return await asyncio.to_thread(proc.proc.wait, 20)


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chaos.stack", *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def _encrypted_key(pair_key: Path, out: Path) -> Path:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pair_key.read_bytes(), password=None)
    out.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.BestAvailableEncryption(b"secret")))
    return out


def test_bad_tls_and_http2_flags_exit_2_with_one_clear_line(tmp_path: Path) -> None:
    a, b = make_local_certs(tmp_path / "a"), make_local_certs(tmp_path / "b")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    locked = _encrypted_key(a.key, tmp_path / "locked.pem")
    cases = [
        (("--tls", "--tls-cert", str(a.cert)), "--tls-cert needs --tls-key too"),
        (("--tls", "--tls-key", str(a.key)), "--tls-key needs --tls-cert too"),
        (("--tls-cert", str(a.cert), "--tls-key", str(a.key)), "only with --tls"),
        (("--tls", "--tls-cert", str(tmp_path / "missing.pem"), "--tls-key", str(a.key)),
         f"cannot read --tls-cert {tmp_path / 'missing.pem'}: No such file or directory"),
        (("--tls", "--tls-cert", str(a.cert), "--tls-key", str(b.key)),
         f"--tls-key {b.key} is not the key of the certificate in --tls-cert {a.cert}"),
        (("--tls", "--tls-cert", str(junk), "--tls-key", str(a.key)), f"--tls-cert {junk} holds no PEM certificate"),
        (("--tls", "--tls-cert", str(a.cert), "--tls-key", str(junk)), f"--tls-key {junk} holds no PEM private key"),
        (("--tls", "--tls-cert", str(a.cert), "--tls-key", str(locked)), f"--tls-key {locked} is encrypted"),
        (("--http", "2", "--body-timeout", "3s"), "--body-timeout cannot be applied with --http 2"),
        (("--http", "3",), "invalid choice: '3'"),
    ]
    for args, expected in cases:
        done = _serve(*args)
        assert done.returncode == 2, (args, done.returncode, done.stderr)
        assert expected in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr and done.stdout == "", (args, done.stderr)
        if args[0] != "--http":  # argparse's own usage lines aside, our refusals are one line
            assert len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)


ORPHAN_PARENT = """
import sys, time
from chaos.stack.process import StackProcess
stack = StackProcess.start("--http", "2", timeout=60)
print(stack.proc.pid, flush=True)
time.sleep(120)  # killed long before this
"""


def _serving(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as proc_stat:
            return proc_stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has stopped serving
    except FileNotFoundError:
        return False


def test_an_h2_stack_stops_when_its_parent_is_killed_and_on_sigint() -> None:
    """--exit-with-parent (what the runner's stack is started with) and SIGINT reach the Hypercorn server."""
    parent = subprocess.Popen([sys.executable, "-c", ORPHAN_PARENT], stdout=subprocess.PIPE, text=True)
    stack_pid = 0
    try:
        assert parent.stdout is not None
        stack_pid = int(parent.stdout.readline().split()[0])
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 15
        while _serving(stack_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _serving(stack_pid), "the orphaned h2 stack is still serving"
    finally:
        parent.kill()
        parent.wait(10)
        if stack_pid and _serving(stack_pid):
            os.kill(stack_pid, signal.SIGKILL)
    with StackProcess.start("--http", "2", timeout=60) as proc:
        proc.proc.send_signal(signal.SIGINT)
        assert proc.proc.wait(20) == 0, proc.stderr_text()[-2000:]
