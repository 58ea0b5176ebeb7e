"""Talking to a Toxiproxy server through ``toxiproxy-python``, safely.

toxiproxy-python keeps the API host and port as class attributes of ``APIConsumer`` (global to the
process) and uses ``requests`` without timeouts. This adapter points it at the right server under
a lock for each call, runs the blocking call in a thread, and bounds it in time, so two runs in one
process (a pytest session) cannot talk to each other's servers.

``token``: the run's token of an embedded server it started (``chaos.toxiproxy.server.guard``), sent
as ``Authorization: Bearer`` on every call (a real Toxiproxy ignores the header).

The ledger: what this process itself set on a proxy, so a change made by anyone else shows. A
run's proxy is its own: created once with an upstream and a listen it never changes, its toxics
added and removed by its own network faults, disabled and enabled by ``network.down``. Any other
change (an upstream pointed at someone's relay, which reads the target's API key off the load; a
toxic added, removed or edited; the proxy disabled or deleted) was made behind the run's back. A
``ProxyLedger`` keeps what the run set; ``ToxiproxyAPI`` writes to the ledger registered for its
server and proxy around each call it makes, and the run's watch
(``chaos.execution.proxy.watching_proxy``) compares the server's listing to it. A call in flight
leaves its toxic (or the enabled flag) open: either state is the run's until the call has
returned, since the server may or may not have applied it yet. ``generation`` counts the ledger's
changes, so a comparison against a listing read while the run changed its own proxy is set aside
(the next one, a second later, decides).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlsplit

import httpx
import requests
import toxiproxy.api
from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from chaos.host.tls import tls_context
from chaos.model.errors import FaultError

__all__ = ["ProxyLedger", "ToxiproxyAPI", "ToxiproxyRefused", "drop_ledger", "keep_ledger", "ledger_of",
           "toxic_shape"]

T = TypeVar("T")
_LOCK = threading.Lock()
CALL_TIMEOUT_S = 30.0  # Toxiproxy's own handler timeout is 25 s
LISTING_TIMEOUT_S = 5.0  # one read of the run's proxy by its watch


class _RequestsWithTimeout:
    """What toxiproxy-python sees as its ``requests`` module: the same calls, each with a timeout.

    Without it a hung Toxiproxy would block its worker thread forever (holding the lock above)
    and, at exit, asyncio's executor shutdown with it. ``headers``: the calling client's (its token),
    set under the lock for the length of one call, as ``APIConsumer``'s host and port are.
    """

    headers: ClassVar[dict[str, str]] = {}

    @classmethod
    def get(cls, url: str, **kwargs: Any) -> requests.Response:
        return _authorised(requests.get(url, timeout=CALL_TIMEOUT_S - 1, headers=cls.headers, **kwargs))

    @classmethod
    def post(cls, url: str, **kwargs: Any) -> requests.Response:
        return _authorised(requests.post(url, timeout=CALL_TIMEOUT_S - 1, headers=cls.headers, **kwargs))

    @classmethod
    def delete(cls, url: str, **kwargs: Any) -> requests.Response:
        return _authorised(requests.delete(url, timeout=CALL_TIMEOUT_S - 1, headers=cls.headers, **kwargs))


class ToxiproxyRefused(FaultError):
    """A Toxiproxy that refused the caller (HTTP 401 or 403): a run's embedded server answers only that
    run's token, which an offline rollback does not have (it is never journaled)."""


def _refused(api_url: str, response: httpx.Response) -> None:
    """``ToxiproxyRefused`` when ``response`` refuses the caller: nothing was changed, which a plain
    status string in a rollback's evidence would not say."""
    if response.status_code in (401, 403):
        raise ToxiproxyRefused(f"the Toxiproxy at {api_url} refused {response.request.method} "
                               f"{response.request.url.path}: HTTP {response.status_code}")


def _authorised(response: requests.Response) -> requests.Response:
    """``response``, unless the server refused the caller (toxiproxy-python would read the refusal
    as a proxy or toxic and fail on a missing key)."""
    if response.status_code in (401, 403):
        raise FaultError(f"Toxiproxy refused {response.request.method} {response.request.path_url}: "
                         f"HTTP {response.status_code} {response.text.strip()[:300]}")
    return response


toxiproxy.api.requests = _RequestsWithTimeout


class ToxiproxyAPI:
    """The calls network faults need, against the server at ``api_url``."""

    def __init__(self, api_url: str, token: str | None = None) -> None:
        parts = urlsplit(api_url)
        self.api_url = api_url.rstrip("/")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 8474
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def __repr__(self) -> str:  # never the token
        return f"ToxiproxyAPI({self.api_url!r})"

    def _call(self, fn: Callable[[Toxiproxy], T]) -> T:
        with _LOCK:
            server = Toxiproxy()
            server.update_api_consumer(self.host, self.port)
            _RequestsWithTimeout.headers = self.headers
            try:
                return fn(server)
            except (InvalidToxic, ProxyExists, NotFound) as exc:
                raise FaultError(f"Toxiproxy at {self.api_url} refused: {type(exc).__name__}: {_text(exc)}") from exc
            except OSError as exc:  # requests' ConnectionError is an OSError
                raise FaultError(f"Toxiproxy at {self.api_url} did not answer: {exc}") from exc
            finally:
                APIConsumer.host, APIConsumer.port = "127.0.0.1", 8474
                _RequestsWithTimeout.headers = {}

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

        ledger = self._ledger(proxy)
        if ledger is not None:
            ledger.changing_toxic(name)  # from now until it returns, with or without it is the run's
        added = await self.call(add)
        if ledger is not None:
            ledger.added_toxic(name, added)
        return added

    async def remove_toxic(self, proxy: str, name: str) -> bool:
        """Delete a toxic; False when it (or the proxy) was already gone."""

        def remove(server: Toxiproxy) -> bool:
            handle = server.get_proxy(proxy)
            if handle is None or handle.get_toxic(name) is None:
                return False
            handle.destroy_toxic(name)
            return True

        ledger = self._ledger(proxy)
        if ledger is not None:
            ledger.changing_toxic(name)
        removed = await self.call(remove)
        if ledger is not None:
            ledger.removed_toxic(name)
        return removed

    async def set_enabled(self, proxy: str, enabled: bool) -> dict[str, Any]:
        def toggle(server: Toxiproxy) -> dict[str, Any]:
            handle = server.get_proxy(proxy)
            if handle is None:
                raise FaultError(f"Toxiproxy at {self.api_url} has no proxy {proxy!r}")
            handle.enable() if enabled else handle.disable()
            again = server.get_proxy(proxy)
            return {"proxy": proxy, "enabled": bool(again.enabled) if again is not None else None}

        ledger = self._ledger(proxy)
        if ledger is not None:
            ledger.changing_enabled()
        toggled = await self.call(toggle)
        if ledger is not None and toggled["enabled"] is not None:
            ledger.set_enabled(toggled["enabled"])
        return toggled

    def _ledger(self, proxy: str) -> ProxyLedger | None:
        return ledger_of(self.api_url, proxy)

    async def listing(self, proxy: str) -> dict[str, Any] | None:
        """``GET /proxies/NAME`` as the server lists it (None: no such proxy), for the run's watch;
        ``FaultError`` when the server does not answer it."""
        try:
            async with httpx.AsyncClient(timeout=LISTING_TIMEOUT_S, trust_env=False, headers=self.headers,
                                         verify=tls_context()) as client:
                response = await client.get(f"{self.api_url}/proxies/{proxy}")
        except httpx.HTTPError as exc:
            raise FaultError(f"Toxiproxy at {self.api_url} did not answer GET /proxies/{proxy}: {exc!r}") from exc
        if response.status_code == 404:
            return None
        try:
            body = response.json() if response.status_code == 200 else None
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise FaultError(f"Toxiproxy at {self.api_url} answered GET /proxies/{proxy} with HTTP "
                             f"{response.status_code}: {response.text.strip()[:300]}")
        return body

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
        with httpx.Client(base_url=self.api_url, timeout=10.0, trust_env=False, verify=tls_context(),
                          headers=self.headers) as client:
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
            response = httpx.delete(f"{self.api_url}/proxies/{name}", timeout=5.0, headers=self.headers,
                                    trust_env=False)
        except httpx.HTTPError:
            return "server gone"
        return {204: "deleted", 404: "already gone"}.get(response.status_code, f"HTTP {response.status_code}")

    def remove_toxic_sync(self, proxy: str, name: str) -> str:
        try:
            response = httpx.delete(f"{self.api_url}/proxies/{proxy}/toxics/{name}", timeout=5.0,
                                    headers=self.headers, trust_env=False)
        except httpx.HTTPError:
            return "server gone (its proxies and toxics went with it)"
        _refused(self.api_url, response)
        return {204: "removed", 404: "already gone"}.get(response.status_code, f"HTTP {response.status_code}")

    def enable_sync(self, proxy: str) -> str:
        try:
            response = httpx.post(f"{self.api_url}/proxies/{proxy}", json={"enabled": True}, timeout=5.0,
                                  trust_env=False, headers=self.headers)
        except httpx.HTTPError:
            return "server gone"
        _refused(self.api_url, response)
        return "enabled" if response.status_code == 200 else f"HTTP {response.status_code}"


def _text(exc: Exception) -> str:
    arg = exc.args[0] if exc.args else ""
    return arg.decode("utf-8", "replace").strip() if isinstance(arg, bytes) else str(arg)


# -- the ledger ------------------------------------------------------------------------------
SHOWN = 200  # characters of an unexpected value a difference quotes
MOST_DIFFERENCES = 8  # differences named one by one (a server listing 10,000 toxics is one more line)


def toxic_shape(toxic: Mapping[str, Any]) -> dict[str, Any]:
    """What of a toxic the run set and checks: its type, direction, toxicity and attributes; attributes
    a server lists as something else than an object are shown as they came (a change, never a crash). Pure."""
    attributes = toxic.get("attributes") or {}
    return {"type": toxic.get("type"), "stream": toxic.get("stream"), "toxicity": toxic.get("toxicity"),
            "attributes": dict(attributes) if isinstance(attributes, Mapping) else {"?": _shown(attributes)}}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN else text[:SHOWN] + "..."


@dataclass
class ProxyLedger:
    """One proxy as the run configured it. ``toxics``: name → its shape, or None while a call on it
    is in flight; ``enabled`` None likewise."""

    upstream: str
    listen: str
    enabled: bool | None = True
    toxics: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    generation: int = 0

    def changing_toxic(self, name: str) -> None:
        """A call that adds or removes ``name`` is about to be sent."""
        self.toxics[name] = None
        self.generation += 1

    def added_toxic(self, name: str, listed: Mapping[str, Any]) -> None:
        self.toxics[name] = toxic_shape(listed)
        self.generation += 1

    def removed_toxic(self, name: str) -> None:
        self.toxics.pop(name, None)
        self.generation += 1

    def changing_enabled(self) -> None:
        self.enabled = None
        self.generation += 1

    def set_enabled(self, enabled: bool) -> None:
        self.enabled = enabled
        self.generation += 1

    def differences(self, seen: Mapping[str, Any] | None) -> list[str]:
        """What differs between ``seen`` (the server's ``GET /proxies/NAME``; None: no such proxy)
        and what the run set, one line each; empty when nothing does. Pure."""
        if seen is None:
            return ["the proxy was deleted"]
        out = []
        for key in ("upstream", "listen"):
            if seen.get(key) != getattr(self, key):
                out.append(f"its {key} was changed from {getattr(self, key)!r} to {_shown(seen.get(key))}")
        if self.enabled is not None and seen.get("enabled") != self.enabled:
            out.append(f"it was {'enabled' if seen.get('enabled') else 'disabled'}")
        out += self._toxic_differences(seen.get("toxics"))
        if len(out) > MOST_DIFFERENCES:
            out[MOST_DIFFERENCES:] = [f"and {len(out) - MOST_DIFFERENCES} more"]
        return out

    def _toxic_differences(self, listed: Any) -> list[str]:
        if listed is None:  # Go's encoding of an empty slice it never made: no toxics
            listed = []
        if not isinstance(listed, list):
            return [f"its toxics are listed as {_shown(listed)}"]
        found = {str(t.get("name")): t for t in listed if isinstance(t, Mapping)}
        out = [f"toxic {_shown(name)} was added ({_shown(toxic_shape(t))})"
               for name, t in found.items() if name not in self.toxics]
        for name, shape in self.toxics.items():
            if shape is None:
                continue  # a call of the run's own in flight: either way is the run's
            if name not in found:
                out.append(f"toxic {name!r} was removed")
            elif toxic_shape(found[name]) != shape:
                out.append(f"toxic {name!r} was changed to {_shown(toxic_shape(found[name]))}")
        return out


_LEDGERS: dict[tuple[str, str], ProxyLedger] = {}
_LEDGER_LOCK = threading.Lock()  # never the calls' lock: a read of the ledger must not wait on a call


def _key(api_url: str, proxy: str) -> tuple[str, str]:
    return api_url.rstrip("/"), proxy


def keep_ledger(api_url: str, proxy: str, ledger: ProxyLedger) -> None:
    """From now on, calls of this process on ``proxy`` at ``api_url`` are written to ``ledger``."""
    with _LEDGER_LOCK:
        _LEDGERS[_key(api_url, proxy)] = ledger


def drop_ledger(api_url: str, proxy: str) -> None:
    with _LEDGER_LOCK:
        _LEDGERS.pop(_key(api_url, proxy), None)


def ledger_of(api_url: str, proxy: str) -> ProxyLedger | None:
    with _LEDGER_LOCK:
        return _LEDGERS.get(_key(api_url, proxy))
