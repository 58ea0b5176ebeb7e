"""One TLS context per process for every HTTP client of ours.

httpx builds a new ``ssl.SSLContext`` for each client it makes and loads the whole CA bundle into
it: 37 ms of CPU per client on a 2-core VM, whether the client ever speaks TLS or not. A run makes a
client per readiness probe, preflight, scrape loop and fault call, and a suite makes thousands; the
context is the same each time (certifi's bundle, as httpx's default), so it is built once, on first
use, and shared (an ``SSLContext`` may wrap sockets from any thread).
"""

from __future__ import annotations

import functools
import ssl

__all__ = ["tls_context"]


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default verifying context (certifi's CA bundle), made once per process."""
    import certifi

    return ssl.create_default_context(cafile=certifi.where())
