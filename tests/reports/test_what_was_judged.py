"""Say what was judged: the terminal table names the quantile with its figure, counts read as counts,
a microsecond budget keeps its unit, `budgets` says what its columns mean, the live figures stop
with the load, and the plots draw milliseconds, say what the KV series is, and never give a curve
the budget line's colour."""

from __future__ import annotations

import io
import re

from synthetic import synthetic_run

from chaos.execution.events import RunStarted, Stage
from chaos.model.observations import ErrorInfo, PhaseWindow, StreamRecord
from chaos.output.live import LiveProgress, Tally
from chaos.output.render import format_value, verdict_line, verdict_table
from chaos.output.reports.distributions import render_distributions
from chaos.output.reports.plot import BUDGET_COLOUR, phase_colour
from chaos.output.reports.timeline import kv_label
from sla.base import Verdict

NS = 1_000_000_000
MS = 1_000_000


def test_the_table_shows_the_quantile_with_the_figure_and_counts_without_a_unit_word() -> None:
    lines = verdict_table([
        Verdict("ttft", "steady", "pass", 0.0204, 0.05, "s", 300, {"quantile": 0.75}),
        Verdict("ttft", "storm", "pass", 0.031, 0.05, "s", 300, {"quantile": 0.5}),
        Verdict("integrity", None, "pass", 0.0, 0.0, "count", 120, {"streams": 120}),
    ])
    text = "\n".join(lines)
    assert "p75 20.4ms" in lines[2] and "p50 31.0ms" in lines[3], text
    assert "count" not in text and "0 of 120 bad" in lines[4] and "none allowed" in lines[4], text
    line = verdict_line(Verdict("ttft", "steady", "fail", 0.0612, 0.05, "s", 300, {"quantile": 0.99}), evidence=False)
    assert "p99 61.2ms vs budget 50.0ms" in line


def test_durations_keep_a_readable_unit() -> None:
    assert format_value(1e-6, "s") == "1.0us"
    assert format_value(2.5e-4, "s") == "250.0us"
    assert format_value(5e-9, "s") == "5.0ns"
    assert format_value(0.0204, "s") == "20.4ms" and format_value(1.5, "s") == "1.50s" \
        and format_value(0.0, "s") == "0.0ms"


def _stream(i: int, end_s: float, *, error: bool = False) -> StreamRecord:
    t_end = int(end_s * NS)
    content = [t_end - 100 * MS + k * MS for k in range(3)]
    st = StreamRecord(id=str(i), phase="steady", t_sent=t_end - 150 * MS, t_first_content=content[0], t_content=content,
                      t_end=t_end, status=200, finish_reason="stop", done_seen=True)
    if error:
        st.error = ErrorInfo("read", "cut by the stop")
    return st


def test_the_live_figures_stop_with_the_load_and_a_stop_does_not_count_the_streams_it_cut() -> None:
    out = io.StringIO()
    progress = LiveProgress(out, line_every_s=3600.0)
    progress.on_event(RunStarted("probe", "/tmp/run", 0, 0.0, (("steady", 10.0),)))
    progress.on_event(PhaseWindow("steady", 0))
    for i in range(50):
        progress.on_event(_stream(i, 0.1 * i + 0.2))  # 10 streams/s up to 5.1 s
    progress.on_event(Stage("signal", "SIGINT: reverting faults and stopping", int(5.2 * NS)))
    for i in range(8):
        progress.on_event(_stream(100 + i, 5.3, error=True))  # what the stop itself cut
    snap = progress.tally.snapshot(60 * NS)  # long after: the figures are still those of the load
    assert snap.streams == 50 and snap.errors == 0 and snap.early_closes == 0
    assert 9.0 <= snap.streams_per_s <= 11.0 and abs(snap.elapsed_s - 5.2) < 1e-6


def test_a_tally_without_a_stop_keeps_counting() -> None:
    tally = Tally()
    tally.start((("steady", 10.0),))
    tally.add(PhaseWindow("steady", 0))
    tally.add(_stream(0, 1.0, error=True))
    assert tally.snapshot(2 * NS).errors == 1 and tally.snapshot(2 * NS).elapsed_s == 2.0


def test_plots_draw_ms_say_what_the_kv_series_is_and_keep_the_budget_colour_for_the_budget() -> None:
    report, obs = synthetic_run(streams=200, seconds=20)
    page = render_distributions(report, obs)
    assert "time to first token (ms)" in page and "(s)" not in page
    assert all(phase_colour(i) != BUDGET_COLOUR for i in range(12))
    assert kv_label("vllm:kv_cache_usage_perc") == "KV cache used (%)"
    assert kv_label("streamchaos_kv_blocks_used") == "KV blocks used"
    assert kv_label("tgi_batch_current_max_tokens") == "KV tokens in use"
    budget = next(v["budget"] for v in report["verdicts"] if v["sla"] == "ttft")
    assert re.search(rf"budget {re.escape(format_value(budget, 's'))}", page)


def test_a_phases_closing_figures_are_printed_once() -> None:
    out = io.StringIO()
    progress = LiveProgress(out, line_every_s=5.0)
    progress.on_event(RunStarted("probe", "/tmp/run", 0, 0.0, (("steady", 1.0),)))
    progress.on_event(PhaseWindow("steady", 0))
    progress._last_line -= 10.0  # the periodic line is due just as the phase ends
    progress.on_event(PhaseWindow("steady", 0, NS))
    assert out.getvalue().count("phase steady (1/1)") == 1, out.getvalue()


def test_a_log_axis_labels_its_ticks_as_plain_numbers_not_raw_mathtext() -> None:
    report, obs = synthetic_run(streams=200, seconds=20)
    for v in report["verdicts"]:
        if v["sla"] == "ttft":
            v["budget"] = 5.0  # 5 s against ~15 ms TTFTs: the CDF's x axis goes logarithmic
    page = render_distributions(report, obs)
    assert "mathdefault" not in page and "10^{" not in page, "log ticks drawn as raw mathtext"
    assert re.search(r">\s*(10|100|1000)\s*<", page), "no plain decade label on the log axis"
