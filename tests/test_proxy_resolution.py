"""Which Toxiproxy a run uses, and where the load generator reaches the proxy."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

import httpx
import pytest

from chaos.execution.proxy import UNGUARDED, resolve_server, start_proxy
from chaos.experiment import experiment_from_dict
from chaos.model.context import TargetInfo
from chaos.model.errors import SetupFailed
from chaos.model.observations import Note
from chaos.output.progress import describe
from chaos.toxiproxy.server import ToxiproxyThread


def experiment(proxy: dict[str, object]) -> object:
    return experiment_from_dict({"name": "p", "proxy": proxy, "phases": [{"name": "a", "duration": "1s"}]})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_external_toxiproxy_is_a_setup_error(tmp_path: Path) -> None:
    with pytest.raises(SetupFailed, match="does not answer"):
        resolve_server("external", f"http://127.0.0.1:{free_port()}", 0, tmp_path / "log")


def test_embedded_server_is_the_last_resort_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    server = resolve_server("embedded", None, 7, tmp_path / "log")
    try:
        assert server.kind == "embedded" and "embedded" in server.why
        assert httpx.get(server.url + "/version", timeout=5).json() == {"version": "2.12.0"}
    finally:
        server.stop()
    assert server.process is not None and server.process.poll() is not None  # stopped, nothing left


def test_wildcard_listen_sends_load_to_the_api_host(tmp_path: Path) -> None:
    """A Toxiproxy in another pod: the proxy listens everywhere, clients use the API's host."""
    with ToxiproxyThread() as tpx:
        exp = experiment({"server": "external", "url": tpx.url, "listen": "0.0.0.0:0"})
        target = TargetInfo(kind="openai", base_url=f"http://127.0.0.1:{free_port()}/v1")
        handle = asyncio.run(start_proxy(exp, target, tmp_path))
        try:
            assert handle.client_base_url.startswith("http://127.0.0.1:") and handle.client_base_url.endswith("/v1")
            listed = httpx.get(f"{tpx.url}/proxies/{handle.info.proxy_name}", timeout=5).json()
            assert listed["listen"].startswith("[::]:")  # Toxiproxy's spelling of every interface
            assert handle.info.server == "external" and not handle.info.supports_buffer
        finally:
            asyncio.run(handle.stop())
        assert httpx.get(f"{tpx.url}/proxies/{handle.info.proxy_name}", timeout=5).status_code == 404


def fake_toxiproxy_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, serves: bool) -> Path:
    """A ``toxiproxy-server`` on PATH and in TOXIPROXY_SERVER_BIN: it leaves a mark when started, then
    exits (``serves`` False) or serves Toxiproxy's API unguarded, as the real binary does."""
    mark = tmp_path / "binary-started"
    serve = f'exec "{sys.executable}" -m chaos.toxiproxy.server "$@"' if serves else "exit 1"
    binary = tmp_path / "bin" / "toxiproxy-server"
    binary.parent.mkdir()
    binary.write_text(f"#!/bin/sh\ntouch '{mark}'\nunset STREAMCHAOS_TOXIPROXY_TOKEN\n{serve}\n")
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", f"{binary.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("TOXIPROXY_SERVER_BIN", str(binary))
    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    return mark


def test_auto_starts_the_guarded_embedded_server_even_with_a_binary_on_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41 point 1: a Toxiproxy the runner starts takes orders only from the runner. ``auto`` used
    to start a ``toxiproxy-server`` found on PATH, whose API every local user can reconfigure."""
    mark = fake_toxiproxy_server(tmp_path, monkeypatch, serves=False)
    server = resolve_server("auto", None, 7, tmp_path / "log")
    try:
        assert server.kind == "embedded" and server.token, server  # was: the binary, started (and failing)
        assert not mark.exists() and not server.notes
        assert "TOXIPROXY_URL" in server.why and "answers only this run" in server.why
        assert httpx.get(server.url + "/proxies", timeout=5).status_code == 401  # another user's read
    finally:
        server.stop()


def test_a_binary_asked_for_by_name_is_said_to_be_unguarded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mark = fake_toxiproxy_server(tmp_path, monkeypatch, serves=True)
    server = resolve_server("binary", None, 7, tmp_path / "log")
    try:
        assert server.kind == "binary" and mark.exists() and server.token is None
        assert server.notes == [UNGUARDED] and "any local user" in UNGUARDED
        assert httpx.get(server.url + "/proxies", timeout=5).status_code == 200  # anyone's, as the note says
    finally:
        server.stop()
    line = describe(Note(topic="proxy", t=0, data={"server": "binary", "api_url": server.url, "notes": server.notes}))
    assert line is not None and line.startswith("  !! Toxiproxy (binary at http://127.0.0.1:") and "UNGUARDED" in line
    assert describe(Note(topic="proxy", t=0, data={"server": "embedded", "api_url": server.url})) is None
