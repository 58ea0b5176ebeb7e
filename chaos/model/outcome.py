"""How a run that did not reach its verdicts reads: whether it counts, and what to check next. Pure.

A run that failed or was stopped before any verdict (its target did not answer, the preflight was
refused, Ctrl-C during setup) judged nothing: it must not look like a pass on the page or the
console, and it must not count as a run in ``report --history`` or ``budgets``. ``next_steps``
turns the run's error into what a person should check, from the error's own words.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

__all__ = ["ended", "judged_nothing", "next_steps"]

_URL = re.compile(r"https?://[^\s'\")]+")
_REFUSED = ("ConnectError", "All connection attempts failed", "Connection refused", "ECONNREFUSED")
# A TLS client's handshake answered by a plain-HTTP server (its "400 Bad Request" read as a TLS record):
# OpenSSL 1.1-3.1 say WRONG_VERSION_NUMBER, 3.2 and later "record layer failure"; HTTP_REQUEST is the
# same mistake seen from a TLS server's side (a proxy in the middle that speaks TLS).
_PLAIN_HTTP = ("WRONG_VERSION_NUMBER", "wrong version number", "RECORD_LAYER_FAILURE", "record layer failure",
               "SSL: HTTP_REQUEST")


def judged_nothing(report: Mapping[str, Any]) -> bool:
    """True for a run that ended before any verdict (not completed, no verdicts): it judged nothing."""
    return report.get("status") != "completed" and not report.get("verdicts")


def ended(status: object) -> str:
    """``was interrupted``, ``was halted``, ``failed``: how a run with ``status`` ended, to follow "the run"."""
    return {"interrupted": "was interrupted", "halted": "was halted",
            "completed": "completed"}.get(str(status), "failed")


def _where(error: str) -> str | None:
    match = _URL.search(error)
    if match is None:
        return None
    parts = urlsplit(match.group(0).rstrip(".,;:"))
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.hostname}:{port}" if port else parts.hostname


def _connection_step(text: str) -> str | None:
    """What to check when the target could not be reached: nothing there, or plain HTTP where TLS was spoken."""
    if any(sign in text for sign in _PLAIN_HTTP):
        where = _where(text)
        return (f"something listens on {where or 'the target port'} but speaks plain HTTP, not TLS: use "
                f"{f'http://{where}' if where else 'http://'} in target.url or --target-url")
    if any(sign in text for sign in _REFUSED):
        return (f"nothing listens on {_where(text) or 'the target port'}: is the server up, and is that its address "
                "(target.url, or --target-url)?")
    return None


def next_steps(error: str | None, status: str = "failed") -> list[str]:
    """What to check for a run that ended with ``error``; the most likely cause first."""
    text = error or ""
    steps: list[str] = []
    if status == "interrupted" or text.startswith("interrupted"):
        steps.append("the run was stopped before it finished: nothing was judged; run it again and let it end")
    connection = _connection_step(text)
    if connection is not None:
        steps.append(connection)
    if "HTTP 404" in text:
        if "/chat/completions" in text:
            steps.append("the server answers 404 for /v1/chat/completions: if it serves the completions API only, "
                         "set `load.endpoint: completions`")
        elif "/completions" in text:
            steps.append("the server answers 404 for /v1/completions: if it serves chat only (most chat models' "
                         "servers do), set `load.endpoint: chat`")
        else:
            steps.append("the server answers 404: give its root URL or its /v1 URL (not a page under it)")
    if "HTTP 401" in text or "HTTP 403" in text:
        steps.append("the server wants a credential: name its variable with target.api_key_env or --api-key-env")
    if "timed out" in text or "TimeoutError" in text or "ReadTimeout" in text:
        steps.append("the target did not answer in time: is it overloaded or still loading its model "
                     "(target.startup_timeout, load.request_timeout)?")
    if "needs the builtin engine" in text:
        steps.append("install the engine from the clone: pip install -e '.[engine]'")
    if not steps and text:
        steps.append("the error above is the run's own account; the journal (journal.jsonl) has every step it took")
    return steps
