"""Alertmanager's API v2, as far as ``safety.stop_when`` needs it: the alerts firing now that match a set
of label matchers, silenced and inhibited ones left out (a silence is how an operator says "known, carry on").

Matchers are Alertmanager's own text (``alertname="GPUDown"``, ``severity=~"critical|page"``,
``team!=ml``), sent as ``filter=`` parameters: the server is the judge of what they match, and
``parse_matcher`` only catches a malformed one early, when an experiment is read.

Failures are ``FleetSignalError`` as in ``chaos.fleet.prometheus``: ``rejected=True`` where Alertmanager
answered 400 (it refused a matcher), ``rejected=False`` where it could not be read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from chaos.fleet.prometheus import http_get
from chaos.model.errors import FleetSignalError

__all__ = ["Alert", "Matcher", "active_alerts", "parse_alerts", "parse_matcher"]

SOURCE = "Alertmanager"
OPS = ("=", "!=", "=~", "!~")
_EXAMPLE = 'alertname="GPUDown" or severity=~"critical|page"'
# Alertmanager 0.25's label names (pkg/labels): Prometheus's, colons allowed
_MATCHER = re.compile(r"^\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$", re.DOTALL)
_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|z|[+-]\d\d:\d\d)$")


@dataclass(frozen=True)
class Matcher:
    """One label matcher: ``name``, ``op`` (one of ``OPS``) and the ``value`` as meant, unescaped."""

    name: str
    op: str
    value: str

    @property
    def text(self) -> str:
        """The wire form Alertmanager parses: ``name="value"``, the value quoted and escaped."""
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.name}{self.op}"{escaped}"'


def _unquote(raw: str, text: str) -> str:
    """A quoted value's content (``\\"``, ``\\\\`` and ``\\n`` unescaped, as Alertmanager does), or an
    unquoted value as written."""
    if not raw.startswith('"'):
        if '"' in raw:
            raise ValueError(f"matcher {text!r}: a value with a quote in it must be quoted whole; "
                             f"write e.g. {_EXAMPLE}")
        return raw
    body, out, i = raw[1:], [], 0
    while i < len(body):
        char = body[i]
        if char == "\\" and i + 1 < len(body):
            out.append({"n": "\n", '"': '"', "\\": "\\"}.get(body[i + 1], "\\" + body[i + 1]))
            i += 2
        elif char == '"':
            if i != len(body) - 1:
                raise ValueError(f"matcher {text!r}: a quote inside the value must be escaped (\\\"); "
                                 f"write e.g. {_EXAMPLE}")
            return "".join(out)
        else:
            out.append(char)
            i += 1
    raise ValueError(f"matcher {text!r}: the value's quotes are not closed; write e.g. {_EXAMPLE}")


def parse_matcher(text: str) -> Matcher:
    """``text`` as a ``Matcher``: ``NAME OP VALUE``, OP one of ``=``, ``!=``, ``=~``, ``!~``, spaces around
    it allowed, the value quoted (``"critical|page"``) or bare (``team!=ml``). Raises ``ValueError``
    saying what is wrong, with an example of a right one.

    A regex value is compiled here (Python's ``re``, near enough to Go's RE2 to catch a typo). Alertmanager
    anchors regexes at both ends: ``severity=~"crit"`` does not match ``critical``; write ``"crit.*"``."""
    found = _MATCHER.match(text)
    if not found:
        if not text.strip():
            raise ValueError(f"an empty matcher; write e.g. {_EXAMPLE}")
        if not any(op in text for op in OPS):
            raise ValueError(f"matcher {text!r} has no operator (=, !=, =~ or !~); write e.g. {_EXAMPLE}")
        raise ValueError(f"matcher {text!r}: the label name must be letters, digits, _ or :, not starting with "
                         f"a digit, then an operator (=, !=, =~ or !~); write e.g. {_EXAMPLE}")
    name, op, raw = found.groups()
    value = _unquote(raw, text)
    if op in ("=~", "!~"):
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"matcher {text!r}: {value!r} is not a regular expression ({exc}); "
                             f"write e.g. {_EXAMPLE}") from None
    return Matcher(name, op, value)


@dataclass(frozen=True)
class Alert:
    """One alert as Alertmanager holds it. ``starts_at``: unix seconds; ``state``: ``active``,
    ``suppressed`` (silenced or inhibited) or ``unprocessed``."""

    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    fingerprint: str
    state: str

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")


def parse_time(text: str) -> float:
    """RFC 3339 (``2024-05-01T12:00:00.123456789Z``, or with an offset) as unix seconds. Alertmanager writes
    nanoseconds, which ``datetime`` would cut or refuse: the fraction is added apart."""
    found = _RFC3339.match(text.strip())
    if not found:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    base, fraction, zone = found.groups()
    offset = "+00:00" if zone in ("Z", "z") else zone
    return datetime.fromisoformat(base + offset).timestamp() + (float(fraction) if fraction else 0.0)


def _strings(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"not a label set: {raw!r}")
    return {str(k): str(v) for k, v in raw.items()}


def _alert(raw: Any) -> Alert:
    if not isinstance(raw, Mapping):
        raise ValueError(f"not an alert: {raw!r}")
    status = raw.get("status") or {}
    return Alert(labels=_strings(raw["labels"]), annotations=_strings(raw.get("annotations")),
                 starts_at=parse_time(str(raw["startsAt"])), fingerprint=str(raw.get("fingerprint", "")),
                 state=str(status.get("state", "")))


def parse_alerts(body: bytes, *, url: str = "") -> list[Alert]:
    """The alerts of a ``GET /api/v2/alerts`` answer (a JSON array), in its order. A body that is not
    one raises ``FleetSignalError(rejected=False)``; ``url`` only names the server in messages."""
    where = f"{SOURCE} at {url}" if url else SOURCE
    try:
        doc = json.loads(body)
        if not isinstance(doc, list):
            raise ValueError("not a list of alerts")
        return [_alert(raw) for raw in doc]
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        text = body.decode("utf-8", errors="replace")[:300]
        raise FleetSignalError(f"{where} answered with something that is not a list of alerts ({exc}): "
                               f"{text!r}") from None


def _said(body: bytes) -> str:
    """What a refusal says: Alertmanager writes its error as a JSON string ("bad matcher format: x")."""
    text = body.decode("utf-8", errors="replace")
    try:
        decoded = json.loads(text)
    except ValueError:
        decoded = None
    if isinstance(decoded, str):
        text = decoded
    elif isinstance(decoded, dict) and "message" in decoded:  # go-swagger's validation errors
        text = str(decoded["message"])
    return " ".join(text.split())[:300] or "no body"


async def active_alerts(url: str, matchers: Sequence[str | Matcher], *, token: str | None = None,
                        timeout_s: float = 3.0) -> list[Alert]:
    """The alerts firing now on the Alertmanager at ``url`` (its root) that match every one of ``matchers``,
    silenced and inhibited ones left out. Strings are sent as written (Alertmanager judges them: one it
    refuses is ``rejected=True`` with its words); ``token`` goes as ``Authorization: Bearer``.

    Only alerts whose state is ``active`` are returned, whatever the server's filters did: a server that
    ignored ``silenced=false`` must not halt a run over an alert an operator silenced."""
    endpoint = f"{url.rstrip('/')}/api/v2/alerts"
    params: list[tuple[str, str]] = [("active", "true"), ("silenced", "false"), ("inhibited", "false"),
                                     ("unprocessed", "true")]
    params += [("filter", m.text if isinstance(m, Matcher) else m) for m in matchers]
    response = await http_get(SOURCE, endpoint, params, token=token, timeout_s=timeout_s)
    if response.status_code >= 400:
        said = _said(response.content)
        wire = [value for key, value in params if key == "filter"]
        raise FleetSignalError(f"{SOURCE} at {endpoint} answered {response.status_code} to the matchers {wire}: "
                               f"{said}", rejected=response.status_code == 400)
    return [alert for alert in parse_alerts(response.content, url=endpoint) if alert.state == "active"]
