"""A small async client for the builtin stack's admin API (used by the server and KV faults).

Errors are translated at this boundary: a refused connection becomes ``TargetUnreachable``, a 403
``FaultPermissionDenied``, any other non-2xx answer ``FaultError`` carrying the server's message.
"""

from __future__ import annotations

from typing import Any, Self
from urllib.parse import quote

import httpx

from chaos.errors import FaultError, FaultPermissionDenied, TargetUnreachable

__all__ = ["AdminClient", "admin_delete_sync", "admin_url_of"]


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
        self._http = httpx.AsyncClient(base_url=self.admin_url, headers=headers, timeout=timeout, trust_env=False)

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
            raise FaultError(f"admin API at {self.admin_url}: {method} {path} → {response.status_code}: {_message(response)}")
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

    async def reserve(self, blocks: int) -> int:
        """Take up to ``blocks`` free KV blocks out of the pool; the number taken."""
        return int((await self._call("POST", "/kv/reserve", json={"blocks": blocks}))["reserved"])

    async def release(self) -> int:
        """Return every reserved block to the pool; the number released."""
        return int((await self._call("DELETE", "/kv/reserve"))["released"])


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


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except Exception:  # noqa: BLE001 - any non-JSON answer is shown as text
        return response.text[:200]
