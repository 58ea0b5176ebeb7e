"""Toxiproxy's HTTP API (API-compatible with Toxiproxy 2.12.0) on a minimal asyncio HTTP/1.1 server.

Reply bytes follow the real server: gorilla/mux routing (exact paths, 404 ``404 page not found``
and empty 405 without the request-id header), ``X-Toxiproxy-Request-Id`` on routed replies, the
``Mozilla/`` 403, errors as ``{"error":...,"status":...}`` plus a newline labelled ``text/plain``
(``/populate`` errors differ), Go ``encoding/json`` request decoding (first value only, trailing
garbage ignored, case-insensitive keys, last duplicate wins, null keeps the default, a wrong type
is a 400), compact JSON replies, toxicity printed as a float32.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import re
import struct
import time
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from .guard import fixed_addresses, refusal
from .limits import MAX_PROXIES, MAX_TOXICS, Limits, check_address, check_name
from .proxy import ApiError, Proxy, not_found, resolved_string
from .toxics import TOXICS, ToxicSpec

if TYPE_CHECKING:  # pragma: no cover
    from .server import EmbeddedToxiproxy

VERSION = "2.12.0"

REASONS = {
    200: "OK",
    201: "Created",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
TIMEOUT_PAGE = b"<html><head><title>Timeout</title></head><body><h1>Timeout</h1></body></html>"
HANDLER_TIMEOUT = 25.0
IDLE_TIMEOUT = 60.0
READ_TIMEOUT = 15.0
MAX_HEADER = 1 << 20
INT64 = 1 << 63

# -- request ids (xid: 12 bytes, base32hex lowercase, 20 characters) --------------------------
_XID_ALPHABET = "0123456789abcdefghijklmnopqrstuv"
_xid_counter = int.from_bytes(os.urandom(3), "big")
_xid_machine = os.urandom(3)


def new_request_id() -> str:
    global _xid_counter
    _xid_counter = (_xid_counter + 1) & 0xFFFFFF
    raw = (
        struct.pack(">I", int(time.time()) & 0xFFFFFFFF)
        + _xid_machine
        + struct.pack(">H", os.getpid() & 0xFFFF)
        + _xid_counter.to_bytes(3, "big")
    )
    n = int.from_bytes(raw, "big") << 4  # 96 bits -> 100 bits, 20 groups of 5
    return "".join(_XID_ALPHABET[(n >> (5 * (19 - i))) & 31] for i in range(20))


# -- JSON, Go style -------------------------------------------------------------------------
class Obj(list):  # type: ignore[type-arg]
    """A decoded JSON object as its (key, value) pairs, so keys can be matched like Go's."""


def _no_constants(name: str) -> Any:
    raise ValueError(f"invalid character '{name[0]}' looking for beginning of value")


_decoder = json.JSONDecoder(object_pairs_hook=Obj, parse_constant=_no_constants)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _go_strings(value: Any) -> Any:
    """Lone UTF-16 surrogates (``"\\ud800"``) become U+FFFD, as Go's decoder makes them; a Python
    str holding one cannot be encoded again and failed the reply with a 500."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, Obj):
        return Obj((_go_strings(k), _go_strings(v)) for k, v in value)
    if isinstance(value, list):
        return [_go_strings(v) for v in value]
    return value


def decode_body(body: bytes) -> Any:
    text = body.decode("utf-8", errors="replace").lstrip(" \t\r\n")
    if not text:
        raise ApiError(400, "bad request body: EOF")
    try:
        value, _ = _decoder.raw_decode(text)
        return _go_strings(value)
    except json.JSONDecodeError as e:
        if e.pos >= len(text):
            msg = "unexpected EOF"
        else:
            msg = f"invalid character {text[e.pos]!r} looking for beginning of value"
        raise ApiError(400, f"bad request body: {msg}") from None
    except RecursionError:  # Go stops at 10,000 levels with this message; Python's decoder near 1,000
        raise ApiError(400, "bad request body: exceeded max depth") from None
    except ValueError as e:
        raise ApiError(400, f"bad request body: {e}") from None


def _json_kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, Obj):
        return "object"
    return "array"


def _type_error(v: Any, where: str, gotype: str) -> str:
    kind = _json_kind(v)
    if kind == "number":
        kind = f"number {v}"
    gotype = gotype.split("=", 1)[-1]  # "object=toxics.NoopToxic": a struct, named as Go names it
    return f"json: cannot unmarshal {kind} into Go struct field {where} of type {gotype}"


def _coerce(v: Any, kind: str) -> tuple[bool, Any]:
    if kind == "string":
        return isinstance(v, str), v
    if kind == "bool":
        return isinstance(v, bool), v
    if kind == "int64":
        ok = isinstance(v, int) and not isinstance(v, bool) and -INT64 <= v < INT64
        return ok, v
    if kind == "float32":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False, v
        f = float(v)
        if abs(f) > 3.4028234663852886e38:
            return False, v
        return True, struct.unpack("<f", struct.pack("<f", f))[0]
    if kind.startswith("object"):
        return isinstance(v, Obj), v
    raise AssertionError(kind)


def decode_struct(value: Any, fields: dict[str, str], struct_name: str,
                  where: str | None = None) -> tuple[dict[str, Any], str | None]:
    """Go's decode of a JSON value into a struct: (fields set, first type error or None).

    ``where``: the field path's prefix Go names in a type error (default: the struct's own name).
    """
    if value is None:
        return {}, None
    if not isinstance(value, Obj):
        return {}, f"json: cannot unmarshal {_json_kind(value)} into Go value of type {struct_name}"
    out: dict[str, Any] = {}
    err: str | None = None
    lower = {f.lower(): f for f in fields}
    for key, v in value:
        f = key if key in fields else lower.get(key.lower())
        if f is None or v is None:
            continue
        ok, cv = _coerce(v, fields[f])
        if ok:
            out[f] = cv
        elif err is None:
            err = _type_error(v, f"{where or struct_name.rsplit('.', 1)[-1]}.{f}", fields[f])
    return out, err


def go_json(v: Any) -> str:
    s = json.dumps(v, separators=(",", ":"), ensure_ascii=False)
    return (
        s.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def format_float32(x: float) -> str:
    """Go's strconv.FormatFloat(f, 'f' or 'e', -1, 32) for a float32 value."""
    if x == 0:
        return "0"
    for p in range(1, 10):
        s = f"{x:.{p}g}"
        if struct.unpack("<f", struct.pack("<f", float(s)))[0] == x:
            break
    a = abs(x)
    if a < 1e-6 or a >= 1e21:
        m, _, e = s.partition("e")
        exp = int(e)
        return f"{m}e{'+' if exp >= 0 else '-'}{abs(exp):02d}"
    d = format(Decimal(s), "f")
    if "." in d:
        d = d.rstrip("0").rstrip(".")
    return d


def toxic_json(t: ToxicSpec) -> str:
    return (
        f'{{"attributes":{go_json(t.attrs)},"name":{go_json(t.name)},"type":{go_json(t.type)},'
        f'"stream":{go_json(t.stream)},"toxicity":{format_float32(t.toxicity)}}}'
    )


def proxy_json(p: Proxy) -> str:
    toxics = ",".join(toxic_json(t) for t in p.ordered_toxics())
    return (
        f'{{"name":{go_json(p.name)},"listen":{go_json(p.listen)},'
        f'"upstream":{go_json(p.upstream)},"enabled":{"true" if p.enabled else "false"},'
        f'"Logger":{{}},"toxics":[{toxics}]}}'
    )


PROXY_FIELDS = {"name": "string", "listen": "string", "upstream": "string", "enabled": "bool"}
TOXIC_FIELDS = {
    "name": "string",
    "type": "string",
    "stream": "string",
    "toxicity": "float32",
    # Toxiproxy decodes a new toxic's wrapper first with a NoopToxic in it (toxic_collection.go
    # AddToxicJson), so a wrong-typed `attributes` is reported against toxics.NoopToxic (2.12.0, measured)
    "attributes": "object=toxics.NoopToxic",
}
# The Go struct of each toxic type: a wrong-typed attribute is reported as
# "Go struct field LatencyToxic.attributes.latency of type int64" (2.12.0, measured).
GO_TOXIC = {"noop": "NoopToxic", "latency": "LatencyToxic", "bandwidth": "BandwidthToxic",
            "slow_close": "SlowCloseToxic", "timeout": "TimeoutToxic", "reset_peer": "ResetToxic",
            "slicer": "SlicerToxic", "limit_data": "LimitDataToxic", "buffer": "BufferToxic"}
UPDATE_FIELDS = {"attributes": "object", "toxicity": "float32"}


class Reply:
    __slots__ = ("body", "ctype", "nosniff", "routed", "status")

    def __init__(
        self,
        status: int,
        body: bytes = b"",
        ctype: str | None = "application/json",
        routed: bool = True,
        nosniff: bool = False,
    ) -> None:
        self.status, self.body, self.ctype, self.routed, self.nosniff = (
            status,
            body,
            ctype,
            routed,
            nosniff,
        )


def ok(status: int, text: str) -> Reply:
    return Reply(status, text.encode())


def error_reply(status: int, message: str) -> Reply:
    body = go_json({"error": message, "status": status}) + "\n"
    return Reply(status, body.encode(), "text/plain; charset=utf-8", nosniff=True)


NO_CONTENT = Reply(204, b"", None)


def check_proxy_fields(f: dict[str, Any]) -> None:
    """Bounded names and addresses (real Toxiproxy keeps whatever it is sent)."""
    if "name" in f:
        check_name("proxy", f["name"])
    for key in ("listen", "upstream"):
        if key in f:
            check_address(key, f[key])


# -- the API --------------------------------------------------------------------------------
class Api:
    def __init__(self, server: EmbeddedToxiproxy) -> None:
        self.server = server
        self.lock = asyncio.Lock()

    @property
    def proxies(self) -> dict[str, Proxy]:
        return self.server.proxies

    def route(self, method: str, path: str) -> tuple[Any, tuple[str, ...]] | Reply:
        segs = path.split("/")
        table: dict[str, Any]
        args: tuple[str, ...] = ()
        if path == "/version":
            table = {"GET": self.version}
        elif path == "/proxies":
            table = {"GET": self.list_proxies, "POST": self.create_proxy}
        elif path == "/populate":
            table = {"POST": self.populate}
        elif path == "/reset":
            table = {"POST": self.reset}
        elif len(segs) == 3 and segs[1] == "proxies" and segs[2]:
            args = (segs[2],)
            table = {
                "GET": self.get_proxy,
                "POST": self.update_proxy,
                "PATCH": self.update_proxy,
                "DELETE": self.delete_proxy,
            }
        elif len(segs) == 4 and segs[1] == "proxies" and segs[2] and segs[3] == "toxics":
            args = (segs[2],)
            table = {"GET": self.list_toxics, "POST": self.create_toxic}
        elif len(segs) == 5 and segs[1] == "proxies" and segs[2] and segs[3] == "toxics" and segs[4]:
            args = (segs[2], segs[4])
            table = {
                "GET": self.get_toxic,
                "POST": self.update_toxic,
                "PATCH": self.update_toxic,
                "DELETE": self.delete_toxic,
            }
        else:
            return Reply(404, b"404 page not found\n", "text/plain; charset=utf-8", False, True)
        handler = table.get(method)
        if handler is None:
            return Reply(405, b"", None, routed=False)
        return handler, args

    async def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        r = self.route(method, path)
        if isinstance(r, Reply):
            return r
        if headers.get("user-agent", "").startswith("Mozilla/"):
            return Reply(403, b"User agent not allowed\n", "text/plain; charset=utf-8", nosniff=True)
        refused = refusal(self.server.token, path, headers)  # a run's server: only the run's token
        if refused is not None:
            return error_reply(*refused)
        handler, args = r
        try:
            async with self.lock:
                return await asyncio.wait_for(handler(body, *args), HANDLER_TIMEOUT)
        except ApiError as e:
            return error_reply(e.status, e.message)
        except TimeoutError:
            return Reply(503, TIMEOUT_PAGE, "text/html; charset=utf-8")
        except Exception as e:  # noqa: BLE001 - never crash: report like Go's 500
            return error_reply(500, f"{type(e).__name__}: {e}")

    def _proxy(self, name: str) -> Proxy:
        p = self.proxies.get(name)
        if p is None:
            raise not_found()
        return p

    @staticmethod
    def _toxic(p: Proxy, name: str) -> ToxicSpec:
        for t in p.toxics:
            if t.name == name:
                return t
        raise ApiError(404, "toxic not found")

    # -- handlers ------------------------------------------------------------------------
    async def version(self, body: bytes) -> Reply:
        return Reply(200, f'{{"version": "{VERSION}"}}\n'.encode(), "application/json;charset=utf-8")

    async def list_proxies(self, body: bytes) -> Reply:
        items = ",".join(f"{go_json(n)}:{proxy_json(self.proxies[n])}" for n in sorted(self.proxies))
        return ok(200, "{" + items + "}")

    async def create_proxy(self, body: bytes) -> Reply:
        f, err = decode_struct(decode_body(body), PROXY_FIELDS, "toxiproxy.Proxy")
        if err:
            raise ApiError(400, f"bad request body: {err}")
        name, upstream = f.get("name", ""), f.get("upstream", "")
        if not name:
            raise ApiError(400, "missing required field: name")
        if not upstream:
            raise ApiError(400, "missing required field: upstream")
        check_proxy_fields(f)
        if name in self.proxies:
            raise ApiError(409, "proxy already exists")
        if len(self.proxies) >= MAX_PROXIES:
            raise ApiError(400, f"too many proxies: at most {MAX_PROXIES}")
        p = Proxy(self.server, name, f.get("listen", ""), upstream)
        if f.get("enabled", True):
            await p.start()
        self.proxies[name] = p
        return ok(201, proxy_json(p))

    def _populate_items(self, body: bytes) -> list[dict[str, Any]]:
        """The proxies a ``POST /populate`` body names, each checked as the real server checks it."""
        value = decode_body(body)
        if value is not None and (isinstance(value, (Obj, str, bool, int, float))):
            raise ApiError(
                400,
                f"bad request body: json: cannot unmarshal {_json_kind(value)} into Go value "
                "of type []struct { proxy.Proxy; Enabled *bool }",
            )
        items = []
        for v in value or []:
            f, err = decode_struct(v, PROXY_FIELDS, "proxy.Proxy")
            if err:
                raise ApiError(400, f"bad request body: {err}")
            items.append(f)
        for i, f in enumerate(items, 1):
            if not f.get("name"):
                raise ApiError(400, f"missing required field: name at proxy {i}")
            if not f.get("upstream"):
                raise ApiError(400, f"missing required field: upstream at proxy {i}")
            check_proxy_fields(f)
        if len(set(self.proxies) | {f["name"] for f in items}) > MAX_PROXIES:
            raise ApiError(400, f"too many proxies: at most {MAX_PROXIES}")
        return items

    async def populate(self, body: bytes) -> Reply:
        try:
            items = self._populate_items(body)
        except ApiError as e:
            return self._populate_error(e, None)
        done: list[Proxy] = []
        for f in items:
            name, listen, upstream = f["name"], f.get("listen", ""), f["upstream"]
            existing = self.proxies.get(name)
            if existing is not None:
                try:
                    same = existing.listen == resolved_string(listen) and existing.upstream == upstream
                except ValueError:
                    same = False
                if same:
                    done.append(existing)
                    continue
                if self.server.token is not None:  # a run's server: its proxies stay where the run put them
                    return self._populate_error(ApiError(403, fixed_addresses(name)), done)
                existing.stop()
            p = Proxy(self.server, name, listen, upstream)
            if f.get("enabled", True):
                try:
                    await p.start()
                except ApiError as e:
                    return self._populate_error(e, done)
            self.proxies[name] = p
            done.append(p)
        if not done:
            return ok(201, '{"proxies":null}')
        return ok(201, '{"proxies":[' + ",".join(proxy_json(p) for p in done) + "]}")

    @staticmethod
    def _populate_error(e: ApiError, done: list[Proxy] | None) -> Reply:
        plist = "null" if not done else "[" + ",".join(proxy_json(p) for p in done) + "]"
        text = f'{{"error":{go_json(e.message)},"status":{e.status},"proxies":{plist}}}'
        return ok(e.status, text)

    async def reset(self, body: bytes) -> Reply:
        for p in list(self.proxies.values()):
            if not p.enabled:
                await p.start()
            for t in list(p.toxics):
                p.remove_toxic(t)
        return NO_CONTENT

    async def get_proxy(self, body: bytes, name: str) -> Reply:
        return ok(200, proxy_json(self._proxy(name)))

    async def update_proxy(self, body: bytes, name: str) -> Reply:
        p = self._proxy(name)
        f, err = decode_struct(decode_body(body), PROXY_FIELDS, "toxiproxy.Proxy")
        if err:
            raise ApiError(400, f"bad request body: {err}")
        check_proxy_fields(f)
        listen = f.get("listen", p.listen)
        upstream = f.get("upstream", p.upstream)
        enabled = f.get("enabled", p.enabled)
        try:
            new_listen = resolved_string(listen)
        except ValueError as e:
            raise ApiError(500, str(e)) from None
        if new_listen != p.listen or upstream != p.upstream:
            if self.server.token is not None:  # a run's server: never moved, by the run or anyone else
                raise ApiError(403, fixed_addresses(name))
            p.stop()
            p.listen, p.upstream = listen, upstream
        if enabled != p.enabled:
            if enabled:
                await p.start()
            else:
                p.stop()
        return ok(200, proxy_json(p))

    async def delete_proxy(self, body: bytes, name: str) -> Reply:
        p = self._proxy(name)
        p.stop()
        del self.proxies[name]
        return NO_CONTENT

    async def list_toxics(self, body: bytes, name: str) -> Reply:
        p = self._proxy(name)
        return ok(200, "[" + ",".join(toxic_json(t) for t in p.ordered_toxics()) + "]")

    async def create_toxic(self, body: bytes, name: str) -> Reply:
        p = self._proxy(name)
        value = decode_body(body)
        f, err = decode_struct(value, TOXIC_FIELDS, "toxics.ToxicWrapper")
        if err:
            raise ApiError(400, f"bad request body: {err}")
        stream = f.get("stream", "downstream")
        direction = stream.lower()
        if direction not in ("upstream", "downstream"):
            raise ApiError(400, "stream was invalid, can be either upstream or downstream")
        ttype = f.get("type", "")
        tname = f.get("name") or f"{ttype}_{stream}"
        impl = TOXICS.get(ttype)
        if impl is None:
            raise ApiError(400, "invalid toxic type")
        check_name("toxic", tname)
        if any(t.name == tname for t in p.toxics):
            raise ApiError(409, "toxic already exists")
        if len(p.toxics) >= MAX_TOXICS:
            raise ApiError(400, f"too many toxics on proxy {p.name}: at most {MAX_TOXICS}")
        attrs = {k: 0 for k in impl.ATTRS}
        got, err = decode_struct(f.get("attributes"), {k: "int64" for k in impl.ATTRS}, f"toxics.{ttype}",
                                 where=f"{GO_TOXIC.get(ttype, ttype)}.attributes")
        if err:
            raise ApiError(400, f"bad request body: {err}")
        attrs.update(got)
        bad = impl.validate(attrs)
        if bad:
            raise ApiError(400, bad)
        spec = ToxicSpec(tname, ttype, stream, direction, f.get("toxicity", 1.0), attrs)
        p.add_toxic(spec)
        return ok(200, toxic_json(spec))

    async def get_toxic(self, body: bytes, name: str, tname: str) -> Reply:
        p = self._proxy(name)
        return ok(200, toxic_json(self._toxic(p, tname)))

    async def update_toxic(self, body: bytes, name: str, tname: str) -> Reply:
        p = self._proxy(name)
        t = self._toxic(p, tname)
        value = decode_body(body)
        f, err = decode_struct(value, UPDATE_FIELDS, "struct { Attributes interface {}; Toxicity float32 }")
        got, err2 = decode_struct(f.get("attributes"), {k: "int64" for k in t.impl.ATTRS}, f"toxics.{t.type}",
                                  where=f"{GO_TOXIC.get(t.type, t.type)}.attributes")
        merged = dict(t.attrs)
        merged.update(got)
        bad = t.impl.validate(merged)
        if bad:
            raise ApiError(400, bad)
        t.attrs.update(got)  # like Go: valid attributes land even when another one is wrong
        if err or err2:
            raise ApiError(400, f"bad request body: {err or err2}")
        if "toxicity" in f:
            t.toxicity = f["toxicity"]
        p.update_toxic(t)
        return ok(200, toxic_json(t))

    async def delete_toxic(self, body: bytes, name: str, tname: str) -> Reply:
        p = self._proxy(name)
        p.remove_toxic(self._toxic(p, tname))
        return NO_CONTENT


# -- HTTP/1.1 ---------------------------------------------------------------------------------
def render(reply: Reply, close: bool) -> bytes:
    headers: list[tuple[str, str]] = []
    if reply.status != 204:
        headers.append(("Content-Length", str(len(reply.body))))
    if reply.ctype:
        headers.append(("Content-Type", reply.ctype))
    headers.append(("Date", email.utils.formatdate(usegmt=True)))
    if reply.nosniff:
        headers.append(("X-Content-Type-Options", "nosniff"))
    if reply.routed:
        headers.append(("X-Toxiproxy-Request-Id", new_request_id()))
    if close:
        headers.append(("Connection", "close"))
    head = f"HTTP/1.1 {reply.status} {REASONS.get(reply.status, '')}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in sorted(headers)) + "\r\n"
    return head.encode("latin-1") + reply.body


class Refused(Exception):
    """A request the server will not take (a full body budget): 503 and close."""


async def _read_request(
    reader: asyncio.StreamReader, limits: Limits, held: list[int]
) -> tuple[str, str, str, dict[str, str], bytes] | None:
    """One request, or None at EOF. Waits ``IDLE_TIMEOUT`` for its first byte; from there the whole
    request (line, headers, body) must arrive within ``limits.request_timeout`` (a slowloris client
    sending a byte now and then is cut off). Body bytes are taken from the server-wide budget and
    added to ``held[0]``, for the caller to release."""
    first = await asyncio.wait_for(reader.read(1), IDLE_TIMEOUT)
    if not first:
        return None
    async with asyncio.timeout(limits.request_timeout):
        return await _read_rest(first, reader, limits, held)


async def _read_rest(
    first: bytes, reader: asyncio.StreamReader, limits: Limits, held: list[int]
) -> tuple[str, str, str, dict[str, str], bytes] | None:
    line = first + await reader.readline()
    while line in (b"\r\n", b"\n"):
        line = await reader.readline()
    if not line:
        return None
    if len(line) > MAX_HEADER:
        raise ValueError("request line too long")
    parts = line.decode("latin-1").strip().split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ValueError("bad request line")
    method, target, version = parts
    headers = await _read_headers(reader)
    body = b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader, limits, held)
    elif "content-length" in headers:
        n = int(headers["content-length"])
        if n < 0 or n > limits.max_body:
            raise ValueError("bad content-length")
        _take(limits, held, n)
        body = await reader.readexactly(n)
    return method, target, version, headers, body


async def _read_headers(reader: asyncio.StreamReader) -> dict[str, str]:
    """The header block, names lower-cased, repeated ones joined with ", "; at most MAX_HEADER bytes."""
    headers: dict[str, str] = {}
    size = 0
    while True:
        h = await reader.readline()
        size += len(h)
        if size > MAX_HEADER:
            raise ValueError("headers too large")
        if h in (b"\r\n", b"\n", b""):
            return headers
        k, sep, v = h.decode("latin-1").partition(":")
        if not sep:
            raise ValueError("bad header")
        k = k.strip().lower()
        headers[k] = headers[k] + ", " + v.strip() if k in headers else v.strip()


async def _read_chunked(reader: asyncio.StreamReader, limits: Limits, held: list[int]) -> bytes:
    """A chunked body within the body budget (trailers read and dropped)."""
    chunks: list[bytes] = []
    while True:
        sz = int((await reader.readline()).split(b";")[0], 16)
        if sz == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(chunks)
        if sz < 0 or held[0] + sz > limits.max_body:
            raise ValueError("body too large")
        _take(limits, held, sz)
        chunks.append(await reader.readexactly(sz))
        await reader.readline()


def _take(limits: Limits, held: list[int], n: int) -> None:
    if not limits.reserve(n):
        raise Refused("body budget exhausted")
    held[0] += n


BAD_REQUEST = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n\r\n400 Bad Request"
)
UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 24\r\nConnection: close\r\n\r\n503 Service Unavailable\n"
)


async def refuse_connection(writer: asyncio.StreamWriter) -> None:
    """Past the connection cap: a 503 and close, without reading the request."""
    try:
        writer.write(UNAVAILABLE)
        await asyncio.wait_for(writer.drain(), 1.0)
    except (ConnectionError, TimeoutError):
        pass
    finally:
        writer.close()


async def serve_connection(api: Api, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    limits = api.server.limits
    try:
        while True:
            held = [0]
            try:
                try:
                    req = await _read_request(reader, limits, held)
                except (ValueError, asyncio.IncompleteReadError):
                    writer.write(BAD_REQUEST)
                    break
                except Refused:
                    writer.write(UNAVAILABLE)
                    break
                except (TimeoutError, ConnectionError):
                    break
                if req is None:
                    break
                method, target, version, headers, body = req
                conn_hdr = headers.get("connection", "").lower()
                close = "close" in conn_hdr or (version == "HTTP/1.0" and "keep-alive" not in conn_hdr)
                path = target.split("?", 1)[0]
                if path.startswith(("http://", "https://")):
                    path = "/" + path.split("/", 3)[-1] if path.count("/") >= 3 else "/"
                reply = await api.handle(method, unquote(path), headers, body)
                del body, req
            finally:
                limits.release(held[0])
            writer.write(render(reply, close))
            await asyncio.wait_for(writer.drain(), limits.request_timeout)
            if close:
                break
    except (ConnectionError, TimeoutError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:  # noqa: BLE001, S110  # pragma: no cover
            pass
