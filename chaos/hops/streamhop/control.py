"""The hop's control API, on a loopback port of its own (HTTP/1.1 on h11, JSON both ways).

Every call needs ``Authorization: Bearer <token>``, compared in constant time; without it the answer
is 401 and nothing changes. Routes:

- ``GET /status`` → ``{"name", "listen", "upstream", "in_flight", "requests", "version", "rules": [...]}``
- ``GET /rules`` → ``{"rules": [...]}``
- ``PUT /rules/{rule}`` with ``{"kind", "params", "seed", "share"}`` → ``{"rule": {...}, "t_active": ns}``;
  a rule the hop cannot take → 400 ``{"error": "<one line>"}`` (an ``h2_*`` kind on a hop that does not
  speak HTTP/2 to its client among them). A rule of the same name is replaced.
- ``DELETE /rules/{rule}`` → ``{"removed", "t_removed", "acted_on", "request_ids", "details", "running"}``;
  ``running`` counts the requests it still acts on (a hold or silence under way finishes as planned).

Bounded: a request head of 16 KiB, a body of 64 KiB, ``CONTROL_TIMEOUT_S`` to send a whole request,
``MAX_CONTROL_CONNECTIONS`` connections at once.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from typing import Any, Protocol
from urllib.parse import unquote

import h11

from .rules import H2_KINDS, MAX_RULES, Rule, RuleError, parse_rule

__all__ = ["CONTROL_TIMEOUT_S", "MAX_CONTROL_CONNECTIONS", "ControlAPI", "serve_control"]

MAX_BODY = 64 * 1024
CONTROL_TIMEOUT_S = 10.0
MAX_CONTROL_CONNECTIONS = 64


class ControlledHop(Protocol):
    rules: dict[str, Rule]
    http2: bool  # it speaks HTTP/2 to its client: the h2_* kinds can act

    def status(self) -> dict[str, Any]: ...

    def log(self, message: str) -> None: ...

    def rules_changed(self) -> None:
        """A rule was put or removed: what acts on connections rather than requests acts now."""


class ControlAPI:
    """The routes, apart from the socket: ``handle`` → ``(status code, JSON body)``."""

    def __init__(self, hop: ControlledHop, token: str) -> None:
        self.hop = hop
        self._token = f"Bearer {token}".encode()

    def authorized(self, authorization: bytes | None) -> bool:
        return authorization is not None and hmac.compare_digest(authorization, self._token)

    def handle(self, method: str, path: str, authorization: bytes | None, body: bytes) -> tuple[int, dict[str, Any]]:
        if not self.authorized(authorization):
            return 401, {"error": "this call needs Authorization: Bearer <the hop's token>"}
        path = path.split("?", 1)[0]
        if path == "/status":
            return (200, self.hop.status()) if method == "GET" else _not_allowed(method, path)
        if path == "/rules":
            return (200, {"rules": [r.listing() for r in self.hop.rules.values()]}) if method == "GET" \
                else _not_allowed(method, path)
        if path.startswith("/rules/"):
            name = unquote(path[len("/rules/"):])
            if method == "PUT":
                return self._put(name, body)
            if method == "DELETE":
                return 200, self._delete(name)
            return _not_allowed(method, path)
        return 404, {"error": f"no route {path}"}

    def _put(self, name: str, body: bytes) -> tuple[int, dict[str, Any]]:
        try:
            parsed = json.loads(body) if body else None
        except ValueError as exc:
            return 400, {"error": f"the body is not JSON: {exc}"}
        rules = self.hop.rules
        try:
            if name not in rules and len(rules) >= MAX_RULES:
                raise RuleError(f"at most {MAX_RULES} rules at once")
            rule = parse_rule(name, parsed, time.monotonic_ns())
            if rule.kind in H2_KINDS and not self.hop.http2:
                raise RuleError(f"{rule.kind} acts on HTTP/2 streams and this hop speaks HTTP/1.1 to its client "
                                "(start it with --http 2)")
        except RuleError as exc:
            return 400, {"error": str(exc).splitlines()[0]}
        old = rules.pop(name, None)
        if old is not None:
            old.removed = True
        rules[name] = rule
        self.hop.log(f"rule {name}: {rule.kind} {json.dumps(rule.params)} seed {rule.seed} share {rule.share:g}")
        self.hop.rules_changed()
        return 200, {"rule": rule.listing(), "t_active": rule.t_active}

    def _delete(self, name: str) -> dict[str, Any]:
        now = time.monotonic_ns()
        rule = self.hop.rules.pop(name, None)
        if rule is None:
            return {"removed": False, "t_removed": now, "acted_on": 0, "request_ids": [], "details": {},
                    "running": 0}
        rule.removed = True
        self.hop.rules_changed()
        self.hop.log(f"rule {name} removed: acted on {rule.acted_on} requests, {rule.running} still running")
        return {"removed": True, "t_removed": now, "acted_on": rule.acted_on, "request_ids": list(rule.request_ids),
                "details": dict(rule.details), "running": rule.running}


def _not_allowed(method: str, path: str) -> tuple[int, dict[str, Any]]:
    return 405, {"error": f"{method} is not allowed on {path}"}


async def _read_request(conn: h11.Connection, reader: asyncio.StreamReader) -> tuple[h11.Request, bytes] | None:
    request: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(16384))
        elif type(event) is h11.Request:
            request = event
        elif type(event) is h11.Data:
            body += event.data
            if len(body) > MAX_BODY:
                raise ValueError("body too large")
        elif type(event) is h11.EndOfMessage and request is not None:
            return request, bytes(body)
        else:
            return None


def _respond(conn: h11.Connection, status: int, payload: dict[str, Any]) -> bytes:
    data = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    return b"".join(conn.send(e) or b"" for e in (h11.Response(status_code=status, headers=headers),
                                                  h11.Data(data=data), h11.EndOfMessage()))


async def serve_control(api: ControlAPI, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One control connection, request after request, until either side closes it."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=16384)
    try:
        while True:
            try:
                got = await asyncio.wait_for(_read_request(conn, reader), CONTROL_TIMEOUT_S)
            except ValueError:
                writer.write(_respond(conn, 413, {"error": f"a control body is at most {MAX_BODY} bytes"}))
                return
            if got is None:
                return
            request, body = got
            auth = next((bytes(v) for k, v in request.headers if k == b"authorization"), None)
            status, payload = api.handle(request.method.decode(), request.target.decode("latin-1"), auth, body)
            writer.write(_respond(conn, status, payload))
            await writer.drain()
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()
    except (h11.ProtocolError, OSError, TimeoutError):
        return
    finally:
        writer.close()
