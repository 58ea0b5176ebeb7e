"""Two runs side by side: per SLA entry and phase, both figures, the change, and whether it is
significant — with the statistics the verdicts themselves used. Pure: two report.json dicts in.

Which test, and why:
- quantile verdicts (``ttft``, ``itl``, anything whose evidence carries ``lower``/``upper``): the
  change is significant when the two runs' distribution-free confidence intervals for the quantile
  are disjoint — the very intervals the verdicts were decided on (``sla.stats.quantile_bounds``),
  read from the evidence. A rank test (as ``recovery`` uses) would answer another question: it
  detects a shift of the whole distribution, so it flags a moved median under an unchanged p99
  and can miss a tail that grew while the median stayed. Disjoint 95% intervals are conservative
  (the two-sample error rate is well under 5%); when a run has too few samples for a bound the
  row says so instead of guessing.
- share verdicts (``errors``, ``early_close``: evidence with ``streams`` and ``failed`` or
  ``incomplete`` counts): the verdict itself compares a share with a budget and has no interval,
  so two shares are compared with Fisher's exact test on those counts (two-sided, ``alpha``).
- everything else (rates, ratios, cleanup times): the change is shown, no test is claimed.
A row is flagged when the change is significant, in the worse direction and at least
``min_change`` relative (so thousands of samples do not flag a 2% drift) and, for a latency, at
least ``min_delay`` absolute (a healthy stack's TTFT p50 moved 9.9 → 14.3 ms, +45% with disjoint
intervals, between two runs on a busy 2-core CI box: milliseconds of scheduling, not a regression;
``recovery``'s ``slack`` is the same floor), or when a verdict that was as expected is no longer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sla  # noqa: F401  (importing the package registers every verifier)
from chaos.output.render import format_value
from sla.base import REGISTRY

__all__ = ["Row", "change_text", "compare_reports", "compare_table", "higher_is_better", "render_compare",
           "significance", "significance_text"]

_SHARE_COUNTS = ("failed", "incomplete")


@dataclass(frozen=True)
class Row:
    """One SLA entry on one phase in both runs."""

    name: str
    kind: str
    phase: str
    unit: str
    a: Mapping[str, Any] | None  # the verdict dict in run A (None: not judged there)
    b: Mapping[str, Any] | None
    change: float | None  # figure B - figure A
    relative: float | None  # change / |figure A|
    test: str  # which test decided ``significant``
    significant: bool | None  # None: no test applies or it could not be carried out
    worse: bool | None  # B worse than A
    flag: str  # "" or why the row is flagged

    @property
    def flagged(self) -> bool:
        return bool(self.flag)


def higher_is_better(kind: str) -> bool:
    """Whether ``kind``'s figure is a floor (more is better: ``SlaSpec.better``). A kind this install
    does not know (a report from another version) is taken for a ceiling, as most kinds are."""
    spec = REGISTRY.get(kind)
    return spec is not None and spec.better == "higher"


def _key(v: Mapping[str, Any]) -> tuple[str, str]:
    return str(v.get("name") or v["sla"]), str(v.get("phase") or "run")


def _quantile_test(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[str, bool | None]:
    ea, eb = a.get("evidence") or {}, b.get("evidence") or {}
    q, conf = ea.get("quantile"), ea.get("confidence")
    label = (f"{conf:.0%} intervals of the p{round(q * 100, 4):g}" if isinstance(q, float) and isinstance(conf, float)
             else "intervals")
    if ea.get("quantile") != eb.get("quantile"):
        return "quantiles differ between the runs", None
    up = eb.get("lower") is not None and ea.get("upper") is not None and eb["lower"] > ea["upper"]
    down = ea.get("lower") is not None and eb.get("upper") is not None and ea["lower"] > eb["upper"]
    if up or down:
        return f"{label} disjoint", True
    comparable = ((ea.get("upper") is not None and eb.get("lower") is not None)
                  or (ea.get("lower") is not None and eb.get("upper") is not None))
    if not comparable:
        return f"{label}: too few samples for a bound", None
    return f"{label} overlap", False


def _share_counts(v: Mapping[str, Any]) -> tuple[int, int] | None:
    ev = v.get("evidence") or {}
    total = ev.get("streams")
    bad = next((ev[k] for k in _SHARE_COUNTS if isinstance(ev.get(k), int)), None)
    if isinstance(total, int) and bad is not None and total > 0:
        return bad, total
    return None


def significance(a: Mapping[str, Any], b: Mapping[str, Any], alpha: float = 0.05) -> tuple[str, bool | None]:
    """(which test, significant?) for two verdicts of one SLA entry and phase; None where no test applies."""
    for v in (a, b):
        decided = (v.get("evidence") or {}).get("decided_by")
        if decided not in (None, "quantile"):
            return f"none (decided by {decided}, a single observation)", None
    ea, eb = a.get("evidence") or {}, b.get("evidence") or {}
    if any(k in ea for k in ("lower", "upper")) and any(k in eb for k in ("lower", "upper")):
        return _quantile_test(a, b)
    ca, cb = _share_counts(a), _share_counts(b)
    if ca is not None and cb is not None:
        from scipy.stats import fisher_exact

        table = [[ca[0], ca[1] - ca[0]], [cb[0], cb[1] - cb[0]]]
        p = float(fisher_exact(table).pvalue)
        return f"Fisher exact on {ca[0]}/{ca[1]} vs {cb[0]}/{cb[1]}, p={p:.3g}", p < alpha
    return "none (no interval or counts in the evidence)", None


def _figure(v: Mapping[str, Any] | None) -> float | None:
    if v is None or v.get("figure") is None:
        return None
    value = float(v["figure"])
    return value if math.isfinite(value) else None


MIN_DELAY_S = 0.010  # the smallest latency change worth flagging by default


def _row(name: str, phase: str, a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, alpha: float,
         min_change: float, min_delay: float = MIN_DELAY_S) -> Row:
    some = b or a
    assert some is not None
    kind, unit = str(some["sla"]), str(some.get("unit") or "")
    fa, fb = _figure(a), _figure(b)
    change = fb - fa if fa is not None and fb is not None else None
    relative = change / abs(fa) if change is not None and fa else None
    test, significant = ("not judged in both runs", None) if a is None or b is None else significance(a, b, alpha)
    worse = None if change is None else (change < 0 if higher_is_better(kind) else change > 0)
    flag = ""
    if a is not None and b is not None and a.get("ok") and not b.get("ok"):
        flag = f"verdict: {a['status']} → {b['status']}"
    elif (significant and worse and some.get("expect", "pass") == "pass"
          and (relative is None or abs(relative) >= min_change)
          and (unit != "s" or change is None or abs(change) >= min_delay)):
        # (an ``expect: fail`` entry checks the instrument, not the stack: its getting "worse" is no regression)
        flag = "regression: significantly worse"
    return Row(name, kind, phase, unit, a, b, change, relative, test, significant, worse, flag)


def compare_reports(a: Mapping[str, Any], b: Mapping[str, Any], *, alpha: float = 0.05,
                    min_change: float = 0.10, min_delay: float = MIN_DELAY_S) -> list[Row]:
    """One row per SLA entry and phase judged in either run, in run B's order (then A's leftovers)."""
    va = {_key(v): v for v in a.get("verdicts") or []}
    vb = {_key(v): v for v in b.get("verdicts") or []}
    keys = list(vb) + [k for k in va if k not in vb]
    return [_row(name, phase, va.get((name, phase)), vb.get((name, phase)), alpha, min_change, min_delay)
            for name, phase in keys]


def _cell(v: Mapping[str, Any] | None) -> str:
    if v is None:
        return "-"
    return f"{format_value(_figure(v), v.get('unit') or '')} {v['status']}"


def change_text(row: Row) -> str:
    if row.change is None:
        return "-"
    sign = "+" if row.change >= 0 else "-"
    text = sign + format_value(abs(row.change), row.unit).lstrip("+")
    if row.relative is not None:
        text += f" ({row.relative:+.0%})"
    return text


def significance_text(row: Row) -> str:
    verdict = {True: "yes", False: "no", None: "n/a"}[row.significant]
    return f"{verdict}: {row.test}"


def compare_table(rows: Sequence[Row], label_a: str = "A", label_b: str = "B") -> list[str]:
    """The terminal table: one line per row, flagged rows marked ``!!``."""
    table = [("", "SLA", "PHASE", label_a, label_b, "CHANGE", "SIGNIFICANT", "FLAG")]
    for row in rows:
        table.append(("!!" if row.flagged else "", row.name, row.phase, _cell(row.a), _cell(row.b), change_text(row),
                      significance_text(row), row.flag))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def protocol_of(report: Mapping[str, Any]) -> str:
    """The protocol(s) the run's load spoke, in words: ``h2``, ``http/1.1``, ``h2 + http/1.1``; ``?`` for a
    report from before the load recorded it. Pure."""
    protocols = (report.get("load") or {}).get("protocols") or {}
    return " + ".join(sorted(protocols, key=lambda p: -protocols[p])) if protocols else "?"


def setup_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """How the two runs were set up differently, in words (the protocol of the load, the target, the hops
    in its path), so a comparison says what it compares. Pure."""
    out = []
    if protocol_of(a) != protocol_of(b):
        out.append(f"load protocol: {protocol_of(a)} (A) vs {protocol_of(b)} (B)")
    kinds = [(r.get("target") or {}).get("kind") for r in (a, b)]
    if kinds[0] != kinds[1]:
        out.append(f"target: {kinds[0]} (A) vs {kinds[1]} (B)")
    paths = [" → ".join(str(h.get("kind")) for h in (r.get("path") or [])) or "direct" for r in (a, b)]
    if paths[0] != paths[1]:
        out.append(f"path: {paths[0]} (A) vs {paths[1]} (B)")
    return out


def _run_header(report: Mapping[str, Any], label: str) -> str:
    from datetime import UTC, datetime

    from chaos.output.reports.html import esc

    start = report.get("start")
    when = (datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if isinstance(start, (int, float))
            else "?")
    return (f"<tr><th>{esc(label)}</th><td>{esc(report.get('experiment'))}</td><td>{esc(when)}</td>"
            f"<td>{esc(report.get('status'))}, exit {esc(report.get('exit_code'))}</td>"
            f"<td>{esc((report.get('load') or {}).get('streams', 0))} streams</td>"
            f"<td>{esc(protocol_of(report))}</td></tr>")


def _intervals_figure(rows: Sequence[Row], label_a: str, label_b: str) -> tuple[str, int]:
    """Each row with a figure in both runs: the two figures, their intervals where the verdicts have
    them, and the budget, on the row's own axis."""
    from chaos.output.reports.plot import BUDGET_COLOUR, COLOURS, data_gid, new_figure, to_svg

    drawn = [r for r in rows if _figure(r.a) is not None and _figure(r.b) is not None]
    if not drawn:
        return "", 0
    fig, axes = new_figure(7.5, 0.5 + 0.8 * len(drawn), len(drawn), margins_in=(1.0, 0.2, 0.25, 0.3), hspace_in=0.45)
    points = 0
    for ax, row in zip(axes, drawn, strict=True):
        for y, v, colour in ((1, row.a, COLOURS[5]), (0, row.b, COLOURS[1] if row.flagged else COLOURS[0])):
            assert v is not None
            ev = v.get("evidence") or {}
            lo, hi = ev.get("lower"), ev.get("upper")
            if lo is not None and hi is not None:
                ax.plot([lo, hi], [y, y], color=colour, lw=5, alpha=0.35, solid_capstyle="butt")
            ax.plot([_figure(v) or 0.0], [y], marker="o", ms=5, color=colour,
                    gid=data_gid(f"compare-{row.name}-{row.phase}"))
            points += 1
        budget = (row.b or row.a or {}).get("budget")
        if budget is not None:
            ax.axvline(budget, color=BUDGET_COLOUR, lw=1)
        ax.set_yticks([1, 0], [label_a, label_b])
        ax.set_ylim(-0.6, 1.6)
        ax.set_title(f"{row.name} [{row.phase}] ({row.unit})" + ("  — flagged" if row.flagged else ""), fontsize=8,
                     loc="left")
    return to_svg(fig, label="figures and intervals of both runs"), points


def render_compare(a: Mapping[str, Any], b: Mapping[str, Any], rows: Sequence[Row], label_a: str, label_b: str) -> str:
    """The comparison page: both runs, the table, and each figure with its interval side by side."""
    from chaos.output.reports.html import esc, page, plot_figure, section

    flagged = [r for r in rows if r.flagged]
    body_rows = "".join(
        f'<tr class="{"flagged" if r.flagged else "row"}" data-sla="{esc(r.name)}" data-phase="{esc(r.phase)}">'
        f'<td class="flag">{"!!" if r.flagged else ""}</td><td>{esc(r.name)}</td><td>{esc(r.phase)}</td>'
        f'<td class="num">{esc(_cell(r.a))}</td><td class="num">{esc(_cell(r.b))}</td>'
        f'<td class="num">{esc(change_text(r))}</td><td>{esc(significance_text(r))}</td>'
        f'<td class="flag">{esc(r.flag)}</td></tr>'
        for r in rows
    )
    table = ('<table class="compare"><tr><th></th><th>SLA</th><th>phase</th>'
             f'<th>{esc(label_a)}</th><th>{esc(label_b)}</th>'
             f"<th>change</th><th>significant</th><th>flag</th></tr>{body_rows}</table>")
    svg, points = _intervals_figure(rows, label_a, label_b)
    plot = plot_figure("compare", svg,
                       f"Each figure in {esc(label_a)} (grey) and {esc(label_b)}; bars: the verdicts' own "
                       "confidence intervals; red line: the budget.", points) if svg else ""
    summary = (f'<p class="summary"><b class="fail">{len(flagged)} flagged</b></p>' if flagged
               else '<p class="summary"><b class="pass">nothing flagged</b></p>')
    body = "\n".join([
        f"<h1>{esc(b.get('experiment'))}: {esc(label_b)} against {esc(label_a)}</h1>",
        f"<table>{_run_header(a, label_a)}{_run_header(b, label_b)}</table>",
        summary,
        section("comparison", "Per SLA and phase",
                table + f'<p class="muted">{esc(__doc__.split(chr(10) + chr(10))[1].splitlines()[0])}</p>'),
        section("figures", "Figures side by side", plot),
    ])
    return page(f"streamchaos compare: {b.get('experiment')}", body)
