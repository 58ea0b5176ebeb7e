"""A finished run's windows as Grafana annotations: each phase and each fault as a region, a halt as a point.

``annotations`` is pure: a report.json dict in, the bodies of Grafana's legacy HTTP API
(``POST /api/annotations``: ``time``/``timeEnd`` in epoch milliseconds, ``tags``, ``text``) out. The
report's windows are seconds from the run's start; ``report["start"]`` is that start on the wall clock
(``time.time()`` taken with the monotonic ``t0`` the journal counts from), so each edge is
``(start + seconds) * 1000``.

``push_annotations`` is the edge: it posts them with a service-account token and returns the ids Grafana
answers; a refusal or an unreachable Grafana is one ``ReportWriteFailed`` (exit 4) naming the URL, the status
and what to check. ``GrafanaAnnotator`` is the run listener of ``streamchaos run --grafana``: it pushes when the
run finishes and, whatever Grafana does, prints one line and leaves the run's exit code alone.

Tags (docs/grafana.md): ``streamchaos`` on all; then ``phase``, the experiment and the phase's name; or
``fault``, the experiment and the fault's kind; or ``halt`` and the experiment.
"""

# no `from __future__ import annotations` here: the module's function of that name would shadow it
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from chaos.model.errors import ReportWriteFailed, UsageError

if TYPE_CHECKING:
    from chaos.execution.events import RunEvent

__all__ = ["API_PATH", "TAG", "GrafanaAnnotator", "annotations", "check_url", "push_annotations"]

API_PATH = "/api/annotations"
TAG = "streamchaos"  # on every annotation this module makes: the one tag a dashboard's annotation query needs

# what a refusal means, by status (Grafana's legacy annotations API); 401 names the token's variable
_MEANING = {
    400: "Grafana rejected the annotation's body",
    403: "the token's service account may not add annotations (it needs the Editor role, or "
         "annotations:create on the dashboard)",
    404: "no annotations API there, or no such dashboard: give Grafana's root URL (and an existing "
         "--grafana-dashboard)",
}


def annotations(report: Mapping[str, Any], *, dashboard_uid: str | None = None,
                panel_id: int | None = None) -> list[dict[str, Any]]:
    """One region per phase the run began, one per fault it injected (a fault never reverted ends at the
    run's end, and says so), one point for a halt; in that order. ``dashboard_uid``/``panel_id``: pin
    each to that dashboard (and panel); without them they are organization-wide."""
    start, end = report.get("start"), report.get("end")
    if not isinstance(start, (int, float)) or not isinstance(end, (int, float)):
        raise UsageError("report.json has no numeric start and end (wall-clock seconds): not a finished run's report")
    run = _Run(str(report.get("experiment", "")), float(start), float(end) - float(start))
    pinned: dict[str, Any] = {}
    if dashboard_uid:
        pinned["dashboardUID"] = dashboard_uid
    if panel_id is not None:
        pinned["panelId"] = int(panel_id)
    phases = [p for p in report.get("phases") or [] if isinstance(p, Mapping)]
    faults = [f for f in report.get("faults") or [] if isinstance(f, Mapping)]
    verdicts = [v for v in report.get("verdicts") or [] if isinstance(v, Mapping)]
    out = [_phase(run, phase, faults, verdicts) for phase in phases]
    begins = {str(p["name"]): float(p.get("start_s") or 0.0) for p in phases}
    out += [_fault(run, fault, begins) for fault in faults]
    halt = report.get("halt")
    if isinstance(halt, Mapping) or report.get("status") == "halted":
        facts: Mapping[str, Any] = halt if isinstance(halt, Mapping) else {}
        reason = str(facts.get("reason") or report.get("error") or "no reason recorded")
        out.append({"time": run.ms(_halted_at(phases, facts, run.end_s)), "tags": [TAG, "halt", run.experiment],
                    "text": f"streamchaos {run.experiment}: halted: {reason}"})
    return [{**body, **pinned} for body in out]


class _Run(NamedTuple):
    experiment: str
    start: float  # wall-clock seconds at the run's start: what the report's seconds count from
    end_s: float  # the run's end, in seconds from its start

    def ms(self, seconds: float) -> int:
        """Seconds from the run's start → epoch milliseconds."""
        return round((self.start + seconds) * 1000)


def _phase(run: _Run, phase: Mapping[str, Any], faults: list[Mapping[str, Any]],
           verdicts: list[Mapping[str, Any]]) -> dict[str, Any]:
    """A phase's region: its faults and its verdicts (the whole run's too, marked so) in the text."""
    name, ended = str(phase["name"]), phase.get("end_s")
    lines = [f"streamchaos {run.experiment}: phase {name}"]
    if ended is None:
        lines.append("did not end before the run did: shown until the run's end")
    own = [f"{f.get('name')} ({f.get('kind')})" for f in faults if f.get("phase") == name]
    lines.append("faults: " + (", ".join(own) or "none"))
    judged = [f"{v.get('sla')} {v.get('status')}" for v in verdicts if v.get("phase") == name]
    judged += [f"{v.get('sla')} {v.get('status')} (whole run)" for v in verdicts if v.get("phase") is None]
    lines.append("verdicts: " + ("; ".join(judged) or "none"))
    return {"time": run.ms(float(phase.get("start_s") or 0.0)),
            "timeEnd": run.ms(run.end_s if ended is None else float(ended)),
            "tags": [TAG, "phase", run.experiment, name], "text": "\n".join(lines)}


def _fault(run: _Run, fault: Mapping[str, Any], begins: Mapping[str, float]) -> dict[str, Any]:
    """A fault's region, inject to revert (to the run's end when never reverted); a point where its phase
    began when it was never injected."""
    name, kind, phase = str(fault.get("name")), str(fault.get("kind")), str(fault.get("phase"))
    injected, reverted = fault.get("injected_at"), fault.get("reverted_at")
    errors = [str(e) for e in fault.get("errors") or []]
    tags = [TAG, "fault", run.experiment, kind]
    head = f"streamchaos {run.experiment}: fault {name} ({kind}) in phase {phase}"
    if injected is None:
        return {"time": run.ms(begins.get(phase, 0.0)), "tags": tags,
                "text": "\n".join([head, "not injected", *errors])}
    lines = [head, f"injected at {float(injected):.2f}s"]
    if reverted is None:
        lines.append(f"never reverted: shown until the run's end ({run.end_s:.2f}s); "
                     "`streamchaos rollback RUN_DIR` undoes it")
    else:
        lines.append(f"reverted at {float(reverted):.2f}s")
    return {"time": run.ms(float(injected)), "timeEnd": run.ms(run.end_s if reverted is None else float(reverted)),
            "tags": tags, "text": "\n".join(lines + errors)}


def _halted_at(phases: list[Mapping[str, Any]], halt: Mapping[str, Any], run_end_s: float) -> float:
    """When the run halted, in seconds from its start: the halt's own time where the report has one, else
    the end of the last phase begun (the halt ends the phase it cuts), else the run's end."""
    if isinstance(halt.get("at_s"), (int, float)):
        return float(halt["at_s"])
    ends = [p.get("end_s") for p in phases]
    return float(ends[-1]) if ends and isinstance(ends[-1], (int, float)) else run_end_s


def check_url(url: str) -> str:
    """``url`` when it is an http(s) URL with a host; ``UsageError`` (exit 2) otherwise."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError out of 0-65535
        scheme, host = parts.scheme, parts.hostname
    except ValueError:  # an unclosed or bad [IPv6] host, a port out of range
        scheme, host, port = "", None, -1
    if scheme not in ("http", "https") or not host or port in (-1, 0) \
            or any(c.isspace() or ord(c) < 32 for c in url):
        raise UsageError(f"--grafana {url}: expected Grafana's root URL, http:// or https://, e.g. http://grafana:3000")
    return url


def push_annotations(url: str, annotations: Sequence[Mapping[str, Any]], *, token: str | None,
                     timeout_s: float = 5.0, token_env: str | None = None) -> list[int]:
    """POST each annotation to ``{url}/api/annotations`` and return the ids Grafana gives, in order.

    ``token``: a service-account token, sent as ``Authorization: Bearer``; never printed or written.
    ``token_env``: the environment variable it came from, for the messages. The first refusal stops the
    push: ``ReportWriteFailed`` naming the URL, the status and Grafana's message (and how many were added
    before it); an unreachable Grafana is the same error."""
    import httpx

    endpoint = check_url(url).rstrip("/") + API_PATH
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    ids: list[int] = []
    from chaos.host.tls import tls_context

    with httpx.Client(timeout=timeout_s, trust_env=False, verify=tls_context()) as client:
        for body in annotations:
            try:
                response = client.post(endpoint, content=json.dumps(body), headers=headers)
            except Exception as exc:  # noqa: BLE001 - httpx's errors, anyio's ExceptionGroup, h11's: one line, no traceback
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                raise ReportWriteFailed(f"Grafana at {url} could not be reached ({why})"
                                        + _so_far(ids, annotations)) from None
            answer = _json(response)
            if response.status_code != 200:
                said = answer.get("message") if isinstance(answer, dict) else None
                meaning = _MEANING.get(response.status_code, "Grafana failed" if response.status_code >= 500 else "")
                if response.status_code == 401:
                    meaning = (f"the token in ${token_env} is missing, wrong or expired" if token_env
                               else "no token given: name its environment variable with --grafana-token-env")
                raise ReportWriteFailed(
                    f"Grafana at {endpoint} refused the annotation: {response.status_code} {response.reason_phrase}"
                    + (f" ({said})" if said else "") + (f": {meaning}" if meaning else "") + _so_far(ids, annotations))
            if not isinstance(answer, dict) or not isinstance(answer.get("id"), int):
                raise ReportWriteFailed(f"{endpoint} answered 200 without an annotation id: not Grafana's annotations "
                                        "API?" + _so_far(ids, annotations))
            ids.append(int(answer["id"]))
    return ids


def _json(response: Any) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _so_far(ids: list[int], annotations: Sequence[Any]) -> str:
    return f"; {len(ids)} of {len(annotations)} annotations added before it" if ids else ""


class GrafanaAnnotator:
    """Run listener (``streamchaos run --grafana URL``): when the run finishes, its annotations go to Grafana.

    Grafana being down, refusing, or anything else going wrong here is one line on stderr (``say``): the run's
    exit code and report files are never changed by it. ``ids`` and ``error`` keep what happened."""

    def __init__(self, url: str, *, token: str | None = None, token_env: str | None = None,
                 dashboard_uid: str | None = None, panel_id: int | None = None, timeout_s: float = 5.0,
                 say: Callable[[str], None] | None = None) -> None:
        self.url, self.token, self.token_env, self.timeout_s = check_url(url), token, token_env, timeout_s
        self.dashboard_uid, self.panel_id = dashboard_uid, panel_id
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.ids: list[int] = []
        self.error: str | None = None

    def on_event(self, event: "RunEvent") -> None:
        from chaos.execution.events import RunFinished

        if not isinstance(event, RunFinished):
            return
        try:
            from chaos.output.report import report_dict

            bodies = annotations(report_dict(event.result), dashboard_uid=self.dashboard_uid, panel_id=self.panel_id)
            if not bodies:
                self.say(f"grafana: nothing to annotate (no phase began), nothing sent to {self.url}")
                return
            self.ids = push_annotations(self.url, bodies, token=self.token, timeout_s=self.timeout_s,
                                        token_env=self.token_env)
        except Exception as exc:  # noqa: BLE001 - annotations are a courtesy: the run's outcome stands regardless
            self.error = str(exc) if isinstance(exc, ReportWriteFailed) else f"{type(exc).__name__}: {exc}"
            self.say(f"grafana: annotations not pushed (the run's result stands): {self.error}")
            return
        self.say(f"grafana: {len(self.ids)} annotations pushed to {self.url} (ids {_id_range(self.ids)})")


def _id_range(ids: list[int]) -> str:
    return f"{ids[0]}..{ids[-1]}" if len(ids) > 1 else ", ".join(map(str, ids))
