"""report.html: one self-contained page per run — verdicts, and a timeline that overlays the fault
windows, each request's TTFT, KV-cache usage and running requests. Inline SVG, no scripts, no
external assets, so it opens anywhere (a CI artifact, an air-gapped laptop)."""

from __future__ import annotations

import html
from typing import Any

from chaos.observations import Observations

__all__ = ["render_html"]

WIDTH, HEIGHT, PAD = 960, 260, 48
KV_SERIES = ("streamchaos_kv_blocks_used", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
RUNNING_SERIES = ("vllm:num_requests_running", "sglang:num_running_reqs", "tgi_batch_current_size")
STATUS_COLOURS = {"pass": "#1a7f37", "fail": "#cf222e", "inconclusive": "#9a6700"}


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _series(obs: Observations, names: tuple[str, ...]) -> tuple[str, list[tuple[float, float]]]:
    """The first series present, summed over label sets at each scrape, as (seconds, value)."""
    for name in names:
        samples = obs.series(name)
        if samples:
            by_t: dict[int, float] = {}
            for m in samples:
                by_t[m.t] = by_t.get(m.t, 0.0) + m.value
            return name, [((t - obs.t0) / 1e9, v) for t, v in sorted(by_t.items())]
    return "", []


def _timeline(obs: Observations, report: dict[str, Any]) -> str:
    points = [((s.t_sent - obs.t0) / 1e9, s.ttft_ns / 1e6) for s in obs.population() if s.t_sent is not None and s.ttft_ns is not None]
    kv_name, kv = _series(obs, KV_SERIES)
    run_name, running = _series(obs, RUNNING_SERIES)
    end = max([p["end_s"] or p["start_s"] for p in report["phases"]] + [x for x, _ in points + kv] + [1.0])
    ttft_max = max([y for _, y in points] + [1.0])
    x_of = lambda t: PAD + (WIDTH - 2 * PAD) * max(0.0, t) / end  # noqa: E731 - local scale
    y_of = lambda v, top: HEIGHT - PAD - (HEIGHT - 2 * PAD) * (v / top if top else 0.0)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="run timeline">']
    for i, phase in enumerate(report["phases"]):  # phase bands
        x0, x1 = x_of(phase["start_s"]), x_of(phase["end_s"] or end)
        out.append(f'<rect class="phase" x="{x0:.1f}" y="{PAD}" width="{max(0.0, x1 - x0):.1f}" height="{HEIGHT - 2 * PAD}" fill="{"#f6f8fa" if i % 2 == 0 else "#eaeef2"}"/>')
        out.append(f'<text x="{x0 + 4:.1f}" y="{PAD - 6}" font-size="11">{_esc(phase["name"])}</text>')
    for row, fault in enumerate(report["faults"]):  # fault windows
        if fault["injected_at"] is None:
            continue
        x0, x1 = x_of(fault["injected_at"]), x_of(fault["reverted_at"] if fault["reverted_at"] is not None else end)
        y = HEIGHT - PAD + 8 + 10 * row
        out.append(f'<rect class="fault" x="{x0:.1f}" y="{y}" width="{max(1.0, x1 - x0):.1f}" height="7" fill="#cf222e" opacity="0.7"><title>{_esc(fault["name"])} ({_esc(fault["kind"])})</title></rect>')
    for sent_s, ttft_s in points:  # each request's TTFT at its send time
        out.append(f'<circle class="ttft" cx="{x_of(sent_s):.1f}" cy="{y_of(ttft_s, ttft_max):.1f}" r="1.8" fill="#0969da" opacity="0.6"/>')
    for values, colour, name in ((kv, "#8250df", kv_name), (running, "#bf8700", run_name)):
        if values:
            top = max(v for _, v in values) or 1.0
            path = " ".join(f"{x_of(t):.1f},{y_of(v, top):.1f}" for t, v in values)
            out.append(f'<polyline class="series" points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"><title>{_esc(name)} (max {top:g})</title></polyline>')
    out.append(f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="#57606a"/>')
    out.append(f'<text x="{PAD}" y="{HEIGHT - PAD + 40 + 10 * len(report["faults"])}" font-size="11">0s</text>')
    out.append(f'<text x="{WIDTH - PAD - 30}" y="{HEIGHT - PAD + 40 + 10 * len(report["faults"])}" font-size="11">{end:.1f}s</text>')
    out.append(f'<text x="4" y="{PAD + 10}" font-size="11">{ttft_max:.0f}ms</text>')
    out.append("</svg>")
    legend = (f'<p class="legend"><span style="color:#0969da">● TTFT per request (left axis, ms)</span> · '
              f'<span style="color:#8250df">— {_esc(kv_name or "no KV series")}</span> · '
              f'<span style="color:#bf8700">— {_esc(run_name or "no running series")}</span> · '
              f'<span style="color:#cf222e">▬ fault windows</span> (series scaled to their own maximum)</p>')
    return "\n".join(out) + legend


def _samples(v: dict[str, Any]) -> str:
    """n, and the effective sample size when correlation made it smaller."""
    n_eff = (v.get("evidence") or {}).get("n_eff")
    if isinstance(n_eff, (int, float)) and n_eff < v["samples"]:
        return f"{v['samples']} (n_eff {n_eff:.0f})"
    return str(v["samples"])


def render_html(report: dict[str, Any], obs: Observations) -> str:
    """The page for one run, from its report.json dict and its observations. Pure."""
    rows = []
    for v in report["verdicts"]:
        colour = STATUS_COLOURS.get(v["status"], "#57606a")
        expect = "" if v["expect"] == "pass" else f" (expect {_esc(v['expect'])})"
        rows.append(
            f'<tr><td>{"✔" if v["ok"] else "✘"}</td><td>{_esc(v["name"] or v["sla"])}</td><td>{_esc(v["phase"] or "run")}</td>'
            f'<td style="color:{colour}">{_esc(v["status"])}{expect}</td><td>{_esc(v["figure"])}</td><td>{_esc(v["budget"])}</td>'
            f'<td>{_esc(v["unit"])}</td><td>{_esc(_samples(v))}</td></tr>'
        )
    faults = "".join(
        f"<li><b>{_esc(f['name'])}</b> ({_esc(f['kind'])}): injected {_esc(f['injected_at'])}s, reverted {_esc(f['reverted_at'])}s"
        + (f" — errors: {_esc('; '.join(f['errors']))}" if f["errors"] else "") + "</li>"
        for f in report["faults"]
    )
    load = report["load"]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>streamchaos: {_esc(report['experiment'])}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;color:#1f2328}}table{{border-collapse:collapse}}
td,th{{padding:3px 10px;border-bottom:1px solid #d0d7de;text-align:left}}.legend{{font-size:12px}}</style></head>
<body><h1>{_esc(report['experiment'])}</h1>
<p>{_esc(report.get('description') or '')}</p>
<p>status <b>{_esc(report['status'])}</b>, exit {_esc(report['exit_code'])}, {_esc(report['duration_s'])}s;
{_esc(load['streams'])} streams ({_esc(load['complete'])} complete, {_esc(load['hung_up_on_purpose'])} hung up by client faults)
{'; error: ' + _esc(report['error']) if report.get('error') else ''}</p>
<h2>Verdicts</h2>
<table><tr><th></th><th>SLA</th><th>phase</th><th>status</th><th>figure</th><th>budget</th><th>unit</th><th>n</th></tr>
{''.join(rows)}</table>
<h2>Timeline</h2>
{_timeline(obs, report)}
<h2>Faults</h2><ul>{faults or '<li>none</li>'}</ul>
</body></html>
"""
