"""Which hop buffers the streams, from what the response headers reveal, and that hop's own fix.

- ``Server: nginx...``: nginx rewrites the upstream's Server header with its own. With
  ``Content-Encoding`` set the stream is compressed, and a gzip filter holds the events until a
  buffer fills (measured, nginx 1.22: a 64-token stream in one read); otherwise it is
  ``proxy_buffering`` (or HTTP/1.0 to the upstream with the upstream's X-Accel-Buffering ignored).
- ``Server: Caddy`` or a ``Via`` naming Caddy: ``reverse_proxy``'s ``flush_interval -1``.
- No Server header, or the upstream's own (HAProxy passes it through and adds none; so do most
  gateways): not provable from the headers, so both common culprits are named: HAProxy's
  ``option http-no-delay`` (its defaults deliver SSE in ~200 ms bursts) and nginx's settings.

The headers alone cannot tell who compressed a stream (nginx does not compress a response that is
already encoded, and passes the origin's ``Content-Encoding`` on) nor whether nginx buffers. What the
run knows beyond them (``PathFacts``) keeps the advice from claiming what was not seen: the
configuration of an nginx hop the run started itself (``proxy_buffering off``, ``gzip on``), a
``X-Accel-Buffering: no`` on the responses (nginx does not buffer those unless told to ignore it), a
stream hop whose taps saw the response arrive already compressed (the origin, or a hop behind it,
compressed it), or a run whose path has no hop that compresses (the target's own answer was).

Pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PathFacts", "buffering_fix", "proxy_name"]

_NGINX = ("proxy_buffering off (or let the upstream's X-Accel-Buffering: no through, "
          "with proxy_http_version 1.1)")
_NGINX_GZIP = "gzip off for text/event-stream (drop it from gzip_types), or proxy_buffering off"
_HAPROXY = "option http-no-delay"
_CADDY = "flush_interval -1 in reverse_proxy"
_ORIGIN_GZIP = ("turn its compression off for text/event-stream (a gzip middleware must skip event streams, "
                "or flush each event)")


@dataclass(frozen=True)
class PathFacts:
    """What the run knows of its path beyond the response headers (each None/False: not known).

    ``nginx_config``: the configuration text of an nginx hop this run started. ``accel_off``: the
    held responses carried ``X-Accel-Buffering: no``. ``compressed_behind``: who compressed the
    stream, as a stream hop's taps saw it (e.g. "the origin server (seen at stream hop inner)").
    ``no_compressing_hop``: the run's path has no hop that compresses (none, or only stream hops and
    Toxiproxy): a compressed answer is the target's own.
    """

    nginx_config: str | None = None
    accel_off: bool = False
    compressed_behind: str | None = None
    no_compressing_hop: bool = False


def proxy_name(server: str | None, via: str | None) -> str | None:
    """``nginx``, ``caddy`` or ``haproxy`` when a header names it; None when none does."""
    told = f"{server or ''} {via or ''}".lower()
    for name in ("nginx", "caddy", "haproxy"):
        if name in told:
            return name
    return None


def _directive(config: str, line: str) -> bool:
    """Whether an nginx configuration has ``line`` (e.g. ``gzip on;``) on a line of its own."""
    return any(part.strip() == line for part in config.splitlines())


def _nginx_gzip(shown: str, encoding: str, facts: PathFacts) -> str:
    if facts.nginx_config is not None and not _directive(facts.nginx_config, "gzip on;"):
        return (f"the stream arrives compressed (Content-Encoding: {encoding}) through nginx ({shown}), whose "
                f"configuration (started by this run) has gzip off: the server behind it compresses it; "
                f"{_ORIGIN_GZIP}")
    if facts.nginx_config is not None:
        return (f"nginx is in the path ({shown}), its configuration (started by this run) has gzip on, and the stream "
                f"arrives compressed (Content-Encoding: {encoding}), held while it is: set {_NGINX_GZIP}")
    return (f"the stream arrives compressed (Content-Encoding: {encoding}) through nginx ({shown}); the headers do "
            f"not tell whether nginx or the server behind it compresses (nginx passes an encoded response on as "
            f"it is): if nginx does, set {_NGINX_GZIP}; if the server behind it does, {_ORIGIN_GZIP}")


def _nginx_plain(shown: str, facts: PathFacts) -> str:
    if facts.nginx_config is not None and _directive(facts.nginx_config, "proxy_buffering off;"):
        return (f"nginx is in the path ({shown}) but its configuration (started by this run) already has "
                "proxy_buffering off, so it is not nginx's proxy buffering: the events were bunched behind it "
                "(the server behind nginx writes several at once, or another hop holds them)")
    if facts.accel_off:
        return (f"nginx is in the path ({shown}) and the responses carried X-Accel-Buffering: no, which turns nginx's "
                "proxy buffering off for them (unless its configuration has proxy_ignore_headers "
                "X-Accel-Buffering): the events came bunched anyway, so look behind nginx (the server writes "
                "several at once) or for that directive")
    return f"nginx is in the path ({shown}): set {_NGINX}"


def _compressed(encoding: str, shown: str, facts: PathFacts) -> str:
    """A compressed stream no header names a proxy for: who compressed it, as far as the run knows."""
    if facts.compressed_behind is not None:
        return (f"the stream arrives compressed (Content-Encoding: {encoding}), compressed by "
                f"{facts.compressed_behind}, and held while it is: {_ORIGIN_GZIP}")
    if facts.no_compressing_hop:
        told = f" ({shown})" if shown else ""
        return (f"the target's own answer{told} is compressed (Content-Encoding: {encoding}) and held while it is, "
                f"with no hop of this run's path in between: whoever answers at the target URL compresses it "
                f"(the server, or a gateway in front of it): {_ORIGIN_GZIP}")
    return (f"a hop in front compresses the stream (Content-Encoding: {encoding}) and holds it while it "
            "does: turn compression off for text/event-stream (nginx: gzip off for text/event-stream)")


def buffering_fix(server: str | None, via: str | None, content_encoding: str | None,
                  facts: PathFacts | None = None) -> str:
    """One clause naming the buffering hop (as far as the headers and ``facts`` tell) and its own fix."""
    facts = facts or PathFacts()
    name = proxy_name(server, via)
    compressed = content_encoding is not None and content_encoding.strip().lower() not in ("", "identity")
    shown = f"Server: {server}" if server else f"Via: {via}" if via else ""
    if name == "nginx":
        if compressed:
            assert content_encoding is not None
            if facts.compressed_behind is not None:
                return _compressed(content_encoding, shown, facts)
            return _nginx_gzip(shown, content_encoding, facts)
        return _nginx_plain(shown, facts)
    if name == "caddy":
        return f"Caddy is in the path ({shown}): set {_CADDY}"
    if name == "haproxy":
        return f"HAProxy is in the path ({shown}): set {_HAPROXY}"
    if compressed:
        assert content_encoding is not None
        return _compressed(content_encoding, shown, facts)
    told = f" (the response names no proxy{'; ' + shown if shown else ''})"
    return (f"a proxy in front{told}: HAProxy: {_HAPROXY}; nginx: {_NGINX}; Caddy: {_CADDY}; "
            "or a gateway that collects responses")
