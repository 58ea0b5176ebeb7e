"""Which metric series a run's engine exports, and why scrapes failed: what the metric verifiers share.

The run's engine profile (``chaos.model.engines``, recorded in the journal's ``engine_profile`` note)
names its KV usage and running-requests series; without one, every known name is tried in turn.
``no_metrics`` says the truth first when the engine exports no metrics at all (its profile says so,
or every scrape answered 404 and none gave a sample), and suggests ``target.metrics_url`` only where
an endpoint could exist elsewhere (a gateway in front of an engine).

``unobservable`` says when the evidence a verdict needs cannot exist on this target, so the verdict is
``unobservable`` rather than ``inconclusive`` (``chaos.model.verdict``). Exactly these cases, in this order:

1. the run's target note says it has no metrics endpoint (``metrics: false``);
2. no sample was scraped from the target, and either its engine profile says it serves no metrics
   (``metrics: false``: transformers serve), or every scraped endpoint is absent: each answered only
   404 or 501 (``ABSENT_STATUSES``), ``ABSENT_AFTER`` times in a row (the scraper's own rule for "no
   /metrics there": llama.cpp without ``--metrics``, a bare OpenAI-compatible app), and the profile's
   metrics are optional (``metrics_optional``: an engine that always serves them, vLLM, TGI, the
   builtin stack, answering 404 is a path that does not reach them: inconclusive, a setup to fix);
3. the engine profile names no series for something the verdict needs and the SLA entry names none
   either (``series`` / ``running_series``);
4. a series the verdict needs (the entry's, else the profile's) has no sample at all, some endpoint is
   absent as in 2, and no endpoint failed in another way (llama.cpp's ``/slots`` with ``--no-slots``).

Anything else stays ``inconclusive``: evidence that could exist but is missing (a 401, a 500, a refused
connection, fewer than ``ABSENT_AFTER`` 404s, a series that stopped, too few samples, a series missing
from scrapes that worked).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chaos.model.engines import RUNNING_SERIES, USAGE_SERIES
from chaos.model.observations import (
    ABSENT_AFTER,
    ABSENT_STATUSES,
    END_RULE_TOPIC,
    ErrorInfo,
    MetricSample,
    Observations,
    StreamRecord,
)

__all__ = ["ABSENT_AFTER", "ABSENT_STATUSES", "Need", "client_left", "metrics_off", "no_metrics", "pick",
           "profile_series", "scrape_failures", "totals", "unjudged_reason", "unobservable"]


# how a client can leave a stream the server still serves: every one should make the server abort it
LEFT_HOW = ("hang-up", "read timeout", "request timeout", "connection reset")


def client_left(stream: StreamRecord) -> tuple[int, str] | None:
    """When and how the client went away from a stream the server was still serving, or None: a
    hang-up (``client.disconnect``), a read timeout (``client.timeout``), the request timeout, or a
    reset the client saw (a network fault cut the connection). Background load that ended is not one,
    nor a ``stale_connection`` read error: the server closed a kept connection after its last response,
    and the request that found it closed never reached the server."""
    if stream.hangup is not None and stream.hangup.reason != "stopped":
        return stream.hangup.t, "read timeout" if stream.hangup.reason == "read_timeout" else "hang-up"
    error, end = stream.error, stream.t_end
    if error is None or end is None:
        return None
    if error.kind == "timeout" and _request_timeout(error):
        return end, "request timeout"  # (a connect that timed out never reached the server)
    if error.kind == "read" and error.cause == "stale_connection":
        return None  # its message names the ConnectionResetError, but the server left, not the client
    if error.kind == "read" and (error.cause == "reset" or "reset" in error.message.lower()):
        return end, "connection reset"  # a read failed: the request was sent, the server may still serve it
    return None


def _request_timeout(error: ErrorInfo) -> bool:
    """A timeout after the request was sent, with no complete response: by its cause, or by its
    wording in a journal written before timeouts had one. Pure."""
    if error.cause is not None:
        return error.cause == "request_timeout"
    return "no complete response" in error.message


def totals(samples: Sequence[MetricSample], stale_ns: int) -> list[tuple[int, float]]:
    """(t, sum over label sets) at each scrape time: each label set's latest value no older than ``stale_ns``."""
    by_t: dict[int, list[MetricSample]] = {}
    for m in samples:
        by_t.setdefault(m.t, []).append(m)
    latest: dict[tuple[tuple[str, str], ...], tuple[int, float]] = {}
    out: list[tuple[int, float]] = []
    for t in sorted(by_t):
        for m in by_t[t]:
            latest[tuple(sorted(m.labels.items()))] = (m.t, m.value)
        out.append((t, sum(v for st, v in latest.values() if t - st <= stale_ns)))
    return out


def profile_series(obs: Observations) -> tuple[list[str], list[str], str, str]:
    """(usage names, running names, engine, hint) from the run's engine profile note, else every known name."""
    for note in reversed(obs.notes_on(END_RULE_TOPIC)):
        prof = note.data.get("profile")
        if isinstance(prof, dict) and isinstance(prof.get("usage_series"), list):
            return ([str(n) for n in prof["usage_series"]], [str(n) for n in prof.get("running_series") or []],
                    str(prof.get("name", "engine")), str(prof.get("metrics_hint") or ""))
    return [n for n, _ in USAGE_SERIES], list(RUNNING_SERIES), "generic", ""


def _profile(obs: Observations) -> dict[str, Any]:
    for note in reversed(obs.notes_on(END_RULE_TOPIC)):
        prof = note.data.get("profile")
        if isinstance(prof, dict):
            return prof
    return {}


def no_metrics(obs: Observations, judged: str) -> str | None:
    """Why ``judged`` cannot be judged when the engine exports no Prometheus metrics at all, truth first;
    None when some scrape gave samples or failed for another reason (then the series are just missing)."""
    if obs.target_metrics():
        return None
    prof = _profile(obs)
    statuses = [note.data.get("status") for note in obs.notes_on("scrape_error")]
    failures = scrape_failures(obs, suggest=False)
    seen = f" ({'; '.join(failures)})" if failures else ""
    if prof.get("metrics") is False:
        title = str(prof.get("title") or prof.get("name") or "the engine")
        return f"{title} exports no Prometheus metrics, so {judged} cannot be judged{seen}"
    if statuses and all(status == 404 for status in statuses):
        hint = str(prof.get("metrics_hint") or "") if prof.get("gateway") else ""
        where = hint or ("if a gateway or proxy fronts the engine, set target.metrics_url to the engine's own /metrics")
        return f"the target exports no Prometheus metrics there, so {judged} cannot be judged{seen}; {where}"
    return None


def unjudged_reason(obs: Observations, evidence: dict[str, Any], judged: str, missing: str) -> str:
    """Why a series verdict cannot be judged, the truth first: an engine without metrics, else the
    failing scrapes (kept in ``evidence``) and then what is ``missing``."""
    why = scrape_failures(obs)
    if why:
        evidence["scrape_errors"] = why
    absent = no_metrics(obs, judged)
    if absent is not None:
        return absent
    return (f"{'; '.join(why)}: " if why else "") + missing


def scrape_failures(obs: Observations, *, suggest: bool = True) -> list[str]:
    """Why scrapes failed, one line per URL, in words: the status or the connection error, and
    (``suggest``) what to set."""
    out: dict[str, str] = {}
    for note in obs.notes_on("scrape_error"):
        url = str(note.data.get("url", "?"))
        status = note.data.get("status")
        what = f"HTTP {status}" if status else str(note.data.get("error", "failed"))
        hint = {401: " (unauthorised: set target.metrics_auth or the target's api key)", 403: " (forbidden)",
                404: " (no metrics there: set target.metrics_url)"}.get(status if isinstance(status, int) else 0, "")
        hint = hint if suggest else ""
        out[url] = f"scraping {url} failed: {what}{hint}, {note.data.get('failures', 1)} time(s)"
    return list(out.values())


def pick(obs: Observations, names: Sequence[str]) -> str | None:
    """The first of ``names`` with any sample in the run."""
    present = {m.name for m in obs.metrics}
    return next((n for n in names if n in present), None)


def metrics_off(obs: Observations) -> str | None:
    """Why a metric verdict cannot be judged when the run's target note says it has no metrics, else None. Pure."""
    if any(n.data.get("metrics") is False for n in obs.notes_on("target")):
        return "the target exposes no metrics (target note says metrics: false)"
    return None


# what a verdict needs of the engine's series: (in words, the profile's field, the SLA entry's own parameter
# and its value: a series the entry names itself is looked for whatever the profile says)
Need = tuple[str, str, str, str | None]


def unobservable(obs: Observations, needs: Sequence[Need]) -> str | None:
    """Why the series in ``needs`` cannot exist on this target (the cases in the module docstring), in
    words, or None when they could (then a missing one is inconclusive). Pure."""
    if metrics_off(obs) is not None:
        return "the target has no metrics endpoint (its target note says metrics: false)"
    prof = _profile(obs)
    name = str(prof.get("name") or "engine")
    title = str(prof.get("title") or name)
    absent, other_failures = _absent(obs)
    if prof.get("metrics_optional") is False:
        # an engine that always serves its metrics (vLLM, TGI, the builtin stack): a 404 there is a path or
        # gateway that does not reach them, a setup to fix, not an engine that cannot show them
        absent = []
    if not obs.target_metrics():
        if prof.get("metrics") is False:
            return f"{title} exports no Prometheus metrics (profile {name})"
        if absent and not other_failures:
            hint = str(prof.get("metrics_hint") or "") if prof.get("gateway") else ""
            where = hint or ("if a gateway or proxy fronts the engine, set target.metrics_url to the engine's own "
                             "/metrics")
            what = "/metrics" if len(absent) == 1 and absent[0][0].endswith("/metrics") else "metrics endpoint"
            return f"the target has no {what} ({_listed(absent)}); {where}"
    for what, field, param, override in needs:
        if override is None and isinstance(prof.get(field), list) and not prof[field]:
            return f"{title} exports no {what} series (profile {name}); if it does, name it with `{param}`"
    for what, field, _, override in needs:
        names = [override] if override is not None else [str(n) for n in prof.get(field) or []]
        if absent and not other_failures and names and not any(obs.series(n) for n in names):
            # a profile's series that comes from an endpoint the target does not serve (llama.cpp's /slots
            # started with --no-slots): never scraped, and every failing endpoint is one that is not there
            return (f"the {what} series ({', '.join(names)}) was never scraped and the target lacks an endpoint "
                    f"it reads ({_listed(absent)})")
    return None


def _absent(obs: Observations) -> tuple[list[tuple[str, int, int]], bool]:
    """([(url, status, count)] of each scraped endpoint that is not there: every failure noted for it
    answered 404 or 501 (``ABSENT_STATUSES``) and the scraper counted ``ABSENT_AFTER`` of them, or said
    so itself), whether some endpoint failed otherwise (a 401, a 500, a refused connection, too few 404s)."""
    by_url: dict[str, list[dict[str, Any]]] = {}
    for note in obs.notes_on("scrape_error"):
        by_url.setdefault(str(note.data.get("url", "?")), []).append(note.data)
    absent, other = [], False
    for url, notes in by_url.items():
        statuses = {data.get("status") for data in notes}
        count = max(int(data.get("failures") or 1) for data in notes)
        # the scraper's own word that it answered ABSENT_AFTER 404s (or 501s) in a row: its notes come at the
        # 1st, 10th and 100th failure only, so their count says nothing of what came between
        in_a_row = max(int(data.get("absent_in_a_row") or 0) for data in notes)
        if statuses <= set(ABSENT_STATUSES) and (in_a_row >= ABSENT_AFTER or any("next_every_s" in d for d in notes)):
            absent.append((url, int(notes[-1]["status"]), count))
        else:
            other = True
    return absent, other


def _listed(absent: Sequence[tuple[str, int, int]]) -> str:
    """``404 ×10 at http://h/metrics; 501 ×100 at http://h/slots``."""
    return "; ".join(f"{status} ×{count} at {url}" for url, status, count in absent)
