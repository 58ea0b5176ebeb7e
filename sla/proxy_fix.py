"""Which hop buffers the streams, from what the response headers reveal, and that hop's own fix.

- ``Server: nginx...``: nginx rewrites the upstream's Server header with its own. With
  ``Content-Encoding`` set it is compressing the stream, and its gzip filter holds the events until
  a buffer fills (measured, nginx 1.22: a 64-token stream in one read); otherwise it is
  ``proxy_buffering`` (or HTTP/1.0 to the upstream with the upstream's X-Accel-Buffering ignored).
- ``Server: Caddy`` or a ``Via`` naming Caddy: ``reverse_proxy``'s ``flush_interval -1``.
- No Server header, or the upstream's own (HAProxy passes it through and adds none; so do most
  gateways): not provable from the headers, so both common culprits are named: HAProxy's
  ``option http-no-delay`` (its defaults deliver SSE in ~200 ms bursts) and nginx's settings.

Pure functions.
"""

from __future__ import annotations

__all__ = ["buffering_fix", "proxy_name"]

_NGINX = ("proxy_buffering off (or let the upstream's X-Accel-Buffering: no through, "
          "with proxy_http_version 1.1)")
_NGINX_GZIP = "gzip off for text/event-stream (drop it from gzip_types), or proxy_buffering off"
_HAPROXY = "option http-no-delay"
_CADDY = "flush_interval -1 in reverse_proxy"


def proxy_name(server: str | None, via: str | None) -> str | None:
    """``nginx``, ``caddy`` or ``haproxy`` when a header names it; None when none does."""
    told = f"{server or ''} {via or ''}".lower()
    for name in ("nginx", "caddy", "haproxy"):
        if name in told:
            return name
    return None


def buffering_fix(server: str | None, via: str | None, content_encoding: str | None) -> str:
    """One clause naming the buffering hop (as far as the headers tell) and its own fix."""
    name = proxy_name(server, via)
    compressed = content_encoding is not None and content_encoding.strip().lower() not in ("", "identity")
    shown = f"Server: {server}" if server else f"Via: {via}" if via else ""
    if name == "nginx":
        if compressed:
            return (f"nginx is in the path ({shown}) and compresses the stream (Content-Encoding: {content_encoding}), "
                    f"holding it while it does: set {_NGINX_GZIP}")
        return f"nginx is in the path ({shown}): set {_NGINX}"
    if name == "caddy":
        return f"Caddy is in the path ({shown}): set {_CADDY}"
    if name == "haproxy":
        return f"HAProxy is in the path ({shown}): set {_HAPROXY}"
    if compressed:
        return (f"a hop in front compresses the stream (Content-Encoding: {content_encoding}) and holds it while it "
                "does: turn compression off for text/event-stream (nginx: gzip off for text/event-stream)")
    told = f" (the response names no proxy{'; ' + shown if shown else ''})"
    return (f"a proxy in front{told}: HAProxy: {_HAPROXY}; nginx: {_NGINX}; Caddy: {_CADDY}; "
            "or a gateway that collects responses")
