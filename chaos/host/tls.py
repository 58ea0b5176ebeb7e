"""One TLS context per process for every HTTP client of ours, the load generator's included.

Trust: what the host trusts (OpenSSL's default paths, and ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` where
set: how a staging cluster's private CA is usually named) and certifi's bundle (httpx's default, for
hosts with no CA store of their own). One policy for all: a run whose preflight trusts a target its
load generator does not (or the other way round) fails halfway.

Made once: httpx builds a new ``ssl.SSLContext`` for each client it makes and loads the whole CA
bundle into it, 37 ms of CPU per client on a 2-core VM, whether the client ever speaks TLS or not. A
run makes a client per readiness probe, preflight, scrape loop and fault call, and a suite makes
thousands. An ``SSLContext`` may wrap sockets from any thread.
"""

from __future__ import annotations

import contextlib
import functools
import ssl

__all__ = ["tls_context"]


@functools.cache
def tls_context() -> ssl.SSLContext:
    """A verifying client context: the host's trust store (and ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``)
    plus certifi's CA bundle, made once per process."""
    context = ssl.create_default_context()  # OpenSSL's default verify paths, which read SSL_CERT_FILE/_DIR
    with contextlib.suppress(ImportError, OSError):  # certifi comes with httpx; a host store may stand alone
        import certifi

        context.load_verify_locations(cafile=certifi.where())
    return context
