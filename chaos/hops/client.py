"""The stream hop's control API as the stream faults and the runner speak it (``chaos.hops.streamhop.control``).

Every call is bounded by ``timeout`` seconds and goes straight to the hop (``trust_env=False``: no proxy
from the environment ever sees the token). Failures are translated here: a hop that does not answer, a
refused token (401) or a refused rule (400, with the hop's one-line reason) become ``FaultError`` with a
one-line message naming the hop and the call.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

from chaos.host.tls import tls_context
from chaos.model.errors import FaultError

__all__ = ["CONTROL_TIMEOUT_S", "StreamHopAPI"]

CONTROL_TIMEOUT_S = 5.0  # seconds a control call may take; the hop answers at once or not at all


def _reason(response: httpx.Response) -> str:
    """The hop's one-line reason (``{"error": ...}``), else the body's first line."""
    try:
        body = response.json()
    except ValueError:
        body = None
    text = str((body.get("error") if isinstance(body, dict) else None) or response.text or response.reason_phrase)
    lines = text.strip().splitlines()
    return lines[0][:300] if lines else "no reason given"


class StreamHopAPI:
    """``StreamHopAPI("http://127.0.0.1:Q", token)``: rules put and deleted, the hop's status."""

    def __init__(self, control_url: str, token: str, timeout: float = CONTROL_TIMEOUT_S) -> None:
        self.control_url = control_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self.timeout = timeout

    def __repr__(self) -> str:  # the token stays out of logs and tracebacks
        return f"StreamHopAPI({self.control_url!r})"

    def _check(self, method: str, path: str, response: httpx.Response) -> dict[str, Any]:
        if response.status_code == 401:
            raise FaultError(f"stream hop at {self.control_url} refused the token for {method} {path} (401)")
        if response.status_code >= 400:
            raise FaultError(f"stream hop at {self.control_url}: {method} {path} → {response.status_code}: "
                             f"{_reason(response)}")
        try:
            body = response.json()
        except ValueError as exc:
            raise FaultError(f"stream hop at {self.control_url}: {method} {path} answered no JSON") from exc
        if not isinstance(body, dict):
            raise FaultError(f"stream hop at {self.control_url}: {method} {path} answered no JSON object")
        return body

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            async with httpx.AsyncClient(timeout=self.timeout, trust_env=False, verify=tls_context()) as client:
                response = await client.request(method, self.control_url + path, json=body, headers=self._headers)
        except httpx.HTTPError as exc:
            raise FaultError(f"stream hop at {self.control_url} did not answer {method} {path}: "
                             f"{type(exc).__name__}: {exc}".splitlines()[0]) from exc
        return self._check(method, path, response)

    async def put_rule(self, rule: str, kind: str, params: dict[str, Any], *, seed: int,
                       share: float = 1.0) -> dict[str, Any]:
        """Put (or replace) a rule; the hop's answer: ``{"rule": {...}, "t_active": ns}``."""
        body = {"kind": kind, "params": params, "seed": seed, "share": share}
        return await self._call("PUT", f"/rules/{quote(rule, safe='')}", body)

    async def delete_rule(self, rule: str) -> dict[str, Any]:
        """Remove a rule; its evidence: ``removed``, ``t_removed``, ``acted_on``, ``request_ids``, ``details``."""
        return await self._call("DELETE", f"/rules/{quote(rule, safe='')}")

    def delete_rule_sync(self, rule: str) -> dict[str, Any]:
        """``delete_rule`` for a rollback outside any event loop."""
        path = f"/rules/{quote(rule, safe='')}"
        try:
            response = httpx.delete(self.control_url + path, headers=self._headers, timeout=self.timeout,
                                    trust_env=False, verify=tls_context())
        except httpx.HTTPError as exc:
            raise FaultError(f"stream hop at {self.control_url} did not answer DELETE {path}: "
                             f"{type(exc).__name__}: {exc}".splitlines()[0]) from exc
        return self._check("DELETE", path, response)

    async def status(self) -> dict[str, Any]:
        """``{"name", "listen", "upstream", "in_flight", "requests", "version", "rules"}``."""
        return await self._call("GET", "/status")

    async def rules(self) -> list[dict[str, Any]]:
        return list((await self._call("GET", "/rules"))["rules"])
