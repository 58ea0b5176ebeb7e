"""What a capacity search leaves: ``capacity.json`` (the answers and every probe), ``capacity.html``
(per case the probed levels, passes and failures, and the interval), and the terminal summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos.host.runfiles import release_dir, write_new
from chaos.output.reports.html import esc, page, plot_figure, section

__all__ = ["render_html", "write_capacity_report"]

PASS_COLOUR, FAIL_COLOUR, UNSURE_COLOUR, RANGE_COLOUR = "#1a7f37", "#cf222e", "#9a6700", "#0969da"


def write_capacity_report(body: dict[str, Any], out_dir: Path) -> list[Path]:
    """capacity.json and capacity.html in ``out_dir`` (created 0600, never following a link); the search's
    last files, so its directory's descriptor is let go after them (``chaos.host.runfiles``)."""
    json_path, html_path = out_dir / "capacity.json", out_dir / "capacity.html"
    try:
        write_new(json_path, json.dumps(body, indent=2, default=str) + "\n")
        write_new(html_path, render_html(body))
    finally:
        release_dir(out_dir)
    return [json_path, html_path]


def _plot(body: dict[str, Any]) -> str:
    from chaos.output.reports.plot import data_gid, log_scale, new_figure, to_svg

    cases = body["cases"]
    fig, (ax,) = new_figure(7.0, 1.2 + 0.45 * len(cases), margins_in=(1.5, 0.3, 0.5, 0.55))
    labelled: set[str] = set()
    for row, case in enumerate(cases):
        lo, hi = case["capacity"]["passing"], case["capacity"]["failing"]
        if lo is not None or hi is not None:
            left = lo if lo is not None else body["bounds"][0]
            right = hi if hi is not None else body["bounds"][1]
            ax.plot([left, right], [row, row], color=RANGE_COLOUR, linewidth=6, alpha=0.35, solid_capstyle="butt",
                    gid=data_gid(f"interval-{case['case']}"))
        for outcome, colour, marker in (("pass", PASS_COLOUR, "o"), ("fail", FAIL_COLOUR, "x"),
                                        ("inconclusive", UNSURE_COLOUR, "s")):
            levels = [p["level"] for p in case["probes"] if p["outcome"] == outcome]
            if levels:
                ax.scatter(levels, [row] * len(levels), color=colour, marker=marker, s=28, zorder=3,
                           label=None if outcome in labelled else outcome,
                           gid=data_gid(f"probes-{case['case']}-{outcome}"))
                labelled.add(outcome)
    ax.set_yticks(range(len(cases)), [c["case"] for c in cases])
    ax.set_ylim(-0.6, len(cases) - 0.4)
    ax.invert_yaxis()
    log_scale(ax, "x")
    ax.set_xlabel(f"{body['dimension']} ({body['unit']})")
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=3)  # above the axes: never over a probe
    return to_svg(fig, label=f"capacity per case of {body['experiment']}")


def _table(body: dict[str, Any]) -> str:
    rows = []
    for case in body["cases"]:
        lost = case.get("lost") or {}
        lost_text = "" if not lost else (
            f"{_pct(lost.get('point'))} (between {_pct(lost.get('at_least'))} and {_pct(lost.get('at_most'))})")
        rows.append(f"<tr><td>{esc(case['case'])}</td><td>{esc(', '.join(case['faults']) or '-')}</td>"
                    f"<td>{_num(case['capacity']['passing'])}</td><td>{_num(case['capacity']['failing'])}</td>"
                    f"<td>{esc(', '.join(case['bound_by']) or '-')}</td><td>{esc(lost_text or '-')}</td>"
                    f"<td>{len(case['probes'])}</td><td>{esc(case['why'])}</td></tr>")
    head = ("<tr><th>case</th><th>faults</th><th>met every SLA at</th><th>failed at</th><th>bound by</th>"
            "<th>capacity lost</th><th>probes</th><th>how it ended</th></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _probes(body: dict[str, Any]) -> str:
    rows = []
    for case in body["cases"]:
        for p in case["probes"]:
            verdicts = "; ".join(_verdict(name, v) for name, v in p["verdicts"].items())
            rows.append(f"<tr><td>{esc(case['case'])}</td><td>{_num(p['level'])}</td><td>{p['window_s']:g}s</td>"
                        f"<td>{esc(p['outcome'])}</td><td>{esc(verdicts)}</td><td>{esc(p['run_dir'])}</td></tr>")
    head = "<tr><th>case</th><th>level</th><th>window</th><th>outcome</th><th>verdicts</th><th>run</th></tr>"
    return f"<table>{head}{''.join(rows)}</table>"


def render_html(body: dict[str, Any]) -> str:
    svg = _plot(body)
    points = sum(len(c["probes"]) for c in body["cases"])
    intro = (f"<p>{esc(body['dimension'])} from {_num(body['bounds'][0])} to {_num(body['bounds'][1])} "
             f"{esc(body['unit'])}, resolution {body['resolution']:.0%}, SLAs {esc(', '.join(body['slas']))}; "
             f"{body['probes']} probes ({body.get('runs', body['probes'])} runs, undecided ones lengthened) in "
             f"{body['took_s']:.0f}s of a {body['budget_s']:.0f}s budget; "
             f"exit {body['exit_code']}.</p>")
    caption = ("each case's probes (o met every SLA, x did not, square inconclusive) and its capacity interval: "
               "from the highest level that met every SLA to the lowest that did not")
    content = (intro + plot_figure("capacity", svg, caption, points)
               + section("cases", "Capacity per case", _table(body)) + section("probes", "Every probe", _probes(body)))
    return page(f"capacity: {body['experiment']}", f"<h1>Capacity under fault: {esc(body['experiment'])}</h1>"
                + content)


def _verdict(name: str, v: dict[str, Any]) -> str:
    figure = v.get("figure")
    return f"{name} {v['status']}" + (f" {figure:.4g}" if isinstance(figure, (int, float)) else "")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.0%}"
