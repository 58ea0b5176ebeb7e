"""Prometheus's HTTP API, as far as ``safety.stop_when`` needs it: one instant query, read as krkn reads it.

An expression *fires* when it returns something: a vector (or matrix) with at least one series, or a
scalar that is non-zero and not NaN. So ``up{job="api"} == 0`` fires while some target is down, and
``vector(1) > 2`` never does. A string result cannot fire or not fire: the expression is wrong, and is
refused as the server's refusals are (``rejected=True``).

Every failure is a ``FleetSignalError`` naming the source, the URL (never the token) and what the server
said. ``rejected=True`` only where Prometheus answered and refused the query itself (``bad_data``: a
syntax error, a bad parameter): the experiment is wrong, not the fleet. No answer, a 5xx, a 401/403 or a
body that is not the API's is ``rejected=False``: the fleet cannot be read right now.

``http_get`` is shared with ``chaos.fleet.alertmanager``: one place maps transport errors, timeouts and
auth refusals to ``FleetSignalError`` for both sources.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from chaos.host.tls import tls_context
from chaos.model.errors import FleetSignalError

__all__ = ["Sample", "http_get", "instant_query", "parse_query_response", "render_description"]

SOURCE = "Prometheus"
_SNIPPET = 300  # characters of a body quoted in a message


@dataclass(frozen=True)
class Sample:
    """One series an expression returned (or the scalar it returned, with no labels)."""

    labels: dict[str, str]
    value: float


def _snippet(body: bytes | str) -> str:
    """A body, one line and short, for a message; an HTML page (an auth proxy's 401) by its text only."""
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    if text.lstrip().startswith("<"):
        text = re.sub(r"<[^>]*>", " ", text)
    text = " ".join(text.split())
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "..."


async def http_get(source: str, url: str, params: Any, *, token: str | None, timeout_s: float) -> httpx.Response:
    """GET ``url`` with ``params``: the response when the server answered below 500 and did not refuse the
    credentials, else ``FleetSignalError(rejected=False)``. The caller reads 2xx and 4xx: only it knows
    what a refusal of its own request looks like.

    ``timeout_s`` bounds the whole exchange, not each phase (httpx's own timeout is per read: a server
    that drips its answer would hold a run's safety check far longer). No proxy from the environment
    (``trust_env=False``): a fleet's monitoring is reached as the run reaches its target."""
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        async with asyncio.timeout(timeout_s):
            async with httpx.AsyncClient(timeout=timeout_s, trust_env=False, verify=tls_context()) as client:
                response = await client.get(url, params=params, headers=headers)
    except TimeoutError:
        raise FleetSignalError(f"{source} at {url} did not answer within {timeout_s:g}s") from None
    except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError) as exc:
        raise FleetSignalError(f"{source} at {url} could not be reached: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - anyio's ExceptionGroup (a port out of range), h11's header errors:
        # a safety read that fails is a signal not seen, said as such, never a traceback
        raise FleetSignalError(f"{source} at {url} could not be read: {type(exc).__name__}: {exc}") from None
    if response.status_code in (401, 403):
        raise FleetSignalError(f"{source} at {url} answered {response.status_code}, unauthorized: check the bearer "
                               f"token variable ({_snippet(response.content) or 'no body'})")
    if response.status_code >= 500:
        raise FleetSignalError(f"{source} at {url} answered {response.status_code}: "
                               f"{_snippet(response.content) or 'no body'}")
    return response


def _value(raw: Any) -> float:
    """A sample value as the API writes it: a string ("1", "NaN", "+Inf", "-Inf"), read by ``float``."""
    if isinstance(raw, (list, tuple)) and len(raw) == 2:
        raw = raw[1]
    if not isinstance(raw, (str, int, float)) or isinstance(raw, bool):
        raise ValueError(f"not a sample value: {raw!r}")
    return float(raw)


def _series_value(series: Mapping[str, Any]) -> float | None:
    """The value of one vector or matrix series: its ``value``, its last ``values`` entry (a matrix), or
    a native histogram's count; None for a matrix series with no points."""
    if "value" in series:
        return _value(series["value"])
    if "values" in series:
        points = series["values"]
        return _value(points[-1]) if points else None
    for key in ("histogram", "histograms"):
        if key in series:
            hist = series[key]
            last = hist[-1] if key == "histograms" else hist
            return float(last[1]["count"])
    raise ValueError(f"a series with no value: {_snippet(json.dumps(series))}")


def _samples(result_type: str, result: Any, where: str) -> list[Sample]:
    if result_type in ("vector", "matrix"):
        samples = []
        for series in result:
            value = _series_value(series)
            if value is not None:
                labels = {str(k): str(v) for k, v in (series.get("metric") or {}).items()}
                samples.append(Sample(labels, value))
        return samples
    if result_type == "scalar":
        value = _value(result)
        return [] if value == 0 or math.isnan(value) else [Sample({}, value)]
    if result_type == "string":
        raise FleetSignalError(f"{where}: the expression returned a string, which cannot fire; write one that "
                               "returns series (a comparison such as `up == 0`) or a scalar", rejected=True)
    raise ValueError(f"unknown resultType {result_type!r}")


def parse_query_response(body: bytes, *, url: str = "") -> list[Sample]:
    """The samples of an instant query's answer (``/api/v1/query``): one per series of a vector; a matrix's
    series by their last point; a scalar as one sample when it is non-zero and not NaN, else none (an
    expression fires when it returns something: a scalar fires when non-zero).

    ``"status": "error"`` raises ``FleetSignalError``, ``rejected=True`` for ``bad_data`` (the query itself
    is wrong); a body that is not the API's raises ``rejected=False``. ``url`` only names the server in
    messages."""
    where = f"{SOURCE} at {url}" if url else SOURCE
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise FleetSignalError(f"{where} answered with something that is not JSON: {_snippet(body)!r}") from None
    if not isinstance(doc, dict) or doc.get("status") not in ("success", "error"):
        raise FleetSignalError(f"{where} answered with something that is not a query response: {_snippet(body)!r}")
    if doc["status"] == "error":
        error_type, error = str(doc.get("errorType", "")), str(doc.get("error", "no error text"))
        raise FleetSignalError(f"{where} refused the query ({error_type or 'error'}): {error}",
                               rejected=error_type == "bad_data")
    try:
        data = doc["data"]
        return _samples(str(data["resultType"]), data["result"], where)
    except FleetSignalError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise FleetSignalError(f"{where} answered with a query response this client cannot read ({exc}): "
                               f"{_snippet(body)!r}") from None


async def instant_query(url: str, expr: str, *, token: str | None = None, timeout_s: float = 3.0) -> list[Sample]:
    """Evaluate ``expr`` now on the Prometheus at ``url`` (its root, e.g. ``http://prometheus:9090``): the
    samples it returned (``parse_query_response``); none means it does not fire.

    ``token``: sent as ``Authorization: Bearer``, never written in a message. A 400/422 whose body is the
    API's ``bad_data`` error is ``rejected=True`` with Prometheus's own text (its parse error names the position)."""
    endpoint = f"{url.rstrip('/')}/api/v1/query"
    response = await http_get(SOURCE, endpoint, {"query": expr}, token=token, timeout_s=timeout_s)
    if response.status_code >= 400 and response.status_code not in (400, 422):
        raise FleetSignalError(f"{SOURCE} at {endpoint} answered {response.status_code} to the query {expr!r}: "
                               f"{_snippet(response.content) or 'no body'}")
    try:
        return parse_query_response(response.content, url=endpoint)
    except FleetSignalError as exc:
        if response.status_code < 400:
            raise
        # 400/422: the expression, quoted, beside what Prometheus said about it
        raise FleetSignalError(f"{exc} (HTTP {response.status_code}, the query: {expr!r})",
                               rejected=exc.rejected) from None


_VALUE = re.compile(r"\{\{\s*\$value\s*\}\}")
_LABEL = re.compile(r"\{\{\s*\$labels\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def render_description(template: str, sample: Sample | None) -> str:
    """krkn's alert description templates, and nothing more: ``{{$value}}`` (``%g``) and
    ``{{$labels.NAME}}`` (empty when absent), spaces inside the braces allowed. With no sample (the
    expression did not fire) the value renders empty. Anything else is left as written: this is not
    Go's template language, and a description must never fail a run."""
    value = "" if sample is None else "%g" % sample.value
    labels = {} if sample is None else sample.labels
    text = _VALUE.sub(lambda _: value, template)
    return _LABEL.sub(lambda m: labels.get(m.group(1), ""), text)
