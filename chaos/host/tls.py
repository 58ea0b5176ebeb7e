"""One TLS policy per process for every HTTP client of ours, the load generator's included.

Trust: what the host trusts (OpenSSL's default paths, and ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` where
set: how a staging cluster's private CA is usually named), certifi's bundle (httpx's default, for
hosts with no CA store of their own), and the CAs a run adds with ``trust`` (the CA of the
certificates it made for what it serves itself, ``chaos.host.certs``). One policy for all: a run
whose preflight trusts a target its load generator does not (or the other way round) fails halfway.

Made once: httpx builds a new ``ssl.SSLContext`` for each client it makes and loads the whole CA
bundle into it, 37 ms of CPU per client on a 2-core VM, whether the client ever speaks TLS or not. A
run makes a client per readiness probe, preflight, scrape loop and fault call, and a suite makes
thousands. An ``SSLContext`` may wrap sockets from any thread. Two contexts share the policy: the
plain one (HTTP/1.1 only, what httpx and the HTTP/1.1 load client use) and one per ALPN offer (the
HTTP/2 load client's ``h2``, or ``h2`` then ``http/1.1`` to learn what a server speaks).
"""

from __future__ import annotations

import contextlib
import functools
import ssl
import threading
from pathlib import Path

__all__ = ["server_context", "tls_context", "trust", "trust_data", "trusted"]

_trusted: list[str] = []  # CA certificates added by ``trust`` / ``trust_data``, as PEM text, in order
_lock = threading.Lock()
_made: list[ssl.SSLContext] = []


def _client_context(alpn: tuple[str, ...]) -> ssl.SSLContext:
    context = ssl.create_default_context()  # OpenSSL's default verify paths, which read SSL_CERT_FILE/_DIR
    with contextlib.suppress(ImportError, OSError):  # certifi comes with httpx; a host store may stand alone
        import certifi

        context.load_verify_locations(cafile=certifi.where())
    if alpn:
        context.set_alpn_protocols(list(alpn))
    with _lock:
        for pem in _trusted:
            context.load_verify_locations(cadata=pem)
        _made.append(context)
    return context


@functools.cache
def tls_context(alpn: tuple[str, ...] = ()) -> ssl.SSLContext:
    """A verifying client context: the host's trust store (and ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``),
    certifi's CA bundle and every CA given to ``trust``, made once per process and ALPN offer
    (``alpn``: the protocols offered, in order; none: no ALPN, the server picks HTTP/1.1)."""
    return _client_context(alpn)


def trust(cafile: str | Path) -> None:
    """Trust the CA in ``cafile`` (PEM) from now on, in every client context of this process, made or
    still to be made. Its text is kept, not its path: a run's certificate files may be gone before the
    last context is made. Raises ``ssl.SSLError`` / ``OSError`` for a file that is not a CA certificate."""
    trust_data(Path(cafile).read_text(encoding="ascii"))


def trust_data(pem: str) -> None:
    """Trust the CA certificate(s) in ``pem`` (PEM text), as ``trust`` does a file's: also what a load
    process or a shard on another host is sent (``trusted()``), where the runner's files mean nothing."""
    with _lock:
        if pem in _trusted:
            return
        probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        probe.load_verify_locations(cadata=pem)  # fails here, once, for what is not a certificate
        _trusted.append(pem)
        for context in _made:
            context.load_verify_locations(cadata=pem)


def trusted() -> tuple[str, ...]:
    """The CA certificates ``trust`` / ``trust_data`` added in this process (PEM text), in order: what a
    child process is given to trust them too (``LoadTarget.ca_pems``)."""
    with _lock:
        return tuple(_trusted)


def server_context(cert: str | Path, key: str | Path, alpn: tuple[str, ...] = ("http/1.1",)) -> ssl.SSLContext:
    """A server context for ``cert`` (a PEM chain) and ``key``, offering ``alpn`` in the order given
    (``("h2", "http/1.1")``: HTTP/2 to a client that offers it)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert), str(key))
    if alpn:
        context.set_alpn_protocols(list(alpn))
    return context
