"""The request headers a real client sends: by default those of the OpenAI Python SDK.

Captured from ``openai`` 3.57.0 (``AsyncOpenAI``, httpx underneath) on a loopback server, for a
streaming ``completions.create``: ``Accept-Encoding: gzip, deflate`` (httpx's default: it decodes
both), ``Accept: application/json``, ``User-Agent: OpenAI/Python 3.57.0`` and the
``X-Stainless-*`` platform headers, plus ``Authorization`` (``H1Client`` adds it) and
``Content-Type``. The encoding matters: a proxy compresses only for a client that asks, and nginx
with ``gzip on`` for ``text/event-stream`` holds the whole stream while compressing it, so a client
that sends no ``Accept-Encoding`` sees a healthy stream the SDK's users never get.

The experiment's ``load.headers`` adds to these or replaces them (a header given ``null`` is not
sent). Pure functions.
"""

from __future__ import annotations

import platform
import re
import sys
from collections.abc import Iterable

__all__ = [
    "DECODABLE_ENCODINGS", "OPENAI_PYTHON_VERSION", "check_accept_encoding", "check_header", "openai_python_headers",
    "request_headers",
]

OPENAI_PYTHON_VERSION = "3.57.0"  # the SDK version the defaults were captured from
DECODABLE_ENCODINGS = ("gzip", "deflate", "identity")  # what chaos.load.encoding decodes (zlib, stdlib)
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name (RFC 9110 token)


def _arch() -> str:
    """``platform.machine()`` in the SDK's words (``x64``, ``arm64``, ...)."""
    machine = platform.machine().lower()
    if machine in ("arm64", "aarch64"):
        return "arm64"
    if machine in ("x86_64", "amd64"):
        return "x64"
    if machine == "arm":
        return "arm"
    if sys.maxsize <= 2**32:
        return "x32"
    return f"other:{machine}" if machine else "unknown"


def _os() -> str:
    name = platform.system()
    return {"Darwin": "MacOS", "Windows": "Windows", "Linux": "Linux", "FreeBSD": "FreeBSD"}.get(name, f"Other:{name}")


def openai_python_headers(read_timeout_s: float) -> dict[str, str]:
    """The headers ``AsyncOpenAI`` sends with a streaming request (no Authorization, no Content-Type)."""
    return {
        "Accept-Encoding": "gzip, deflate",
        "Accept": "application/json",
        "User-Agent": f"OpenAI/Python {OPENAI_PYTHON_VERSION}",
        "X-Stainless-Lang": "python",
        "X-Stainless-Package-Version": OPENAI_PYTHON_VERSION,
        "X-Stainless-OS": _os(),
        "X-Stainless-Arch": _arch(),
        "X-Stainless-Runtime": platform.python_implementation(),
        "X-Stainless-Runtime-Version": platform.python_version(),
        "X-Stainless-Async": "async:asyncio",
        "X-Stainless-Retry-Count": "0",
        "X-Stainless-Read-Timeout": f"{read_timeout_s:g}",
    }


def request_headers(overrides: Iterable[tuple[str, str | None]], read_timeout_s: float) -> dict[str, str]:
    """The SDK's headers with ``overrides`` applied (names case-insensitive; None removes one)."""
    out = openai_python_headers(read_timeout_s)
    for name, value in overrides:
        for existing in [k for k in out if k.lower() == name.lower()]:
            del out[existing]
        if value is not None:
            out[name] = value
    return out


REQUEST_ID_HEADER = "X-Request-Id"


def request_id_header(overrides: Iterable[tuple[str, str | None]]) -> str | None:
    """The header that carries each request's own id (the hops' taps pair client and hop by it), or None
    where ``load.headers`` names it: a value there is sent on every request instead, null sends none (for
    a server that refuses ids it does not like: llama-cpp-python's answers 400 to any but a UUID). Pure."""
    return None if any(name.lower() == REQUEST_ID_HEADER.lower() for name, _ in overrides) else REQUEST_ID_HEADER


def check_header(name: str, value: str | None) -> str | None:
    """What is wrong with one ``load.headers`` entry, or None."""
    if not _TOKEN.fullmatch(name):
        return f"{name!r} is not a header name (letters, digits and !#$%&'*+.^_`|~- only)"
    if name.lower() in ("host", "content-length", "transfer-encoding", "connection", "content-type"):
        return f"{name} is set by the load client itself and cannot be given here"
    if value is None:
        return None
    if any(c in value for c in "\r\n\0"):
        return f"the value of {name} must not contain CR, LF or NUL"
    if name.lower() == "accept-encoding":
        return check_accept_encoding(value)
    return None


def check_accept_encoding(value: str) -> str | None:
    """What is wrong with an Accept-Encoding: one that announces a coding the load client cannot
    decode (``br``, ``zstd``, ``*``) with a non-zero weight; None when it is fine."""
    for part in value.split(","):
        coding, *params = (p.strip() for p in part.split(";"))
        weight = next((p[2:] for p in params if p.lower().startswith("q=")), "1")
        try:
            refused = float(weight) == 0
        except ValueError:
            return f"Accept-Encoding {value!r}: {weight!r} is not a weight (q=0 to q=1)"
        if coding and coding.lower() not in DECODABLE_ENCODINGS and not refused:
            return (f"Accept-Encoding announces {coding!r}, which the load client cannot decode; "
                    f"announce only {', '.join(DECODABLE_ENCODINGS)} (e.g. 'gzip, deflate', the OpenAI SDK's)")
    return None
