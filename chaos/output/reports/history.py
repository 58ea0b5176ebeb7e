"""History of scheduled game-days: many runs of one experiment on one page.

Each SLA entry and phase over time (its figure with the verdict's own interval, the budget), the
verdicts as a streak table (one column per run, the current streak), and every run compared with
the one before it by ``chaos.output.reports.compare`` — the same statistics — with regressions flagged.
A series is the runs of one experiment against one target (``target_of``): a run is compared only
with the run before it against the same target, since another target's figures are no baseline.
Pure apart from ``load_runs``, which reads the run directories' report.json files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chaos.model.errors import UsageError
from chaos.output.reports.compare import MIN_DELAY_S, Row, compare_reports

__all__ = ["Run", "Transition", "history_lines", "latest_regressed", "load_runs", "read_report", "regressions",
           "render_history", "series", "streak", "target_of"]

_LOOPBACK = ("127.", "localhost", "[::1]", "::1")


@dataclass(frozen=True)
class Run:
    """One finished run: where it is and its report.json."""

    path: Path
    report: Mapping[str, Any]

    @property
    def start(self) -> float:
        value = self.report.get("start")
        return float(value) if isinstance(value, (int, float)) else 0.0

    @property
    def label(self) -> str:
        return datetime.fromtimestamp(self.start, UTC).strftime("%m-%d %H:%M:%S")

    @property
    def target(self) -> str:
        return target_of(self.report)


def target_of(report: Mapping[str, Any]) -> str:
    """The target a run was against, as its report.json records it: ``builtin tiny on cpu``, ``openai
    http://gpu-1:8000/v1 llama-3-8b, profile vllm``. The address counts unless the run chose it: a
    loopback address of a target kind other than ``openai`` is a spawned stack's, container's or
    port-forward's ephemeral port, new in every run. ``-`` when the report records no target."""
    target = report.get("target")
    if not isinstance(target, Mapping) or not target.get("kind"):
        return "-"
    kind, url = str(target["kind"]), str(target.get("base_url") or "")
    host = url.split("://", 1)[-1]
    spawned = kind != "openai" and host.startswith(_LOOPBACK)
    words = [kind, "" if spawned else url, str(target.get("model") or "")]
    text = " ".join(w for w in words if w)
    if target.get("device"):
        text += f" on {target['device']}"
    engine = target.get("engine")
    if isinstance(engine, Mapping) and engine.get("profile"):
        text += f", profile {engine['profile']}"
    return text


def series(runs: Sequence[Run]) -> list[tuple[str, list[Run]]]:
    """The runs grouped by target (``target_of``), each group oldest first, groups in order of their first run."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.target, []).append(run)
    return list(groups.items())


@dataclass(frozen=True)
class Transition:
    """A run compared with the one before it."""

    before: Run
    after: Run
    rows: list[Row]


def load_runs(root: Path, experiment: str | None = None, *, left_out: list[Path] | None = None) -> list[Run]:
    """Every run directory under ``root`` (one level down, or ``root`` itself) with a report.json, oldest first.

    A run that ended before any verdict (``chaos.model.outcome.judged_nothing``: its target never answered,
    it was stopped during setup) judged nothing and is not a run of the history; its directory is
    appended to ``left_out``. Raises ``UsageError`` when no run is left, or when they hold several
    experiments and none was chosen.
    """
    if not root.is_dir():
        raise UsageError(f"--history {root}: not a directory of run directories")
    runs, skipped = _scan(root)
    if left_out is not None:
        left_out.extend(skipped)
    if not runs:
        raise UsageError(f"--history {root}: no run directory with a report.json in it" if not skipped else
                         f"--history {root}: none of its {len(skipped)} run(s) got as far as a verdict (each failed or "
                         "was stopped during setup)")
    return sorted(_of_one_experiment(root, runs, experiment), key=lambda r: r.start)


def _scan(root: Path) -> tuple[list[Run], list[Path]]:
    """``root`` and its subdirectories with a report.json, in name order: the runs that judged something,
    and the directories of those that judged nothing."""
    from chaos.model.outcome import judged_nothing

    runs: list[Run] = []
    skipped: list[Path] = []
    for path in sorted([root, *root.iterdir()]):
        report_file = path / "report.json"
        if not path.is_dir() or not report_file.is_file():
            continue
        report = read_report(report_file)
        if judged_nothing(report):
            skipped.append(path)
            continue
        runs.append(Run(path, report))
    return runs, skipped


def read_report(report_file: Path) -> dict[str, Any]:
    """A run's report.json, parsed; ``UsageError`` naming the file when it is not one."""
    try:
        report = json.loads(report_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"{report_file}: not a readable report.json ({exc})") from None
    if not isinstance(report, dict) or "verdicts" not in report:
        raise UsageError(f"{report_file}: not a streamchaos report (no `verdicts`)")
    return report


def _of_one_experiment(root: Path, runs: list[Run], experiment: str | None) -> list[Run]:
    """The runs of ``experiment``; all of them when it is None and they are runs of one experiment."""
    names = sorted({str(r.report.get("experiment")) for r in runs})
    if experiment is not None:
        runs = [r for r in runs if r.report.get("experiment") == experiment]
        if not runs:
            raise UsageError(f"--history {root}: no run of experiment {experiment!r}; found {', '.join(names)}")
    elif len(names) > 1:
        raise UsageError(f"--history {root}: runs of several experiments ({', '.join(names)}); choose one with "
                         "--experiment")
    return runs


def _keys(runs: Sequence[Run]) -> list[tuple[str, str]]:
    keys: dict[tuple[str, str], None] = {}
    for run in runs:
        for v in run.report.get("verdicts") or []:
            keys[(str(v.get("name") or v["sla"]), str(v.get("phase") or "run"))] = None
    return list(keys)


def _verdict(run: Run, key: tuple[str, str]) -> Mapping[str, Any] | None:
    return next((v for v in run.report.get("verdicts") or []
                 if (str(v.get("name") or v["sla"]), str(v.get("phase") or "run")) == key), None)


def streak(runs: Sequence[Run], key: tuple[str, str]) -> tuple[str, int]:
    """The latest status of one entry and phase, and how many runs in a row (newest back) had it."""
    statuses = [(_verdict(r, key) or {}).get("status", "none") for r in runs]
    if not statuses:
        return "none", 0
    last, count = statuses[-1], 0
    for status in reversed(statuses):
        if status != last:
            break
        count += 1
    return str(last), count


def regressions(runs: Sequence[Run], *, alpha: float = 0.05, min_change: float = 0.10,
                min_delay: float = MIN_DELAY_S) -> list[Transition]:
    """Each run against the run before it against the same target (the comparison's statistics), in run order."""
    pairs = [(before, after) for _, group in series(runs) for before, after in zip(group, group[1:], strict=False)]
    return [Transition(before, after, compare_reports(before.report, after.report, alpha=alpha, min_change=min_change,
                                                      min_delay=min_delay))
            for before, after in sorted(pairs, key=lambda pair: pair[1].start)]


def latest_regressed(runs: Sequence[Run], transitions: Sequence[Transition]) -> bool:
    """Whether the newest run has a flagged change against the run before it against its target."""
    return bool(runs) and any(r.flagged for t in transitions if t.after is runs[-1] for r in t.rows)


def history_lines(runs: Sequence[Run], transitions: Sequence[Transition]) -> list[str]:
    """The terminal summary: each entry's streak (per target when the runs had several), then every flagged change."""
    groups = series(runs)
    lines = [f"{runs[0].report.get('experiment')}: {len(runs)} runs, {runs[0].label} … {runs[-1].label} (UTC)"]
    if len(groups) > 1:
        lines.append(f"  against {len(groups)} targets: each run is compared with the run before it against the same "
                     "target")
    for target, group in groups:
        indent = "  " if len(groups) == 1 else "    "
        if len(groups) > 1:
            lines.append(f"  target {target}: {len(group)} run(s)")
        for key in _keys(group):
            status, count = streak(group, key)
            lines.append(f"{indent}{key[0]} [{key[1]}]: {status} in the last {count} run(s)")
    flagged = [(t, r) for t in transitions for r in t.rows if r.flagged]
    lines.append(f"{len(flagged)} flagged change(s) between consecutive runs" + (":" if flagged else ""))
    for t, r in flagged:
        against = f" (target {t.after.target})" if len(groups) > 1 else ""
        lines.append(f"  !! {t.after.label} vs {t.before.label}: {r.name} [{r.phase}] {r.flag} ({r.test}){against}")
    return lines


def _trend_figure(runs: Sequence[Run], key: tuple[str, str], name: str) -> tuple[str, int]:
    from chaos.output.reports.plot import BUDGET_COLOUR, COLOURS, data_gid, new_figure, to_svg

    points = [(i, v) for i, r in enumerate(runs) if (v := _verdict(r, key)) is not None and v.get("figure") is not None]
    if not points:
        return "", 0
    colours = {"pass": COLOURS[2], "fail": COLOURS[1], "inconclusive": COLOURS[4], "unobservable": COLOURS[5]}
    fig, (ax,) = new_figure(5.2, 2.4, margins_in=(0.7, 0.15, 0.25, 0.65))
    unit = points[-1][1].get("unit") or ""
    k = 1000.0 if unit == "s" else 1.0  # durations drawn in ms, as budgets are written
    xs = [i for i, _ in points]
    ax.plot(xs, [v["figure"] * k for _, v in points], color="#8c959f", lw=0.8)
    for i, v in points:
        ev = v.get("evidence") or {}
        if ev.get("lower") is not None and ev.get("upper") is not None:
            ax.plot([i, i], [ev["lower"] * k, ev["upper"] * k], color=colours.get(v["status"], COLOURS[5]), lw=3,
                    alpha=0.4)
    ax.scatter(xs, [v["figure"] * k for _, v in points], s=18, zorder=3,
               color=[colours.get(v["status"], COLOURS[5]) for _, v in points], gid=data_gid(name))
    budget = points[-1][1].get("budget")
    if budget is not None:
        ax.axhline(budget * k, color=BUDGET_COLOUR, lw=1)
    ax.set_xticks(range(len(runs)), [r.label for r in runs], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("ms" if unit == "s" else unit)
    ax.set_title(f"{key[0]} [{key[1]}]", fontsize=9, loc="left")
    return to_svg(fig, label=f"{key[0]} {key[1]} over time"), len(points)


def _streak_table(runs: Sequence[Run]) -> str:
    from chaos.output.render import format_value
    from chaos.output.reports.html import esc

    head = "<tr><th>SLA</th><th>phase</th>" + "".join(f"<th>{esc(r.label)}</th>" for r in runs) + "<th>streak</th></tr>"
    body = []
    for key in _keys(runs):
        cells = []
        for run in runs:
            v = _verdict(run, key)
            status = v["status"] if v else "none"
            text = format_value(v.get("figure"), v.get("unit") or "") if v else "-"
            cells.append(f'<td class="cell-{esc(status)}" title="{esc(status)}">{esc(text)}</td>')
        status, count = streak(runs, key)
        body.append(f"<tr><td>{esc(key[0])}</td><td>{esc(key[1])}</td>{''.join(cells)}<td>{esc(status)} "
                    f"×{count}</td></tr>")
    return f'<table class="streaks">{head}{"".join(body)}</table>'


def _trends(runs: Sequence[Run], prefix: str) -> str:
    from chaos.output.reports.html import plot_figure

    trends = []
    for key in _keys(runs):
        name = f"trend-{prefix}{key[0]}-{key[1]}"
        svg, points = _trend_figure(runs, key, name)
        if svg:
            trends.append("<div>" + plot_figure(name, svg, "figure per run; bars: the verdict's interval; "
                                                "red: the budget", points) + "</div>")
    return '<div class="grid">' + "".join(trends) + "</div>"


def _flagged_items(transitions: Sequence[Transition], several: bool) -> str:
    from chaos.output.render import format_value
    from chaos.output.reports.html import esc

    return "".join(
        f'<li class="flagged"><b>{esc(t.after.label)}</b> against {esc(t.before.label)}'
        + (f" ({esc(t.after.target)})" if several else "") + f": {esc(r.name)} [{esc(r.phase)}] — "
        f"{esc(r.flag)}; {esc(format_value(r.a.get('figure') if r.a else None, r.unit))} → "
        f"{esc(format_value(r.b.get('figure') if r.b else None, r.unit))} ({esc(r.test)})</li>"
        for t in transitions for r in t.rows if r.flagged
    )


def render_history(runs: Sequence[Run], transitions: Sequence[Transition]) -> str:
    """The page: per target (one series when every run had the same), the streaks and the trends; the
    flagged changes between consecutive runs against the same target."""
    from chaos.output.reports.html import esc, page, section

    groups = series(runs)
    several = len(groups) > 1
    flagged = sum(1 for t in transitions for r in t.rows if r.flagged)
    items = _flagged_items(transitions, several)
    parts = [
        f"<h1>{esc(runs[0].report.get('experiment'))}: {len(runs)} runs</h1>",
        f'<p class="summary">{runs[0].label} … {runs[-1].label} (UTC); '
        + (f"{len(groups)} targets, each its own series; " if several else "")
        + (f'<b class="fail">{flagged} flagged change(s)</b>' if flagged else '<b class="pass">no flagged change</b>')
        + "</p>",
    ]
    for i, (target, group) in enumerate(groups):
        against = f" against {target}" if several else ""
        suffix, prefix = (f"-{i}", f"{i}-") if several else ("", "")
        parts.append(section(f"streaks{suffix}", f"Verdicts per run{against}", _streak_table(group)))
        parts.append(section(f"trends{suffix}", f"Figures over time{against}", _trends(group, prefix)))
    parts.insert(3 if not several else 2, section("regressions", "Flagged changes between consecutive runs",
                                                  f"<ul>{items}</ul>" if items else '<p class="muted">none</p>'))
    return page(f"streamchaos history: {runs[0].report.get('experiment')}", "\n".join(parts))
