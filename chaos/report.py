"""Reports of a finished run: report.json (the contract), junit.xml, and the terminal summary."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from chaos.observations import Observations

__all__ = ["fault_timeline", "render_summary", "report_dict", "write_reports"]


def fault_timeline(obs: Observations) -> list[dict[str, Any]]:
    """Each fault with its inject/revert times in seconds from the run's start, and evidence."""
    by_name: dict[str, dict[str, Any]] = {}
    for event in obs.faults:
        entry = by_name.setdefault(
            event.fault,
            {"name": event.fault, "kind": event.kind, "phase": event.phase, "injected_at": None, "reverted_at": None,
             "evidence": {}, "revert_evidence": {}, "errors": []},
        )
        at = round((event.t - obs.t0) / 1e9, 4)
        if event.action == "inject":
            entry["injected_at"], entry["evidence"] = at, event.evidence
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


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def report_dict(result: Any) -> dict[str, Any]:
    obs: Observations = result.observations
    population = obs.population()
    target = result.target
    return _clean({
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
            "device": target.device, "model": target.model,
        },
        "proxy": None if result.proxy is None else {
            "server": result.proxy.server, "api_url": result.proxy.api_url, "listen": result.proxy.listen,
            "upstream": result.proxy.upstream,
        },
        "phases": [
            {"name": p.name, "start_s": round((p.t_start - obs.t0) / 1e9, 4),
             "end_s": None if p.t_end is None else round((p.t_end - obs.t0) / 1e9, 4)}
            for p in obs.phases
        ],
        "faults": fault_timeline(obs),
        "gpu": gpu_summary(obs),
        "load": {
            "streams": len(population),
            "background_streams": len(obs.streams) - len(population),
            "complete": sum(1 for s in population if s.complete),
            "hung_up_on_purpose": sum(1 for s in population if s.hangup is not None),
            "client_lag": result.client_lag,
        },
        "verdicts": [v.to_dict() for v in result.verdicts],
    })


def _junit(result: Any) -> ET.ElementTree:
    suite = ET.Element("testsuite", name=f"streamchaos.{result.experiment.name}", tests=str(len(result.verdicts)))
    failures = errors = 0
    for v in result.verdicts:
        case = ET.SubElement(suite, "testcase", classname=f"streamchaos.{result.experiment.name}", name=f"{v.name or v.sla}[{v.phase or 'run'}]")
        detail = json.dumps(_clean({"figure": v.figure, "budget": v.budget, "unit": v.unit, "samples": v.samples, "evidence": v.evidence}), indent=1, default=str)
        if v.status == "inconclusive":
            ET.SubElement(case, "skipped", message="inconclusive").text = detail
        elif not v.ok:
            failures += 1
            ET.SubElement(case, "failure", message=f"{v.sla} {v.status} (expected {v.expect})").text = detail
    if result.status != "completed":
        errors += 1
        case = ET.SubElement(suite, "testcase", classname=f"streamchaos.{result.experiment.name}", name="run")
        ET.SubElement(case, "error", message=result.status).text = result.error or ""
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    return ET.ElementTree(suite)


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value * 1000:.1f}ms"
    if unit == "fraction":
        return f"{value * 100:.2f}%"
    return f"{value:.4g} {unit}".strip()


def _samples(v: Any) -> str:
    """``n``, or ``n (n_eff 41)`` when correlation made the samples worth fewer independent ones."""
    n_eff = v.evidence.get("n_eff") if isinstance(v.evidence, dict) else None
    if isinstance(n_eff, (int, float)) and n_eff < v.samples:
        return f"{v.samples} (n_eff {n_eff:.0f})"
    return str(v.samples)


def render_summary(result: Any) -> str:
    """The terminal table: one row per verdict, then the outcome."""
    rows = [("SLA", "PHASE", "STATUS", "FIGURE", "BUDGET", "N")]  # N: samples, and their effective size
    for v in result.verdicts:
        status = v.status.upper() + ("" if v.expect == "pass" else f" (expect {v.expect})")
        mark = "ok " if v.ok else "!! "
        rows.append((mark + (v.name or v.sla), v.phase or "run", status, _fmt(v.figure, v.unit), _fmt(v.budget, v.unit), _samples(v)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    report = report_dict(result)
    load = report["load"]
    lag = load.get("client_lag") or {}
    lines.append("")
    lines.append(
        f"{result.experiment.name}: {result.status}, {load['streams']} streams "
        f"({load['complete']} complete, {load['hung_up_on_purpose']} hung up by client faults), "
        f"client lag p99 {lag.get('p99_ms', float('nan')):.2f}ms, exit {result.exit_code}"
    )
    if result.error:
        lines.append(f"error: {result.error}")
    lines.append(f"report: {Path(result.out_dir) / 'report.json'}")
    return "\n".join(lines)


def write_reports(result: Any) -> None:
    out = Path(result.out_dir)
    report = report_dict(result)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    from chaos.html_report import render_html

    (out / "report.html").write_text(render_html(report, result.observations), encoding="utf-8")
    _junit(result).write(out / "junit.xml", encoding="utf-8", xml_declaration=True)
