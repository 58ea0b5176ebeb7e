"""Talking to a Toxiproxy server through ``toxiproxy-python``, safely.

toxiproxy-python keeps the API host and port as class attributes of ``APIConsumer`` (global to the
process) and uses ``requests`` without timeouts. This adapter points it at the right server under
a lock for each call, runs the blocking call in a thread, and bounds it in time, so two runs in one
process (a pytest session) cannot talk to each other's servers.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import requests
import toxiproxy.api
from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from chaos.host.tls import tls_context
from chaos.model.errors import FaultError

__all__ = ["ToxiproxyAPI"]

T = TypeVar("T")
_LOCK = threading.Lock()
CALL_TIMEOUT_S = 30.0  # Toxiproxy's own handler timeout is 25 s


class _RequestsWithTimeout:
    """What toxiproxy-python sees as its ``requests`` module: the same calls, each with a timeout.

    Without it a hung Toxiproxy would block its worker thread forever (holding the lock above)
    and, at exit, asyncio's executor shutdown with it.
    """

    @staticmethod
    def get(url: str, **kwargs: Any) -> requests.Response:
        return requests.get(url, timeout=CALL_TIMEOUT_S - 1, **kwargs)

    @staticmethod
    def post(url: str, **kwargs: Any) -> requests.Response:
        return requests.post(url, timeout=CALL_TIMEOUT_S - 1, **kwargs)

    @staticmethod
    def delete(url: str, **kwargs: Any) -> requests.Response:
        return requests.delete(url, timeout=CALL_TIMEOUT_S - 1, **kwargs)


toxiproxy.api.requests = _RequestsWithTimeout


class ToxiproxyAPI:
    """The calls network faults need, against the server at ``api_url``."""

    def __init__(self, api_url: str) -> None:
        parts = urlsplit(api_url)
        self.api_url = api_url.rstrip("/")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 8474

    def _call(self, fn: Callable[[Toxiproxy], T]) -> T:
        with _LOCK:
            server = Toxiproxy()
            server.update_api_consumer(self.host, self.port)
            try:
                return fn(server)
            except (InvalidToxic, ProxyExists, NotFound) as exc:
                raise FaultError(f"Toxiproxy at {self.api_url} refused: {type(exc).__name__}: {_text(exc)}") from exc
            except OSError as exc:  # requests' ConnectionError is an OSError
                raise FaultError(f"Toxiproxy at {self.api_url} did not answer: {exc}") from exc
            finally:
                APIConsumer.host, APIConsumer.port = "127.0.0.1", 8474

    async def call(self, fn: Callable[[Toxiproxy], T]) -> T:
        async with asyncio.timeout(CALL_TIMEOUT_S):
            return await asyncio.to_thread(self._call, fn)

    async def add_toxic(self, proxy: str, *, name: str, type: str, stream: str, toxicity: float,
                        attributes: dict[str, Any]) -> dict[str, Any]:
        """Add a toxic and return it as the server lists it (the evidence that it is in force)."""

        def add(server: Toxiproxy) -> dict[str, Any]:
            handle = server.get_proxy(proxy)
            if handle is None:
                raise FaultError(f"Toxiproxy at {self.api_url} has no proxy {proxy!r}")
            handle.add_toxic(name=name, type=type, stream=stream, toxicity=toxicity, attributes=attributes)
            listed = handle.get_toxic(name)
            if listed is None:
                raise FaultError(f"toxic {name!r} was accepted but is not listed on proxy {proxy!r}")
            return {"name": listed.name, "type": listed.type, "stream": listed.stream, "toxicity": listed.toxicity,
                    "attributes": listed.attributes}

        return await self.call(add)

    async def remove_toxic(self, proxy: str, name: str) -> bool:
        """Delete a toxic; False when it (or the proxy) was already gone."""

        def remove(server: Toxiproxy) -> bool:
            handle = server.get_proxy(proxy)
            if handle is None or handle.get_toxic(name) is None:
                return False
            handle.destroy_toxic(name)
            return True

        return await self.call(remove)

    async def set_enabled(self, proxy: str, enabled: bool) -> dict[str, Any]:
        def toggle(server: Toxiproxy) -> dict[str, Any]:
            handle = server.get_proxy(proxy)
            if handle is None:
                raise FaultError(f"Toxiproxy at {self.api_url} has no proxy {proxy!r}")
            handle.enable() if enabled else handle.disable()
            again = server.get_proxy(proxy)
            return {"proxy": proxy, "enabled": bool(again.enabled) if again is not None else None}

        return await self.call(toggle)

    # Set-up, teardown and offline rollback (a fresh process with no event loop): plain HTTP with
    # short timeouts, where toxiproxy-python has no call (update a proxy, recreate after a crash).
    def answers(self, timeout: float = 2.0) -> bool:
        try:
            return httpx.get(f"{self.api_url}/version", timeout=timeout, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    def create_proxy_sync(self, name: str, upstream: str, listen: str) -> str:
        """Create the proxy (replacing one a killed run left behind); return its resolved listen address."""
        body = {"name": name, "listen": listen, "upstream": upstream, "enabled": True}
        with httpx.Client(base_url=self.api_url, timeout=10.0, trust_env=False, verify=tls_context()) as client:
            response = client.post("/proxies", json=body)
            if response.status_code == 409:
                client.delete(f"/proxies/{name}")
                response = client.post("/proxies", json=body)
        if response.status_code != 201:
            raise FaultError(f"Toxiproxy at {self.api_url} refused to create proxy {name!r}: "
                             f"HTTP {response.status_code} {response.text.strip()}")
        return str(response.json()["listen"])

    def delete_proxy_sync(self, name: str) -> str:
        try:
            response = httpx.delete(f"{self.api_url}/proxies/{name}", timeout=5.0)
        except httpx.HTTPError:
            return "server gone"
        return {204: "deleted", 404: "already gone"}.get(response.status_code, f"HTTP {response.status_code}")

    def remove_toxic_sync(self, proxy: str, name: str) -> str:
        try:
            response = httpx.delete(f"{self.api_url}/proxies/{proxy}/toxics/{name}", timeout=5.0)
        except httpx.HTTPError:
            return "server gone (its proxies and toxics went with it)"
        return {204: "removed", 404: "already gone"}.get(response.status_code, f"HTTP {response.status_code}")

    def enable_sync(self, proxy: str) -> str:
        try:
            response = httpx.post(f"{self.api_url}/proxies/{proxy}", json={"enabled": True}, timeout=5.0,
                                  trust_env=False)
        except httpx.HTTPError:
            return "server gone"
        return "enabled" if response.status_code == 200 else f"HTTP {response.status_code}"


def _text(exc: Exception) -> str:
    arg = exc.args[0] if exc.args else ""
    return arg.decode("utf-8", "replace").strip() if isinstance(arg, bytes) else str(arg)
