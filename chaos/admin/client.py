"""A small async client for the builtin stack's admin API (used by the server and KV faults).

Errors are translated at this boundary: a refused connection becomes ``TargetUnreachable``, a 403
``FaultPermissionDenied``, any other non-2xx answer ``FaultError`` carrying the server's message.

``recognise`` decides whether a server may be sent the admin token at all: it must say it is a
streamchaos stack on ``/health`` and prove, on ``/admin/proof``, that it holds the same token (an
HMAC of a fresh nonce), so neither a foreign server nor another stack ever receives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Self
from urllib.parse import quote

import httpx

from chaos.host.tls import tls_context
from chaos.model.errors import FaultError, FaultPermissionDenied, TargetUnreachable

__all__ = ["LEASE_RENEW_EVERY_S", "LEASE_TTL_S", "AdminClient", "LeaseKeeper", "admin_delete_sync", "admin_url_of",
           "proof_of", "recognise"]

log = logging.getLogger("chaos.admin.client")

# What a fault sets through the admin API is a lease of LEASE_TTL_S, renewed every LEASE_RENEW_EVERY_S
# while the fault is injected: a runner that dies leaves it for at most LEASE_TTL_S. Five renewals per
# lease ride out a loop stalled for seconds on a loaded box.
LEASE_TTL_S = 10.0
LEASE_RENEW_EVERY_S = 2.0


def proof_of(token: str, nonce: str) -> str:
    """What a stack holding ``token`` answers on ``/admin/proof?nonce=`` (hex HMAC-SHA256)."""
    return hmac.new(token.encode(), f"streamchaos-admin:{nonce}".encode(), hashlib.sha256).hexdigest()


async def recognise(root_url: str, token: str, timeout: float = 5.0) -> str | None:
    """None when the server at ``root_url`` is a streamchaos stack that holds ``token``; else why not.

    The token is not sent: ``/health`` must say ``"server": "streamchaos"``, then ``/admin/proof``
    must answer HMAC-SHA256(token, "streamchaos-admin:" + nonce) for a fresh random nonce.
    """
    root = root_url.rstrip("/")
    nonce = secrets.token_urlsafe(24)
    try:
        async with httpx.AsyncClient(timeout=timeout, trust_env=False, verify=tls_context()) as client:
            health = await client.get(root + "/health")
            if health.status_code not in (200, 503) or _json(health).get("server") != "streamchaos":
                return f"{root}/health does not say it is a streamchaos stack"
            proof = await client.get(root + "/admin/proof", params={"nonce": nonce})
    except httpx.HTTPError as exc:
        return f"{root} did not answer: {exc!r}"
    answer = _json(proof).get("proof")
    if proof.status_code != 200 or not isinstance(answer, str):
        return f"{root}/admin/proof gave no proof (HTTP {proof.status_code}): an older stack, or one without a token"
    if not hmac.compare_digest(answer, proof_of(token, nonce)):
        return f"the stack at {root} holds another admin token than the one configured"
    return None


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def admin_url_of(base_url: str) -> str:
    """``http://H:P/v1`` (or ``http://H:P``) → ``http://H:P/admin``."""
    root = base_url.rstrip("/")
    root = root.removesuffix("/v1")
    return root + "/admin"


class AdminClient:
    """``AdminClient("http://127.0.0.1:P/admin", token=None)``; close with ``aclose()``."""

    def __init__(self, admin_url: str, token: str | None = None, timeout: float = 10.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.admin_url = admin_url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.admin_url, headers=headers, timeout=timeout, trust_env=False,
                                       verify=tls_context())

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, json: Any = None) -> Any:
        try:
            response = await self._http.request(method, path, json=json)
        except httpx.TransportError as exc:
            raise TargetUnreachable(f"admin API at {self.admin_url} did not answer {method} {path}: {exc!r}") from exc
        if response.status_code == 403:
            raise FaultPermissionDenied(f"admin API at {self.admin_url} refused {method} {path}: {_message(response)}")
        if response.status_code >= 400:
            raise FaultError(f"admin API at {self.admin_url}: {method} {path} → {response.status_code}: "
                             f"{_message(response)}")
        return response.json()

    async def requests(self) -> list[dict[str, Any]]:
        """Live engine requests with their KV block counts."""
        body = await self._call("GET", "/requests")
        return list(body["requests"])

    async def state(self) -> dict[str, Any]:
        """Engine stats (running, waiting, KV blocks, preemptions, leaks) plus server facts."""
        return dict(await self._call("GET", "/state"))

    async def faults(self) -> dict[str, Any]:
        return dict((await self._call("GET", "/faults"))["faults"])

    async def set_fault(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        """Install (or replace) a hook fault; returns it as the admin API lists it."""
        return dict(await self._call("PUT", f"/faults/{quote(name, safe='')}", json=spec))

    async def clear_fault(self, name: str) -> bool:
        return bool((await self._call("DELETE", f"/faults/{quote(name, safe='')}"))["removed"])

    async def clear_all(self) -> int:
        return int((await self._call("DELETE", "/faults"))["removed"])

    async def renew_fault(self, name: str, ttl: float | None = None) -> dict[str, Any]:
        """Restart a hook fault's lease; ``FaultError`` (404) when it is gone."""
        return dict(await self._call("POST", f"/faults/{quote(name, safe='')}/renew", json=_ttl(ttl)))

    async def reserve(self, blocks: int, ttl: float | None = None) -> int:
        """Take up to ``blocks`` free KV blocks out of the pool under a lease of ``ttl`` s; the number taken."""
        return int((await self._call("POST", "/kv/reserve", json={"blocks": blocks, **_ttl(ttl)}))["reserved"])

    async def renew_reserve(self, ttl: float | None = None) -> dict[str, Any]:
        """Restart the KV reservation's lease; ``FaultError`` (404) when nothing is reserved."""
        return dict(await self._call("POST", "/kv/reserve/renew", json=_ttl(ttl)))

    async def release(self) -> int:
        """Return every reserved block to the pool; the number released."""
        return int((await self._call("DELETE", "/kv/reserve"))["released"])

    async def reset_prefix_cache(self) -> dict[str, int]:
        """Empty the engine's prefix cache: ``{"evicted": free cached blocks, "forgotten_held": held ones}``."""
        body = await self._call("POST", "/kv/reset_prefix_cache")
        return {"evicted": int(body["evicted"]), "forgotten_held": int(body["forgotten_held"])}


def admin_delete_sync(admin_url: str, path: str, token: str | None) -> dict[str, Any] | None:
    """``DELETE admin_url + path`` for a rollback in another process; None when the stack is gone.

    A stack that no longer answers has nothing left to undo: its hook faults and reservations
    went with it. Any other failure raises (``httpx.HTTPStatusError``), so rollback reports it.
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.delete(f"{admin_url.rstrip('/')}{path}", headers=headers, timeout=5.0, trust_env=False)
    except httpx.ConnectError:
        return None
    response.raise_for_status()
    return dict(response.json())
def _ttl(ttl: float | None) -> dict[str, float]:
    return {} if ttl is None else {"ttl": ttl}


class LeaseKeeper:
    """Renews what a fault set through the admin API while it is injected: ``start`` at inject,
    ``await stop()`` at revert. ``renew`` is one call on an open ``AdminClient``; a failed renewal is
    logged and retried at the next period (the lease outlives a few misses)."""

    def __init__(self, admin_url: str, token: str | None, renew: Callable[[AdminClient], Awaitable[Any]],
                 every: float = LEASE_RENEW_EVERY_S) -> None:
        self.admin_url, self.token, self.renew, self.every = admin_url, token, renew, every
        self.renewals = 0
        self.failures = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"lease-keeper {self.admin_url}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None or task.done():  # done: also a task whose loop has ended (asyncio.run cancels it)
            return
        self._stop.set()
        try:
            await asyncio.wait_for(task, self.every + 5.0)  # lets a renewal under way finish
        except (TimeoutError, asyncio.CancelledError):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        async with AdminClient(self.admin_url, self.token, timeout=max(1.0, self.every)) as admin:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.every)
                if self._stop.is_set():
                    return
                try:
                    await self.renew(admin)
                    self.renewals += 1
                except (FaultError, TargetUnreachable) as exc:
                    self.failures += 1
                    log.warning("renewing a lease at %s failed (%d so far): %s", self.admin_url, self.failures, exc)


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except Exception:  # noqa: BLE001 - any non-JSON answer is shown as text
        return response.text[:200]
