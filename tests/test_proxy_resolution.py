"""Which Toxiproxy a run uses, and where the load generator reaches the proxy."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import httpx
import pytest

from chaos.execution.proxy import resolve_server, start_proxy
from chaos.experiment import experiment_from_dict
from chaos.model.context import TargetInfo
from chaos.model.errors import SetupFailed
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
