"""Which metric series a run's engine exports, and why scrapes failed: what the metric verifiers share.

The run's engine profile (``chaos.model.engines``, recorded in the journal's ``engine_profile`` note)
names its KV usage and running-requests series; without one, every known name is tried in turn.
``no_metrics`` says the truth first when the engine exports no metrics at all (its profile says so,
or every scrape answered 404 and none gave a sample), and suggests ``target.metrics_url`` only where
an endpoint could exist elsewhere (a gateway in front of an engine).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chaos.model.engines import RUNNING_SERIES, USAGE_SERIES
from chaos.model.observations import END_RULE_TOPIC, ErrorInfo, MetricSample, Observations, StreamRecord

__all__ = ["client_left", "metrics_off", "no_metrics", "pick", "profile_series", "scrape_failures", "totals",
           "unjudged_reason"]

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
