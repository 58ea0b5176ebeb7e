"""Reports of a finished run: report.json (the contract), junit.xml, report.html, the terminal summary.

``ReportWriter`` is the run listener that writes them when the run finishes; ``streamchaos verify``
uses the same writer under other file names. Verdicts read the same everywhere (``chaos.output.render``).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from chaos.execution.coverage import fault_times, phase_times
from chaos.execution.events import RunEvent, RunFinished
from chaos.execution.halt import top_errors
from chaos.host.redact import redact, redact_bytes
from chaos.host.runfiles import release_dir, replace_file, write_new
from chaos.model.errors import ReportWriteFailed
from chaos.model.observations import Observations
from chaos.output.render import (
    unobservable_lines,
    unobservable_note,
    verdict_label,
    verdict_line,
    verdict_table,
    verdict_why,
)
from chaos.output.reports.engine_phases import engine_phases
from chaos.output.reports.phases import until_text
from chaos.output.turn_table import turn_table

if TYPE_CHECKING:
    from chaos.execution.result import Result

__all__ = ["ENVIRONMENT_NOTES", "ReportWriter", "environment", "fault_timeline", "path_report", "render_summary",
           "report_dict", "write_reports"]

# Notes that describe the environment rather than what happened (shown in the report's environment section).
ENVIRONMENT_NOTES = ("target", "proxy", "proxy_watch", "engine_profile", "profile", "preflight", "warmup",
                     "client_lag", "allowed_targets", "shards")


def fault_timeline(obs: Observations) -> list[dict[str, Any]]:
    """Each fault with its inject/revert times in seconds from the run's start, its plan (the undo
    journaled before the inject), the undo recorded after it, and the evidence of inject and revert."""
    by_name: dict[str, dict[str, Any]] = {}
    for event in obs.faults:
        entry = by_name.setdefault(
            event.fault,
            {"name": event.fault, "kind": event.kind, "phase": event.phase, "injected_at": None, "reverted_at": None,
             "evidence": {}, "revert_evidence": {}, "errors": [], "plan": {}, "undo": {}},
        )
        at = round((event.t - obs.t0) / 1e9, 4)
        if event.action == "plan":
            entry["plan"] = event.undo  # what the inject will change and how to undo it, journaled first
        elif event.action == "inject":
            entry["injected_at"], entry["evidence"] = at, event.evidence
            entry["undo"] = event.undo or entry["plan"]
        elif event.action in ("revert", "rollback"):
            entry["reverted_at"], entry["revert_evidence"] = at, event.evidence
        elif event.action == "error":
            entry["errors"].append(event.message)
    return list(by_name.values())


def gpu_summary(obs: Observations) -> dict[str, Any]:
    """Per GPU: SM clock range, peak power and memory, and every clock-event reason bit seen."""
    out: dict[str, Any] = {}
    for sample in obs.metrics:
        if not sample.name.startswith("gpu_"):
            continue
        gpu = out.setdefault(sample.labels.get("gpu", "0"), {"samples": 0, "reasons_seen": 0})
        if sample.name == "gpu_sm_clock_mhz":
            gpu["samples"] += 1
            gpu["sm_clock_mhz_min"] = min(gpu.get("sm_clock_mhz_min", sample.value), sample.value)
            gpu["sm_clock_mhz_max"] = max(gpu.get("sm_clock_mhz_max", sample.value), sample.value)
        elif sample.name == "gpu_clock_event_reasons":
            gpu["reasons_seen"] |= int(sample.value)
        elif sample.name == "gpu_power_watts":
            gpu["power_watts_max"] = max(gpu.get("power_watts_max", sample.value), sample.value)
        elif sample.name == "gpu_memory_used_bytes":
            gpu["memory_used_bytes_max"] = max(gpu.get("memory_used_bytes_max", sample.value), sample.value)
    for gpu in out.values():
        gpu["reasons_seen"] = hex(gpu["reasons_seen"])
    return out


def environment(obs: Observations) -> dict[str, Any]:
    """Host, versions, target, proxy (and why that one), engine profile, warm-up: the run's notes on them."""
    out: dict[str, Any] = {}
    for note in obs.notes:
        if note.topic == "environment":
            out.update(note.data)
        elif note.topic in ENVIRONMENT_NOTES:
            out[note.topic] = {**out.get(note.topic, {}), **note.data}  # a restarted target adds to its facts
    return out


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _clean_dict(value: dict[str, Any]) -> dict[str, Any]:
    """``_clean`` of a mapping, typed as one."""
    return {str(k): _clean(v) for k, v in value.items()}


def phase_report(obs: Observations, planned: dict[str, float],
                 planned_max: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    """Each phase's window (seconds from the run's start) and its planned vs actual duration: the
    actual is its real length, start to end, its injects and reverts included (a restart the revert
    waited for too); ``in_force_duration_s`` the planned part, from when its faults were in force to
    when their revert began (``chaos.execution.coverage``). A phase that runs until decided has its
    max (``planned_max``: phase name → seconds) as ``planned_max_s``, and its ``looks`` and
    ``stopped_by`` (``PhaseWindow``); a fixed phase None, 0 and None."""
    tops = planned_max or {}
    windows = {w.name: w for w in obs.phases}
    return [
        {"name": pt.name, "start_s": pt.start_s, "in_force_at_s": pt.in_force_at_s,
         "reverts_at_s": pt.reverts_at_s, "end_s": pt.end_s, "planned_duration_s": pt.planned_s,
         "planned_max_s": tops.get(pt.name), "looks": windows[pt.name].looks if pt.name in windows else 0,
         "stopped_by": windows[pt.name].stopped_by if pt.name in windows else None,
         "actual_duration_s": _round(pt.actual_s), "in_force_duration_s": _round(pt.in_force_s),
         "reverts_took_s": _round(pt.reverts_s)}
        for pt in phase_times(obs, planned)
    ]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def fault_report(obs: Observations, planned: dict[str, float]) -> list[dict[str, Any]]:
    """``fault_timeline`` plus each fault's planned vs actual time in force (inject began → revert completed)."""
    times = {ft.name: ft for ft in fault_times(obs, planned)}
    touches = fault_touches(obs)
    out = []
    for entry in fault_timeline(obs):
        ft = times.get(entry["name"])
        actual = None if ft is None or ft.in_force_s is None else round(ft.in_force_s, 4)
        coverage = None if ft is None or ft.coverage is None else round(ft.coverage, 4)
        out.append({**entry, "revert_started_at": None if ft is None else ft.revert_started_at_s,
                    "revert_took_s": None if ft is None else _round(ft.revert_s),
                    "planned_in_force_s": None if ft is None else ft.planned_s, "actual_in_force_s": actual,
                    "coverage": coverage, **touches.get(entry["name"], {})})
    return out


def fault_touches(obs: Observations) -> dict[str, dict[str, int]]:
    """Per fault, the streams it touched (``Observations.touched``: alive while it was in force, or
    for a client fault sent in its phase then) and how many of them were sent in another phase: those
    its phase's verdicts judge instead (``Observations.population``)."""
    sent_in = {s.id: s.phase for s in obs.streams}
    phase_of = {w.fault: w.phase for w in obs.fault_spans()}
    return {fault: {"touched_streams": len(ids),
                    "moved_from_other_phases": sum(1 for i in ids if sent_in.get(i) != phase_of[fault])}
            for fault, ids in obs.touched().items()}


def report_dict(result: Result) -> dict[str, Any]:
    obs: Observations = result.observations
    planned = {p.name: p.duration for p in result.experiment.phases}
    planned_max = {p.name: p.max_duration for p in result.experiment.phases if p.max_duration is not None}
    population = obs.population()
    target = result.target
    return _clean_dict({
        "experiment": result.experiment.name,
        "description": result.experiment.description,
        "seed": result.experiment.seed,
        "status": result.status,
        "exit_code": result.exit_code,
        "error": result.error,
        "start": result.started,
        "end": result.ended,
        "duration_s": round(result.ended - result.started, 3),
        "target": None if target is None else {
            "kind": target.kind, "base_url": target.base_url, "metrics_url": target.metrics_url,
            "device": target.device, "model": target.model, "engine": engine_facts(obs),
        },
        "proxy": None if result.proxy is None else {
            "server": result.proxy.server, "api_url": result.proxy.api_url, "listen": result.proxy.listen,
            "upstream": result.proxy.upstream,
        },
        "path": path_report(obs),
        "phases": phase_report(obs, planned, planned_max),
        "turns": turn_table(obs),  # per phase and conversation turn (chaos.output.turn_table); None: single-turn
        "faults": fault_report(obs, planned),
        "environment": environment(obs),
        "gpu": gpu_summary(obs),
        "host": host_summary(obs),
        "load": {
            "streams": len(population),
            "background_streams": len(obs.streams) - len(population),
            "complete": sum(1 for s in population if obs.complete(s)),
            "hung_up_on_purpose": sum(1 for s in population if s.hangup is not None),
            "client_lag": result.client_lag,
            **connection_facts(population),
        },
        "errors": {"top": top_errors(stream_errors(population))},
        # per phase: the prefix cache's hit rate, TTFT's time queued and in prefill (the engine's counters)
        "engine_phases": engine_phases(obs),
        "halt": halt_facts(obs),
        "fleet": fleet_facts(obs),
        # each entry's parameters, parsed: what the report's CDFs rebuild its spec from (``spec.samples``)
        "sla": [{"name": e.name, "kind": e.kind, "params": e.spec.params} for e in result.experiment.sla],
        "verdicts": [v.to_dict() for v in result.verdicts],
    })


def connection_facts(population: list[Any]) -> dict[str, Any]:
    """What the load's streams travelled on: streams per protocol ("http/1.1", "h2"), the connections
    they used and how many streams opened one (the rest reused one). Pure."""
    protocols = Counter(st.protocol for st in population if st.protocol is not None)
    return {
        "protocols": dict(protocols),
        "connections": len({st.connection for st in population if st.connection is not None}),
        "streams_on_new_connections": sum(1 for st in population if st.reused is False),
    }


def path_report(obs: Observations) -> list[dict[str, Any]] | None:
    """The hops between load and target, load side first, as the run started them (the ``path`` note):
    each one's kind, name, listen, upstream, version, effective configuration and log; None without a path."""
    notes = obs.notes_on("path")
    if not notes:
        return None
    hops = notes[-1].data.get("hops")
    return [dict(h) for h in hops if isinstance(h, dict)] if isinstance(hops, list) else None


def stream_errors(population: list[Any]) -> list[str]:
    """Each failed stream's error as ``kind: message`` (hang-ups by client faults are not errors)."""
    out = []
    for st in population:
        if st.hangup is not None:
            continue
        if st.error is not None:
            out.append(f"{st.error.kind}: {st.error.message}")
        elif st.in_band_error is not None:
            out.append(f"in_band: {st.in_band_error}")
    return out


def engine_facts(obs: Observations) -> dict[str, Any] | None:
    """The engine profile the run used, why, and what the preflight dropped from the load's requests."""
    notes = obs.notes_on("engine_profile")
    if not notes:
        return None
    data = notes[-1].data
    preflight = obs.notes_on("preflight")
    dropped = preflight[-1].data.get("dropped") if preflight else None
    cut = preflight[-1].data.get("cut") if preflight else None
    ignored = preflight[-1].data.get("ignored_fields") if preflight else None
    return {"profile": data.get("name"), "detected_by": data.get("detected_by"), "end_of_stream": data.get("end"),
            "dropped_fields": dropped or {}, "ignored_fields": ignored or [],
            **({"end_of_stream_assumed": cut} if cut else {})}


def host_summary(obs: Observations) -> dict[str, Any] | None:
    """Per phase, the mean cores the whole host, the run and everything else used (``chaos.host.contention``)."""
    from chaos.host.contention import CONTENTION_NOTE, phase_contention

    notes = obs.notes_on(CONTENTION_NOTE)
    if not notes:
        return None
    return {
        "cpus": notes[-1].data.get("cpus"),
        "target_processes_known": notes[-1].data.get("target_processes_known"),
        "phases": {name: {"busy_cores": round(p.busy, 3), "run_cores": round(p.run, 3),
                          "neighbour_cores": round(p.neighbour, 3),
                          "run_wait_cores": round(p.wait, 3)}
                   for name, p in phase_contention(obs).items()},
    }


def fleet_facts(obs: Observations) -> dict[str, Any]:
    """What the fleet's own signals said (``chaos.fleet``): the levers checked and how often, each
    ``safety.stop_when`` alert seen firing or resolving (with its value), and each source's reads."""
    lever = obs.notes_on("lever")
    watch = obs.notes_on("lever_watch")
    return {
        "lever": {**(dict(lever[-1].data) if lever else {}), **({"watch": dict(watch[-1].data)} if watch else {})},
        "stop_when": [{**n.data, "at_s": round((n.t - obs.t0) / 1e9, 4)} for n in obs.notes_on("stop_when")],
        "stop_when_reads": [dict(n.data) for n in obs.notes_on("stop_when_watch")],
    }


def halt_facts(obs: Observations) -> dict[str, Any] | None:
    """Why a halt condition stopped the run, when (``at_s``, from the run's start), and the top error
    messages then, when one did."""
    notes = obs.notes_on("halt")
    # the first: the one that stopped the run (a later condition found the run already stopping)
    return {**notes[0].data, "at_s": round((notes[0].t - obs.t0) / 1e9, 4)} if notes else None


def _junit(result: Result) -> ET.ElementTree:
    suite = ET.Element("testsuite", name=f"streamchaos.{result.experiment.name}", tests=str(len(result.verdicts)))
    failures = errors = 0
    for v in result.verdicts:
        case = ET.SubElement(suite, "testcase", classname=f"streamchaos.{result.experiment.name}",
                             name=verdict_label(v))
        detail = json.dumps(_clean({"figure": v.figure, "budget": v.budget, "unit": v.unit, "samples": v.samples,
                                    "evidence": v.evidence}), indent=1, default=str)
        if v.counts_as == "inconclusive" or v.tolerated:  # (unobservable: skipped unless it counts as failed)
            message = verdict_line(v, evidence=False)
            if v.status == "unobservable":
                message += f"; {verdict_why(v)} [{unobservable_note(v)}]"
            ET.SubElement(case, "skipped", message=message).text = detail
        elif not v.ok:
            failures += 1
            ET.SubElement(case, "failure", message=verdict_line(v, evidence=False)).text = detail
    if result.status != "completed":
        errors += 1
        case = ET.SubElement(suite, "testcase", classname=f"streamchaos.{result.experiment.name}", name="run")
        ET.SubElement(case, "error", message=result.status).text = result.error or ""
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    return ET.ElementTree(suite)


def render_summary(result: Result, *, page_name: str = "report.html", width: int | None = None) -> str:
    """The terminal account of a run: its cause first when it failed, the verdict table when there
    are verdicts (why under each failed or inconclusive one, wrapped to ``width`` columns, default the
    terminal's), the outcome, and last where its page is (``open: .../report.html``)."""
    from chaos.model.outcome import ended, judged_nothing, next_steps

    report = report_dict(result)
    load = report["load"]
    lag = load.get("client_lag") or {}
    lines: list[str] = []
    if result.error:
        lines.append(f"error: {result.error}")
    if judged_nothing(report):
        lines.append(f"{result.experiment.name}: the run {ended(result.status)} before any verdict: nothing was judged "
                     f"(exit {result.exit_code})")
        steps = next_steps(result.error, result.status)
        if steps:
            lines.append("check:")
            lines.extend(f"  - {step}" for step in steps)
        lines.append(f"open: {Path(result.out_dir) / page_name}")
        return "\n".join(lines)
    if lines:
        lines.append("")
    lines.extend(verdict_table(result.verdicts, width=width or shutil.get_terminal_size((100, 24)).columns))
    if unseen := unobservable_lines(result.verdicts):
        lines.append("")
        lines.extend(unseen)
    lines.append("")
    lines.append(
        f"{result.experiment.name}: {result.status}, {load['streams']} streams "
        f"({load['complete']} complete, {load['hung_up_on_purpose']} hung up by client faults), "
        + (f"client lag p99 {lag['p99_ms']:.2f}ms" if lag.get("samples") else "no client lag measured")
        + "".join(f", send delay p99 {d['p99_ms']:.2f}ms ({p or 'run'})"
                  for p, d in (lag.get("send_delay") or {}).items())
        + f", exit {result.exit_code}"
    )
    lines.extend(timing_lines(report))
    lines.extend(moved_lines(report))
    lines.extend(engine_phase_lines(report))
    if result.status == "halted":
        for entry in report["errors"]["top"]:
            lines.append(f"  {entry['count']:>6} x {entry['message']}")
    engine = (report.get("target") or {}).get("engine")
    if engine:
        dropped = ", ".join(engine["dropped_fields"]) or "nothing"
        lines.append(f"engine profile: {engine['profile']} ({engine['detected_by']}); dropped from requests: {dropped}")
        lines.extend(ignored_lines(engine.get("ignored_fields") or []))
        if engine.get("end_of_stream_assumed"):
            lines.append("  end-of-stream rule assumed from the profile, not observed: "
                         f"{engine['end_of_stream_assumed']}")
    lines.append(f"open: {Path(result.out_dir) / page_name}")
    return "\n".join(lines)


def ignored_lines(ignored: list[dict[str, Any]], indent: str = "  ") -> list[str]:
    """The fields the server took and ignored (the preflight's ``ignored_fields``), and for each the
    verdicts and figures that changes (their names; report.json says how)."""
    if not ignored:
        return []
    lines = [indent + "ignored by the server: " + ", ".join(f"{i.get('field')} ({i.get('evidence')})" for i in ignored)]
    for item in ignored:
        names = list(dict.fromkeys(str(a).partition(":")[0] for a in item.get("affects") or ()))
        if names:
            lines.append(f"{indent}  {item.get('field')} ignored changes: {', '.join(names)} "
                         "(how: report.json target.engine.ignored_fields)")
    return lines


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def timing_lines(report: dict[str, Any]) -> list[str]:
    """One line per phase: planned vs actual duration, and each of its faults' actual vs planned time in force."""
    lines = []
    for phase in report.get("phases") or []:
        top, until = phase.get("planned_max_s"), until_text(phase)
        text = (f"phase {phase['name']}: {_secs(phase.get('actual_duration_s'))} of {phase['planned_duration_s']:g}s"
                + ("" if top is None else f"–{top:g}s") + " planned" + ("" if until is None else f" ({until})"))
        start, in_force = phase.get("start_s"), phase.get("in_force_at_s")
        took = [f"its injects took {in_force - start:.2f}s"] if (
            in_force is not None and start is not None and in_force - start >= 0.01) else []
        if (reverts := phase.get("reverts_took_s")) is not None and reverts >= 0.01:
            took.append(f"its reverts {reverts:.2f}s")
        if took:
            text += f" ({', '.join(took)}; faults in force {_secs(phase.get('in_force_duration_s'))} of it)"
        for fault in report.get("faults") or []:
            if fault.get("phase") == phase["name"]:
                text += (f"; {fault['name']} in force {_secs(fault.get('actual_in_force_s'))} of "
                         f"{fault['planned_in_force_s']:g}s")
                outage = (fault.get("revert_evidence") or {}).get("outage_s")
                if isinstance(outage, (int, float)):
                    text += f", outage {outage:.2f}s (kill sent to serving again)"
        lines.append(text)
    return lines


def engine_phase_lines(report: dict[str, Any]) -> list[str]:
    """What the engine's counters say per phase (``engine_phases``): the prefix cache's hit rate, and the
    mean time requests queued and spent in prefill, each where the engine exports it."""
    phases = report.get("engine_phases") or {}
    rates = [f"{name} {p['prefix_cache_hit_rate']:.1%}" for name, p in phases.items()
             if p.get("prefix_cache_hit_rate") is not None]
    split = [f"{name} {p['queue_mean_s'] * 1000:.0f}ms + {p['prefill_mean_s'] * 1000:.0f}ms"
             for name, p in phases.items() if p.get("queue_mean_s") is not None and p.get("prefill_mean_s") is not None]
    return ([f"prefix cache hit rate: {', '.join(rates)}"] if rates else []) + (
        [f"engine time queued + in prefill (mean): {', '.join(split)}"] if split else [])


def moved_lines(report: dict[str, Any]) -> list[str]:
    """One line per fault that took streams sent in another phase (judged in its phase instead:
    ``Observations.population``)."""
    return [f"{f['name']} touched {f['touched_streams']} streams, {f['moved_from_other_phases']} of them sent in "
            f"another phase: judged in {f.get('phase') or '-'}, where the fault was"
            for f in report.get("faults") or [] if f.get("moved_from_other_phases")]


_XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(body: str) -> bytes:
    """An XML document without the characters XML 1.0 cannot hold (a target's control bytes in an error)."""
    return ("<?xml version='1.0' encoding='utf-8'?>\n" + _XML_INVALID.sub("", body)).encode("utf-8", "replace")


def write_reports(result: Result, *, json_name: str = "report.json", html_name: str | None = "report.html",
                  junit_name: str | None = "junit.xml", replace: bool = False) -> None:
    """The run's report files, each created new (0600, never through a link; ``replace``: renamed over
    an earlier one). Each is written even when another fails; then a page's bug is raised as it is, and
    files the host refused (a name taken, a full disk) as one ``ReportWriteFailed`` naming each (exit 4)."""
    out = Path(result.out_dir)
    write = replace_file if replace else write_new
    report = report_dict(result)
    pages: list[tuple[str, Callable[[], str | bytes]]] = [(json_name,
                                                           lambda: json.dumps(report, indent=2, default=str))]
    if html_name:
        from chaos.output.reports.page import render_html

        pages.append((html_name, lambda: render_html(report, result.observations)))
    if junit_name:
        pages.append((junit_name, lambda: _xml_text(ET.tostring(cast(ET.Element, _junit(result).getroot()),
                                                                encoding="unicode"))))
    failures: list[str] = []
    bug: Exception | None = None
    for name, render in pages:
        try:
            data = render()  # a credential a target echoed, a URL's userinfo: never written (chaos.host.redact)
            write(out / name, redact_bytes(data) if isinstance(data, bytes) else redact(data))
        except OSError as exc:  # the other files are still written; each one that was not is named below
            failures.append(f"{out / name}: {_why_not_written(exc)}")
        except Exception as exc:  # noqa: BLE001 - a page's bug: the other files are still written; raised below
            bug = bug or exc
    if bug is not None:
        raise bug
    if failures:
        written = [name for name, _ in pages if not any(f.startswith(f"{out / name}:") for f in failures)]
        raise ReportWriteFailed("could not write " + "; ".join(failures)
                                + (f" (written: {', '.join(written)})" if written else ""))


def _why_not_written(exc: OSError) -> str:
    """Why a report file was not written, in words (its errno's text kept)."""
    if isinstance(exc, FileExistsError):
        return "something is already there (a file or a link, not written through); give a new --out"
    return exc.strerror or str(exc)


class ReportWriter:
    """Run listener: writes the run's report files when it finishes."""

    def __init__(self, *, json_name: str = "report.json", html_name: str | None = "report.html",
                 junit_name: str | None = "junit.xml",
                 replace: bool = False) -> None:
        self.json_name, self.html_name, self.junit_name, self.replace = json_name, html_name, junit_name, replace

    def on_event(self, event: RunEvent) -> None:
        if isinstance(event, RunFinished):
            try:
                write_reports(event.result, json_name=self.json_name, html_name=self.html_name,
                              junit_name=self.junit_name, replace=self.replace)
            finally:  # the run's last files: its directory's descriptor is let go (chaos.host.runfiles)
                release_dir(event.result.out_dir)
