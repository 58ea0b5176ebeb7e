"""Before the load: learn the engine (its profile) and send it exactly what the load will send.

``detect`` gathers ``chaos.model.engines.Evidence`` from a running server (its ``Server`` header and every
header of ``/v1/models``, ``owned_by``, ``/health``, ``/version``, ``/info``, the metric names of one
scrape) and names the profile. ``preflight`` sends one request built by the load's own request
builder (``chaos.load.workload.Workload.request(0)``) through the load's own client. When the
server refuses a field the load only adds for convenience (``ignore_eos``, ``stream_options``), the
field is dropped from every request of the load and the report says so; when it refuses the
request itself, the run stops before any load with the server's own words (``PreflightRefused``,
exit 4). ``rejected_fields``, ``shape_for``, ``should_cut`` and ``field_checks`` are the pure parts.

A server may also take a field and ignore it (llama-cpp-python's ends streams on ``stop`` whatever
``ignore_eos`` says, and sends no usage chunk for ``stream_options.include_usage``): ``field_checks``
reads from the preflight's own stream whether each field the request asked for took effect, and the
run names the ones ignored (``ignored_fields``) with the verdicts and figures that changes (``AFFECTS``).
A stream the preflight cut decides neither; then one more request, ``PROBE_MAX_TOKENS`` long, does.

A short stream is read to its end, where the end-of-stream rule (``[DONE]``, ``finish_reason``) is
seen. A long or endless one (a soak's ``max_tokens: 100000`` with ``ignore_eos``) is judged at its
first events (the status, the event stream, a parsed content event, the engine's refusals) and the
preflight hangs up on it itself: ``END_WAIT_S`` after the first content event at the latest, sooner
when the rate of the first ``OBSERVE_S`` says the end is far beyond that. The record says it cut the
stream, and the run says which profile rule it assumes for the end it did not see.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from chaos.host.capped import JSON_LIMIT, METRICS_LIMIT, Capped, clip, clip_json, get_capped
from chaos.host.tls import tls_context
from chaos.model.engines import CONVENIENCE_FIELDS, PROFILES, EngineProfile, Evidence, identify
from chaos.model.errors import SetupFailed
from chaos.model.experiment import LoadSpec
from chaos.model.observations import StreamRecord, foreign_content_type
from chaos.model.request_ids import RequestIds, run_tag

__all__ = ["AFFECTS", "FieldCheck", "PreflightRefused", "PreflightResult", "StreamFacts", "detect", "field_checks",
           "preflight", "rejected_fields", "shape_for", "should_cut"]

PROBE_TIMEOUT_S = 5.0  # each evidence request; a server that does not answer one is just not that sign
MAX_RETRIES = len(CONVENIENCE_FIELDS)  # at most one retry per convenience field dropped
END_WAIT_S = 10.0  # how long after the first content event the preflight waits for the stream's end
OBSERVE_S = 1.0  # the rate over this long (after the first content event) may decide the end is far off
_POLL_S = 0.1  # how often the preflight looks at its open stream
# The max_tokens of the one extra request sent when the preflight cut its stream (a long load's: a soak's
# 100000) before the end where ignore_eos and include_usage show. 32 is the default load's own length, read
# to its end in a few seconds even by a CPU engine, far inside END_WAIT_S, so it is not cut in turn; the
# usage chunk shows at any length; and an engine ignoring ignore_eos ends a short answer before it (the
# llama-cpp-python case: 7 tokens). Longer would show a longer answer cut short, at seconds more per run.
PROBE_MAX_TOKENS = 32

# Which LoadSpec switch puts each convenience field into the request body (chaos.load.workload.build_body).
_SWITCH = {"ignore_eos": "ignore_eos", "stream_options": "include_usage"}


class PreflightRefused(SetupFailed):
    """The engine refused the load's request itself (not a convenience field): nothing would work."""


@dataclass
class PreflightResult:
    """What the preflight found: the load as it will be sent, and what the journal keeps about it."""

    load: LoadSpec
    record: StreamRecord
    dropped: dict[str, str] = field(default_factory=dict)  # field → why
    attempts: int = 1
    refusal: str | None = None  # the server's text when it refused a field (a sign of the engine)
    warning: str | None = None  # something about the preflight stream a person should know before the run
    cut: str | None = None  # the preflight hung up on a long stream itself: after how many events, how long
    checks: list[FieldCheck] = field(default_factory=list)  # did each field the request asked for take effect
    probe: dict[str, Any] | None = None  # the extra short request that decided them, when one was sent

    @property
    def ignored(self) -> list[FieldCheck]:
        """The fields the server took and ignored."""
        return [c for c in self.checks if c.outcome == "ignored"]

    def facts(self) -> dict[str, Any]:
        rec = self.record
        return {
            "status": rec.status, "events": rec.events, "content_events": len(rec.t_content),
            "finish_reason": rec.finish_reason, "done_seen": rec.done_seen, "usage": rec.usage is not None,
            "error": None if rec.error is None else rec.error.message, "dropped": dict(self.dropped),
            "attempts": self.attempts, "ttft_s": None if rec.ttft_ns is None else round(rec.ttft_ns / 1e9, 4),
            "content_type": rec.content_type, "sent": sent_fields(self.load),  # sent: what early_close reads
            **({"cut": self.cut} if self.cut else {}), **({"warning": self.warning} if self.warning else {}),
            # a reasoning model, or tool calls: what the target streams besides content
            **({"reasoning_events": len(rec.t_reasoning)} if rec.t_reasoning else {}),
            **({"tool_call_events": len(rec.t_tool_calls)} if rec.t_tool_calls else {}),
            "field_checks": [c.as_dict() for c in self.checks],
            "ignored_fields": [c.ignored_dict() for c in self.ignored],
            **({"field_probe": self.probe} if self.probe else {}),
        }


def _without(load: LoadSpec, name: str) -> LoadSpec:
    """The load with the convenience field ``name`` no longer sent."""
    if name == "ignore_eos":
        return replace(load, ignore_eos=False)
    if name == "stream_options":
        return replace(load, include_usage=False)
    return load


def shape_for(load: LoadSpec, profile: EngineProfile) -> tuple[LoadSpec, dict[str, str]]:
    """The load with the convenience fields the profile does not accept switched off, and why. Pure."""
    dropped: dict[str, str] = {}
    for name, switch in _SWITCH.items():
        if getattr(load, switch) and name not in profile.accepts:
            load = _without(load, name)
            dropped[name] = f"the {profile.name} profile does not accept it"
    return load, dropped


def sent_fields(load: LoadSpec) -> list[str]:
    """The convenience fields this load puts into its requests."""
    return [name for name, switch in _SWITCH.items() if getattr(load, switch)]


def rejected_fields(message: str, present: Iterable[str]) -> list[str]:
    """The convenience fields a refusal names, of those the request carried. Pure.

    An engine that validates strictly names the field (``Unexpected fields in the request:
    {'ignore_eos'}``, ``Extra inputs are not permitted ... ignore_eos``); one that names none of
    ours refused something else.
    """
    text = message.lower()
    return [name for name in present if name in text or name.replace("_", " ") in text]


# -- did what the request asked for take effect? -----------------------------------------------------

USAGE_FIELD = "stream_options.include_usage"

# What each field a server takes and ignores changes in the run's verdicts and figures (read from sla/ and
# chaos/output/): "kind: how". A stream's token count is usage.completion_tokens where the server sent it
# (sla.definitions.output_tokens, sla.integrity.usage_tokens), else the client's own count of token events.
AFFECTS: dict[str, tuple[str, ...]] = {
    "ignore_eos": (
        "early_close: its short_length check (an end on length before max_tokens although ignore_eos was sent) "
        "finds nothing: streams end on stop at the model's own end, which counts as complete",
        "throughput: tokens/s and requests/s are of streams as long as the model's answers, not of max_tokens",
        "goodput: the e2e and tpot objectives (and min_rate) are judged on those shorter streams",
        "streaming: streams with fewer than min_events content events (default 8) are not judged",
        "client.disconnect after_tokens: a stream that ends before N content events is never hung up on, "
        "so abort_path and abort_propagation judge fewer hang-ups",
        "figures: the vLLM bench output tokens, E2EL and output throughput are of the model's own lengths",
    ),
    USAGE_FIELD: (
        "integrity: events_over_usage is not checked (no usage.completion_tokens to compare with)",
        "early_close: short_length is not checked (a stream ending on length before max_tokens is not seen "
        "without usage.completion_tokens)",
        "throughput: min_tokens_per_s counts token events (token_source content_events): several tokens in one "
        "event count as one",
        "goodput: tpot divides by token events, not usage.completion_tokens",
        "context_kept: inconclusive (no usage.prompt_tokens to compare turns by)",
        "figures: output tokens, TPOT and token rates (vLLM bench figures, report rates) are the client's count "
        "of token events",
    ),
    "min_tokens": (
        "throughput, goodput (e2e, tpot), streaming (min_events): streams shorter than min_tokens are judged",
        "figures: the vLLM bench output tokens, E2EL and output throughput are of the shorter streams",
    ),
}


@dataclass(frozen=True)
class StreamFacts:
    """What a preflight stream showed about its length and its end (``of`` reads a record)."""

    tokens: int  # generated tokens: usage.completion_tokens where at least the token events, else token events
    counted: str  # how tokens were counted: "usage.completion_tokens" or "token events"
    finish_reason: str | None
    usage: bool  # a chunk carrying usage arrived
    ended: bool  # read to its end: not cut by the preflight, no error

    @classmethod
    def of(cls, record: StreamRecord, cut: str | None = None) -> StreamFacts:
        reported = (record.usage or {}).get("completion_tokens")
        events = record.token_events
        by_usage = isinstance(reported, int) and not isinstance(reported, bool) and reported >= events
        return cls(tokens=reported if isinstance(reported, int) and by_usage else events,
                   counted="usage.completion_tokens" if by_usage else "token events",
                   finish_reason=record.finish_reason, usage=record.usage is not None,
                   ended=cut is None and record.error is None and record.in_band_error is None)


@dataclass(frozen=True)
class FieldCheck:
    """Whether one field the request asked for took effect: ``honoured`` (its effect was seen),
    ``ignored`` (the stream shows it was not), or ``not_shown`` (the stream cannot tell)."""

    field: str
    outcome: str
    evidence: str

    @property
    def affects(self) -> tuple[str, ...]:
        return AFFECTS.get(self.field, ()) if self.outcome == "ignored" else ()

    def as_dict(self) -> dict[str, Any]:
        return {"field": self.field, "outcome": self.outcome, "evidence": self.evidence}

    def ignored_dict(self) -> dict[str, Any]:
        return {"field": self.field, "evidence": self.evidence, "affects": list(self.affects)}


def _asked_int(body: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


_OWN = "the preflight stream"


def field_checks(body: Mapping[str, Any], stream: StreamFacts, where: str = _OWN) -> list[FieldCheck]:
    """Per field the request ``body`` asked for, whether ``stream`` shows it took effect. Pure.

    - ``ignore_eos: true``: the stream reached max_tokens (finish_reason ``length``, or as many tokens):
      honoured, though a model whose own answer is that long shows the same; it ended with ``stop``
      before max_tokens: ignored; another reason that ends a stream whatever ignore_eos says (a tool
      call, a content filter), or none: not shown.
    - ``stream_options.include_usage: true``: a chunk carried ``usage``: honoured; the stream ended
      without one: ignored.
    - ``min_tokens: N``: at least N tokens: honoured; fewer, ended by anything but ``length`` (a
      max_tokens below N): ignored.

    A stream not read to its end (cut by the preflight, broken) shows none of these ends: not shown.
    """
    found = [_ignore_eos(body, stream, where), _include_usage(body, stream, where), _min_tokens(body, stream, where)]
    return [c for c in found if c is not None]


def _ignore_eos(body: Mapping[str, Any], stream: StreamFacts, where: str) -> FieldCheck | None:
    if body.get("ignore_eos") is not True:
        return None
    max_tokens = _asked_int(body, "max_tokens", "max_completion_tokens")
    n, reason = stream.tokens, stream.finish_reason
    if max_tokens is None:
        return FieldCheck("ignore_eos", "not_shown", f"the request names no max_tokens to reach ({where}: {n} tokens, "
                          f"finish_reason {reason})")
    of = f"{n} of {max_tokens} tokens"
    if reason == "length" or n >= max_tokens:
        return FieldCheck("ignore_eos", "honoured", f"{where} reached max_tokens: {of} ({stream.counted}), "
                          f"finish_reason {reason}")
    if not stream.ended:
        return FieldCheck("ignore_eos", "not_shown", f"{where} was not read to its end ({of} by then)")
    if reason in ("stop", "eos", "eos_token"):
        return FieldCheck("ignore_eos", "ignored", f"{where} stopped at {of} with finish_reason {reason}")
    return FieldCheck("ignore_eos", "not_shown", f"{where} ended at {of} with finish_reason {reason}, which does not "
                      "tell whether ignore_eos was honoured")


def _include_usage(body: Mapping[str, Any], stream: StreamFacts, where: str) -> FieldCheck | None:
    options = body.get("stream_options")
    if not isinstance(options, Mapping) or options.get("include_usage") is not True:
        return None
    if stream.usage:
        return FieldCheck(USAGE_FIELD, "honoured", f"{where} carried a usage chunk")
    if stream.ended:
        return FieldCheck(USAGE_FIELD, "ignored", "no usage chunk" + ("" if where == _OWN else f" ({where})"))
    return FieldCheck(USAGE_FIELD, "not_shown", f"{where} was not read to its end, where usage comes")


def _min_tokens(body: Mapping[str, Any], stream: StreamFacts, where: str) -> FieldCheck | None:
    least = _asked_int(body, "min_tokens")
    if least is None or least <= 0:
        return None
    n, reason = stream.tokens, stream.finish_reason
    if n >= least:
        return FieldCheck("min_tokens", "honoured", f"{where} had {n} tokens, min_tokens {least}")
    if not stream.ended:
        return FieldCheck("min_tokens", "not_shown", f"{where} was not read to its end ({n} tokens by then)")
    if reason == "length":
        return FieldCheck("min_tokens", "not_shown", f"{where} ended on length at {n} tokens, below min_tokens {least}")
    return FieldCheck("min_tokens", "ignored", f"{where} stopped at {n} tokens with finish_reason {reason}, "
                      f"min_tokens {least}")


def _merge(first: list[FieldCheck], second: list[FieldCheck]) -> list[FieldCheck]:
    """``first``'s checks, each one it could not decide replaced by ``second``'s for the same field."""
    later = {c.field: c for c in second}
    return [later.get(c.field, c) if c.outcome == "not_shown" else c for c in first]


def _with_max_tokens(body: Mapping[str, Any], limit: int) -> dict[str, Any]:
    key = "max_completion_tokens" if "max_completion_tokens" in body and "max_tokens" not in body else "max_tokens"
    return {**body, key: limit}


async def _get(client: httpx.AsyncClient, url: str, limit: int = JSON_LIMIT) -> Capped | None:
    try:
        return await get_capped(client, url, limit=limit, deadline=PROBE_TIMEOUT_S)
    except (httpx.HTTPError, OSError):
        return None


def _json(response: Capped | None) -> Mapping[str, Any] | None:
    if response is None or response.status_code >= 400:
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


async def detect(base_url: str, metrics_url: str | None, headers: Mapping[str, str],
                 metrics_headers: Mapping[str, str] | None = None) -> Evidence:
    """Every sign of the engine a running server shows, each request bounded; never raises."""
    from chaos.targets.scraper import all_metric_names

    root = base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url
    async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, headers=dict(headers), trust_env=False, verify=tls_context(),
                                 follow_redirects=True) as client:
        models, health, version, info, alive = await asyncio.gather(
            _get(client, base_url + "/models"), _get(client, root + "/health"), _get(client, root + "/version"),
            _get(client, root + "/info"), _get(client, root + "/health/liveliness"))
        names: tuple[str, ...] = ()
        if metrics_url:
            scraped = await _get(client, metrics_url, METRICS_LIMIT) if metrics_headers is None else None
            if metrics_headers is not None:
                async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, headers=dict(metrics_headers), trust_env=False,
                                             verify=tls_context(), follow_redirects=True) as m:
                    scraped = await _get(m, metrics_url, METRICS_LIMIT)
            if scraped is not None and scraped.status_code < 400 and not scraped.over:
                names = all_metric_names(scraped.text)
    owners: tuple[str, ...] = ()
    listing = _json(models)
    if listing is not None and isinstance(listing.get("data"), list):
        owners = tuple(str(m.get("owned_by", "")) for m in listing["data"] if isinstance(m, dict) and m.get("owned_by"))
    return Evidence(
        server_header=models.headers.get("server") if models is not None else None,
        headers={k.lower(): v for k, v in models.headers.items()} if models is not None else {},
        owned_by=owners, health=_json(health), version=_json(version), info=_json(info), metric_names=names,
        liveliness=alive.text[:100] if alive is not None and alive.status_code < 400 else None,
    )


def should_cut(since_first_s: float, content_events: int, max_tokens: int | None, *,
               wait_s: float = END_WAIT_S, observe_s: float = OBSERVE_S) -> bool:
    """Whether the preflight hangs up on a stream still open ``since_first_s`` after its first content
    event, ``content_events`` in. Pure.

    Always at ``wait_s``; from ``observe_s`` on, when the rate so far puts the last of ``max_tokens``
    (one token per content event, none known: endless) beyond twice ``wait_s``: the margin keeps a
    stream whose events carry several tokens each from being cut where its end would have come.
    """
    if since_first_s >= wait_s:
        return True
    if since_first_s < observe_s or content_events <= 0:
        return False
    if max_tokens is None:
        return True
    projected_s = max_tokens * since_first_s / content_events
    return projected_s > 2 * wait_s


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    value = body.get("max_tokens", body.get("max_completion_tokens"))
    return value if isinstance(value, int) else None


async def _send_once(url: str, body: Mapping[str, Any], api_key: str | None, timeout: float,
                     load: LoadSpec | None = None, run: int | None = None) -> tuple[StreamRecord, str | None]:
    """The stream, sent as the load sends its requests (``load``: its headers, its own X-Request-Id unless
    ``load.headers`` names the header), and, when the preflight hung up on it
    (``should_cut``), why. A server that refuses what the load sends refuses it here, before the run."""
    from chaos.load.client import make_http_client, stream_request
    from chaos.load.sdk_headers import request_headers, request_id_header

    record = StreamRecord(id="preflight", phase="preflight",
                          endpoint="chat" if url.endswith("/chat/completions") else "completions")
    load = load or LoadSpec()
    # HTTP/1.1 whatever ``load.http`` says: the preflight asks the target itself, while the load may reach it
    # through the path's hops, which are what speak HTTP/2 to it (the builtin stack may speak only HTTP/1.1)
    http = make_http_client(1, api_key=api_key, headers=request_headers(load.headers, load.request_timeout))
    id_header = request_id_header(load.headers)
    # UUID-shaped like the load's (``load.request_ids``): a server that refuses the load's ids refuses this
    # one too, and one that refuses other ids (llama-cpp-python: any but a UUID) takes both
    ids = RequestIds(str(getattr(load, "request_ids", "uuid")), run_tag(0, "preflight") if run is None else run)
    own_id = {id_header: ids.wire("preflight")} if id_header else {}
    limit = _max_tokens(body)
    try:
        task = asyncio.create_task(stream_request(http, url, body, record, request_timeout=timeout, headers=own_id))
        while not task.done():
            await asyncio.wait({task}, timeout=_POLL_S)
            first = record.t_first_token  # reasoning or a tool call streams no content first
            if task.done() or first is None:
                continue
            since_s = (time.monotonic_ns() - first) / 1e9
            if should_cut(since_s, record.token_events, limit):
                task.cancel()  # the client's own hang-up: the connection closes, the server sees the disconnect
                await asyncio.wait({task})  # its record closed; a cancellation of our own still reaches us
                record.error = None  # the cancellation was ours, not a failure of the stream
                total_s = (record.t_end or time.monotonic_ns()) - (record.t_sent or first)
                return record, (f"stream cut by the preflight after {record.events} events / {total_s / 1e9:.1f} s: "
                                "long streams are judged at the first events")
        return task.result(), None
    finally:
        await http.aclose()


async def preflight(load: LoadSpec, *, base_url: str, model: str, seed: int, api_key: str | None,
                    profile: EngineProfile, timeout: float | None = None, run: int | None = None) -> PreflightResult:
    """One request exactly as the load will send it; convenience fields the engine refuses dropped.

    Raises ``PreflightRefused`` (exit 4) with the server's own error text when the request is
    refused for anything else, or does not get through at all.
    """
    from chaos.load.workload import Workload, endpoint_url

    load, dropped = shape_for(load, profile)
    url = endpoint_url(base_url, load.endpoint)
    timeout = timeout or load.request_timeout
    attempts = 0
    refusal: str | None = None
    while True:
        attempts += 1
        body, _ = Workload(load, model=model, seed=seed).request(0)
        record, cut = await _send_once(url, body, api_key, timeout, load, run)
        _check_event_stream(record, url)
        _check_parsed(record, url)
        refused = record.error is not None and record.error.kind == "http" and record.status in (400, 422)
        if record.error is None and record.in_band_error is None:
            result = PreflightResult(load, record, dropped, attempts, refusal, warning=_untyped(record), cut=cut)
            await _check_fields(result, body, url, api_key, timeout, run)
            return result
        message = (record.error.message if record.error is not None else record.in_band_error) or ""
        named = rejected_fields(message, sent_fields(load)) if refused else []
        if not named or attempts > MAX_RETRIES:
            shown = json.dumps(_shown(body), ensure_ascii=False)[:400]
            if record.status is not None and record.status >= 400:
                what = f"the target refused the load's request at the preflight (HTTP {record.status} from {url})"
            elif record.in_band_error is not None:
                what = f"the target answered the load's request at the preflight with an error event ({url})"
            else:
                kind = record.error.kind if record.error is not None else "?"
                what = f"the load's request did not get through at the preflight ({kind} error, {url})"
            raise PreflightRefused(f"{what}: {message}\n  request body: {shown}")
        refusal = refusal or message
        for name in named:
            load = _without(load, name)
            dropped[name] = f"refused by the server: {message[:200]}"


async def _check_fields(result: PreflightResult, body: Mapping[str, Any], url: str, api_key: str | None,
                        timeout: float, run: int | None = None) -> None:
    """``result.checks`` from the preflight's stream; when it was cut before the end that decides a field,
    from one more request, ``PROBE_MAX_TOKENS`` long (never for a stream read to its end: no run pays for
    a second request unless its first could not tell)."""
    result.checks = field_checks(body, StreamFacts.of(result.record, result.cut))
    limit = _max_tokens(body)
    if result.cut is None or (limit is not None and limit <= PROBE_MAX_TOKENS):
        return  # read to its end, or the probe would be the same request again
    if all(c.outcome != "not_shown" for c in result.checks):
        return
    probe_body = _with_max_tokens(body, PROBE_MAX_TOKENS)
    record, cut = await _send_once(url, probe_body, api_key, timeout, result.load, run)
    where = f"a second preflight request of max_tokens {PROBE_MAX_TOKENS}"
    facts = StreamFacts.of(record, cut)
    result.probe = {"max_tokens": PROBE_MAX_TOKENS, "status": record.status, "finish_reason": record.finish_reason,
                    "tokens": facts.tokens, "usage": facts.usage, **({"cut": cut} if cut else {}),
                    **({"error": record.error.message} if record.error is not None else {})}
    if record.status is None or not 200 <= record.status < 300:
        return  # refused or lost now: the load's own request got through, so leave the fields undecided
    result.checks = _merge(result.checks, field_checks(probe_body, facts, where))


def _check_event_stream(record: StreamRecord, url: str) -> None:
    """Refuse a target whose 2xx answer to the load's request is not an event stream (a server that
    answers ``200 text/html`` everywhere): every request of the run would fail, and the Content-Type
    says why now, not after the run. Raises ``PreflightRefused`` (exit 4). Without a Content-Type
    (a homemade server, a proxy that drops it) the body is judged as SSE: refused only when no event
    of it parsed (``_parsed_nothing``), else taken with a warning (``_untyped``)."""
    status, ctype = record.status, record.content_type
    if status is None or not 200 <= status < 300 or ctype is None:
        return
    if foreign_content_type(ctype):
        got = f"Content-Type {ctype!r}"
    elif not ctype and record.error is None and _parsed_nothing(record):
        got = "no Content-Type and no SSE event"
    else:
        return
    parsed = (f"{record.events} SSE events, {record.token_events} with tokens, "
              f"[DONE] {'seen' if record.done_seen else 'not seen'}")
    raise PreflightRefused(
        f"the target's answer to the load's request is not an event stream: HTTP {status} with {got} from {url}, "
        f"text/event-stream expected ({parsed})\n  the URL may point at a web page or a gateway's own answer "
        "rather than the OpenAI-compatible API; check --target-url / target.base_url, including its /v1")


def _check_parsed(record: StreamRecord, url: str) -> None:
    """Refuse a target whose events at the preflight were none of them a JSON object the load can read
    (malformed, or nested deeper than Python's reader goes: 100,000 brackets) and carried nothing else:
    every stream of the run would be judged broken, and this says why now. Raises ``PreflightRefused``
    (exit 4); a stream with one such event among readable ones goes on (the integrity verdicts count it)."""
    read = record.token_events or record.finish_reason is not None or record.usage is not None
    if record.json_errors == 0 or record.error is not None or read or record.in_band_error is not None:
        return
    raise PreflightRefused(
        f"the target's answer to the load's request at the preflight is not readable: {record.json_errors} of "
        f"{record.events} SSE events carried data that is not a JSON object (malformed, or nested too deep to "
        f"read) and none carried content, a finish_reason or usage ({url})")


def _parsed_nothing(record: StreamRecord) -> bool:
    """No event of the stream carried what a completion stream sends: no content, no finish_reason,
    no usage, no error event, no [DONE] (a web page served without a Content-Type). Pure."""
    return not (record.done_seen or record.token_events or record.finish_reason is not None
                or record.usage is not None or record.in_band_error is not None)


def _untyped(record: StreamRecord) -> str | None:
    """The warning for a 2xx answer that came without a Content-Type but parsed as SSE. Pure."""
    if record.content_type != "" or record.status is None or not 200 <= record.status < 300:
        return None
    return ("the target's answer came with no Content-Type (text/event-stream expected): its body parsed as SSE "
            "and is judged as such; a proxy in front of the engine may be dropping the header")


def _shown(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body with the prompt shortened, for an error message."""
    out = dict(body)
    for key in ("prompt", "messages"):
        if key in out:
            text = json.dumps(out[key], ensure_ascii=False)
            out[key] = text if len(text) <= 60 else text[:57] + "..."
    return out



@dataclass
class EngineFindings:
    """The engine profile a run uses, why, and the load as the preflight left it."""

    profile: EngineProfile
    detected_by: str
    preflight: PreflightResult
    evidence: Evidence | None = None

    def note(self) -> dict[str, Any]:
        """The ``engine_profile`` note: the profile, why it was chosen, and the end-of-stream rule
        every verifier (and a later ``streamchaos verify``) judges completeness by."""
        evidence = None
        if self.evidence is not None:
            ev = self.evidence
            # what the target said, clipped: its words must not grow the journal and the report
            evidence = {"server": clip(ev.server_header), "owned_by": [clip(o) for o in ev.owned_by[:16]],
                        "health": bool(ev.health), "version": clip_json(ev.version),
                        "info_router": clip((ev.info or {}).get("router")), "metric_families": len(ev.metric_names)}
        return {"name": self.profile.name, "profile": self.profile.describe(),
                "detected_by": clip(self.detected_by, 400),
                "end": self.profile.end.as_dict(), "evidence": evidence}


async def learn_engine(load: LoadSpec, *, base_url: str, metrics_url: str | None, model: str, seed: int,
                       api_key: str | None, metrics_headers: Mapping[str, str] | None, engine: str,
                       started_builtin: bool, run: int | None = None) -> EngineFindings:
    """The run's engine profile (``target.engine``, the builtin stack it started, or detected) and the
    preflight against it; a refusal that names the engine (``transformers serve``'s 422) re-detects it."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    evidence: Evidence | None = None
    if engine != "auto":
        prof, why = PROFILES[engine], "target.engine"
    elif started_builtin:
        prof, why = PROFILES["builtin"], "the builtin stack streamchaos started"
    else:
        evidence = await detect(base_url, metrics_url, headers, metrics_headers)
        prof, why = identify(evidence)
    result = await preflight(load, base_url=base_url, model=model, seed=seed, api_key=api_key, profile=prof, run=run)
    if evidence is not None and result.refusal and prof.name == "openai":
        evidence = replace(evidence, preflight_error=result.refusal)
        better, reason = identify(evidence)
        if better.name != prof.name:
            prof, why = better, reason
            shaped, more = shape_for(result.load, prof)
            result.load = shaped
            for name, because in more.items():
                result.dropped.setdefault(name, because)
            # a field now dropped is no longer sent: whether the server honoured it no longer matters
            result.checks = [c for c in result.checks if c.field.split(".")[0] not in result.dropped]
    rec = result.record
    warning: str | None = None
    if result.cut is not None:
        warning = end_assumed(prof)
    elif prof.end.done and not rec.done_seen and rec.finish_reason is not None and rec.error is None:
        # a server that ends cleanly without [DONE] under a profile that requires it: every stream
        # would count as cut; say so now rather than after the run
        warning = (f"the preflight stream ended with finish_reason {rec.finish_reason!r} but no [DONE], which "
                   f"the {prof.name} profile requires: if this engine never sends it, set target.engine to its "
                   "profile (e.g. transformers-serve) or early_close will count every stream as cut")
    if warning is not None:  # beside the preflight's own (no Content-Type): the console prints one line
        result.warning = f"{result.warning}; {warning}" if result.warning else warning
    return EngineFindings(prof, why, result, evidence)


def end_assumed(prof: EngineProfile) -> str:
    """What the run assumes when the preflight cut its stream before the end. Pure."""
    end = prof.end
    rule = {(True, True): "a finish_reason, then [DONE]", (True, False): "a finish_reason ([DONE] not required)",
            (False, True): "[DONE]", (False, False): "the response's end"}[(end.finish_reason, end.done)]
    return (f"the end-of-stream rule was not observed (the preflight cut its long stream); the {prof.name} profile's "
            f"rule is assumed: a complete stream ends with {rule}")
