"""One redactor for everything a run records or prints: configured secrets and URL userinfo.

A target may echo what it is sent (an ``Authorization`` header in its stream text or an error body),
and a URL may carry ``user:password@``. Whatever the run writes — the journal, report.json,
report.html, junit.xml, the console — passes ``redact`` first. Secrets are registered where they are
resolved (the API key and metrics token in ``chaos.execution.credentials``, the admin token in
``chaos.targets.base``); the registry is process-wide so a writer needs no plumbing to know them.
"""

from __future__ import annotations

import json
import re
import threading
from typing import IO, Any

__all__ = ["MARK", "RedactingStream", "redact", "redact_bytes", "register_secret", "strip_userinfo"]

MARK = "[redacted]"
MIN_SECRET_CHARS = 4  # shorter "secrets" would redact ordinary text (and say what they are by doing so)

_lock = threading.Lock()
_secrets: tuple[str, ...] = ()
# scheme://userinfo@ ; userinfo stops at the first character a URL's authority cannot hold before '@'
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#@\s\"'<>\\]+@")


def register_secret(value: str | None) -> None:
    """Redact ``value`` (and its JSON- and HTML-escaped forms) from everything written from now on."""
    global _secrets
    if not value or len(value) < MIN_SECRET_CHARS:
        return
    forms = {value, json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1],
             value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")}
    with _lock:
        # longest first, so a secret that contains another is removed whole
        _secrets = tuple(sorted(set(_secrets) | forms, key=len, reverse=True))


def strip_userinfo(text: str) -> str:
    """``http://user:pw@host/x`` → ``http://host/x``, anywhere in ``text``."""
    return _USERINFO.sub(r"\1", text) if "@" in text else text


def redact(text: str) -> str:
    """``text`` without any registered secret and without URL userinfo."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, MARK)
    return strip_userinfo(text)


def redact_bytes(data: bytes) -> bytes:
    """``redact`` for UTF-8 bytes (junit.xml)."""
    return redact(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


class RedactingStream:
    """A text stream (stdout, stderr) whose writes are redacted; everything else is the wrapped stream's."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
