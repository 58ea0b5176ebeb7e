"""The run's token: an embedded Toxiproxy a streamchaos run starts takes orders only from that run.

Real Toxiproxy has no authentication, and loopback is no boundary between local users: whoever
reaches the API can point a proxy's upstream at her own relay, read what the load sends through it
(the target's ``Authorization: Bearer`` key among it), and put the upstream back. So the runner
starts its embedded server with a random per-run token in the environment variable ``TOKEN_ENV``
(never on the command line: ``/proc/PID/cmdline`` is readable by every user); the server takes it
out of its own environment and then answers every route but ``GET /version`` (which reveals
nothing, and is how the runner sees it is up) only to ``Authorization: Bearer <token>``: 401
without the header, 403 with another value, compared in constant time. Reads need it too: a
proxy's listing names its upstream.

A guarded server also keeps each proxy's ``listen`` and ``upstream`` as they were created: the run
never changes them in place (it creates its proxy once and deletes it at the end), so a change is
never the run's own, token or not (a 403 on ``POST /proxies/NAME`` and ``/populate``). Started by
hand without the variable, the server is unguarded, as Toxiproxy is.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping

__all__ = ["MIN_TOKEN_CHARS", "OPEN_PATHS", "TOKEN_ENV", "fixed_addresses", "refusal", "token_from_environment"]

TOKEN_ENV = "STREAMCHAOS_TOXIPROXY_TOKEN"
MIN_TOKEN_CHARS = 16  # a short token could be guessed through the API itself
OPEN_PATHS = frozenset({"/version"})


def token_from_environment() -> str | None:
    """The run's token, taken out of this process's environment (nothing this server starts inherits
    it); None when the variable is unset. A value too short to be a secret raises ``ValueError``."""
    value = os.environ.pop(TOKEN_ENV, None)
    if value is None:
        return None
    if len(value) < MIN_TOKEN_CHARS:
        raise ValueError(f"{TOKEN_ENV} must hold at least {MIN_TOKEN_CHARS} characters")
    return value


def refusal(token: str | None, path: str, headers: Mapping[str, str]) -> tuple[int, str] | None:
    """``(status, message)`` when a request to ``path`` is refused for want of the token, else None."""
    if token is None or path in OPEN_PATHS:
        return None
    given = headers.get("authorization")
    if given is None:
        return 401, ("this Toxiproxy belongs to a streamchaos run: its API answers only the run's token, "
                     "sent as 'Authorization: Bearer <token>'")
    if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), f"Bearer {token}".encode()):
        return 403, "this Toxiproxy belongs to a streamchaos run, and that is not the run's token"
    return None


def fixed_addresses(name: str) -> str:
    """The refusal of a change to a guarded proxy's ``listen`` or ``upstream``."""
    return (f"proxy {name}: its listen and upstream are fixed on a Toxiproxy a streamchaos run started "
            "(the run never changes them once the proxy exists)")
