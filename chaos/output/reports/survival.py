"""The stream-survival matrix's page (``streamchaos survival``): per dimension the longest duration
that arrived whole, the shortest that was cut, the hop that cut and how the client saw it, in a
table; every probe on one plot. Pure: the ``survival.json`` body in, HTML out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chaos.output.reports.html import esc, page, plot_figure, section

__all__ = ["render_survival", "survival_plot", "survival_table"]

WHOLE_COLOUR, CUT_COLOUR, ERROR_COLOUR, RANGE_COLOUR = "#1a7f37", "#cf222e", "#9a6700", "#0969da"
_MARKS = (("whole", WHOLE_COLOUR, "o"), ("cut", CUT_COLOUR, "x"), ("error", ERROR_COLOUR, "s"))


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:g}s"


def _answer(dim: Mapping[str, Any]) -> str:
    """The dimension's answer in words: survives >= max, cut between two durations, or what is known."""
    whole, cut = dim.get("longest_whole_s"), dim.get("shortest_cut_s")
    if dim.get("survives_max"):
        return f"survives &ge; {_s(whole)}"
    if cut is None:
        return "not known" if whole is None else f"whole at {_s(whole)}; no cut seen"
    if whole is None:
        return f"cut at {_s(cut)} (and every shorter probe)"
    return f"cut between {_s(whole)} and {_s(cut)}"


def survival_table(dimensions: Sequence[Mapping[str, Any]]) -> str:
    """One row per dimension: its answer, the boundary, the hop that cut and how the client saw it."""
    rows = []
    for dim in dimensions:
        status = "" if dim.get("finished") else ' class="inconclusive"'
        rows.append(f'<tr data-dimension="{esc(dim["dimension"])}"><td>{esc(dim["dimension"])}</td>'
                    f'<td>{esc(dim.get("what", ""))}</td><td{status}>{_answer(dim)}</td>'
                    f'<td class="num">{_s(dim.get("longest_whole_s"))}</td>'
                    f'<td class="num">{_s(dim.get("shortest_cut_s"))}</td>'
                    f'<td class="num">{_s(dim.get("resolution_s"))}</td><td>{esc(dim.get("cut_by") or "-")}</td>'
                    f'<td>{esc(dim.get("client_saw") or "-")}</td><td class="num">{len(dim.get("probes", []))}</td>'
                    f'<td>{esc(dim.get("why", ""))}</td></tr>')
    head = ("<tr><th>dimension</th><th>what is held</th><th>answer</th><th>longest whole</th><th>shortest cut</th>"
            "<th>resolution</th><th>cut by</th><th>the client saw</th><th>probes</th><th>how it ended</th></tr>")
    return f"<table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"


def _probes(dimensions: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for dim in dimensions:
        for p in dim.get("probes", []):
            rows.append(f"<tr><td>{esc(dim['dimension'])}</td><td class=\"num\">{_s(p['duration_s'])}</td>"
                        f"<td>{esc(p['outcome'])}</td><td class=\"num\">{p.get('wall_s', 0.0):.2f}s</td>"
                        f"<td>{esc(p.get('cut_by') or '-')}</td><td>{esc(p.get('client_saw') or '-')}</td>"
                        f"<td><code>{esc(p.get('request_id') or '-')}</code></td></tr>")
    head = ("<tr><th>dimension</th><th>duration</th><th>outcome</th><th>wall</th><th>cut by</th>"
            "<th>the client saw</th><th>request</th></tr>")
    return f"<table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"


def survival_plot(dimensions: Sequence[Mapping[str, Any]], max_s: float, experiment: str) -> str:
    """Each dimension a row: its probes (o whole, x cut) on a duration axis and its boundary as a band."""
    from chaos.output.reports.plot import data_gid, new_figure, to_svg

    fig, (ax,) = new_figure(7.0, 1.2 + 0.45 * max(1, len(dimensions)), margins_in=(1.5, 0.3, 0.5, 0.55))
    labelled: set[str] = set()
    for row, dim in enumerate(dimensions):
        whole, cut = dim.get("longest_whole_s"), dim.get("shortest_cut_s")
        if cut is not None:
            ax.plot([whole or 0.0, cut], [row, row], color=RANGE_COLOUR, linewidth=6, alpha=0.35,
                    solid_capstyle="butt", gid=data_gid(f"boundary-{dim['dimension']}"))
        for outcome, colour, marker in _MARKS:
            points = [p["duration_s"] for p in dim.get("probes", []) if p["outcome"] == outcome]
            if points:
                ax.scatter(points, [row] * len(points), color=colour, marker=marker, s=28, zorder=3,
                           label=None if outcome in labelled else outcome,
                           gid=data_gid(f"probes-{dim['dimension']}-{outcome}"))
                labelled.add(outcome)
    ax.set_yticks(range(len(dimensions)), [d["dimension"] for d in dimensions])
    ax.set_ylim(-0.6, max(1, len(dimensions)) - 0.4)
    ax.invert_yaxis()
    ax.set_xlim(0.0, max_s * 1.04)
    ax.set_xlabel("duration held (s)")
    if labelled:
        ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=3)  # above the axes: never over a probe
    return to_svg(fig, label=f"stream survival per dimension of {experiment}")


def _hops(path: Sequence[Mapping[str, Any]]) -> str:
    if not path:
        return '<p class="muted">No hops.</p>'
    rows = "".join(f"<tr><td>{i}</td><td>{esc(h.get('name'))}</td><td>{esc(h.get('kind'))}</td>"
                   f"<td>{esc(h.get('version') or '-')}</td></tr>" for i, h in enumerate(path, 1))
    return ("<p>load side first; the rules act on the innermost stream hop; the target follows the last hop.</p>"
            f"<table><thead><tr><th>#</th><th>hop</th><th>kind</th><th>version</th></tr></thead><tbody>{rows}"
            "</tbody></table>")


def render_survival(body: Mapping[str, Any]) -> str:
    """The whole page: what was searched and how it ended, the matrix, the plot, the path, every probe."""
    dims = list(body.get("dimensions", []))
    points = sum(len(d.get("probes", [])) for d in dims)
    unfinished = list(body.get("not_finished", []))
    intro = (f"<p class=\"summary\">The path {esc(' → '.join(h.get('name', '?') for h in body.get('path', [])))} "
             f"→ target, rules on {esc(body.get('rule_hop') or '-')}: up to {_s(body.get('max_s'))}, resolution "
             f"{_s(body.get('resolution_s'))}, keep-alive comments every {_s(body.get('keepalive_s'))}; "
             f"{points} probes in {body.get('took_s', 0.0):.0f}s of a {body.get('budget_s', 0.0):.0f}s budget; "
             f"exit {body.get('exit_code')}.</p>")
    if body.get("interrupted"):
        intro += ('<p class="inconclusive">Interrupted (SIGINT or SIGTERM): the search stopped there, the target '
                  "and the path were stopped; what it had found is below.</p>")
    if unfinished:
        intro += f"<p class=\"inconclusive\">Not finished: {esc(', '.join(unfinished))}.</p>"
    for error in body.get("errors", []):
        intro += f'<p class="fail">{esc(error)}</p>'
    caption = ("each dimension's probes (o arrived whole, x cut, square could not run) and its boundary: from the "
               "longest duration that arrived whole to the shortest that was cut")
    content = (intro + section("matrix", "Survival matrix", survival_table(dims))
               + plot_figure("survival", survival_plot(dims, float(body.get("max_s") or 1.0),
                                                       str(body.get("experiment", ""))), caption, points)
               + section("path", "The path", _hops(body.get("path", [])))
               + section("probes", "Every probe", _probes(dims)))
    title = f"stream survival: {body.get('experiment', '')}"
    return page(title, f"<h1>Stream survival: {esc(body.get('experiment', ''))}</h1>" + content)
