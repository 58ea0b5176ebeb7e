"""report.html from a run's report dict and observations: every view present with its data, units
and intervals in the verdict table, nothing fetched, and a 10,000-stream run within 3 MB."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from synthetic import synthetic_run

from chaos.output.reports.page import render_html
from chaos.output.reports.plot import cdf_points, thin_scatter
from chaos.output.reports.verdicts import render_verdicts
from chaos.output.reports.waterfall import ROWS, sample_streams
from sla.base import Verdict

pytestmark = pytest.mark.timeout(120)

SVG_NS = "{http://www.w3.org/2000/svg}"


def figures(page: str) -> dict[str, tuple[int, str]]:
    """data-plot → (data-points, the figure's markup)."""
    found = re.findall(r'<figure class="plot" data-plot="([^"]+)" data-points="(\d+)">(.*?)</figure>', page, re.S)
    return {name: (int(points), body) for name, points, body in found}


def data_marks(svg_markup: str) -> int:
    """Data points an SVG draws: vertices of paths and markers under elements whose id starts ``sc-data-``."""
    svg = ET.fromstring(re.search(r"<svg.*?</svg>", svg_markup, re.S).group(0))  # type: ignore[union-attr]
    marks = 0
    for group in svg.iter(f"{SVG_NS}g"):
        if not (group.get("id") or "").startswith("sc-data-"):
            continue
        uses = list(group.iter(f"{SVG_NS}use"))  # scatter markers, each a point
        if uses:
            marks += len(uses)
            continue
        for path in group.iter(f"{SVG_NS}path"):  # a line: each vertex a point
            marks += len(re.findall(r"[ML]", path.get("d") or ""))
    return marks


@pytest.fixture(scope="module")
def page() -> str:
    report, obs = synthetic_run(streams=300, seconds=30)
    return render_html(report, obs)


def test_every_view_is_drawn_with_its_data(page: str) -> None:
    plots = figures(page)
    assert {"timeline", "waterfall", "cdf-ttft", "cdf-itl"} <= set(plots), sorted(plots)
    for name, (points, body) in plots.items():
        assert points > 0, name
        assert data_marks(body) > 0, f"{name}: no data marks in its SVG"
    for section in ("verdicts", "distributions", "timeline", "waterfall", "faults", "environment"):
        assert f'<section id="{section}">' in page


def test_the_page_fetches_nothing_and_runs_no_script(page: str) -> None:
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert not re.search(r'\b(src|href)="(https?:)?//', page)
    assert not re.search(r"url\((['\"]?)(https?:)?//", page)


def test_ids_are_unique_on_the_page(page: str) -> None:
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})[:10]


def test_verdict_table_has_units_intervals_samples_and_what_would_decide() -> None:
    verdicts = [
        Verdict("ttft", "baseline", "pass", 0.06537049049999999, 0.5, "s", 120,
                {"quantile": 0.99, "confidence": 0.95, "lower": 0.0612, "upper": 0.0701, "n_eff": 97.4}),
        Verdict("itl", None, "inconclusive", 0.02, 0.02, "s", 50,
                {"quantile": 0.99, "confidence": 0.95, "lower": None, "upper": None, "samples_needed": 368,
                 "reason": "50 samples cannot bound the p99", "brand_new_key_s": 1.5}),
        Verdict("errors", None, "fail", 0.0125, 0.0, "fraction", 80, {"streams": 80, "failed": 1}),
    ]
    html = render_verdicts([v.to_dict() for v in verdicts])
    assert "0.06537049049999999" not in html  # figures are written with their units
    assert "65.4ms" in html and "500.0ms" in html and "1.25%" in html
    assert "p99 [61.2ms, 70.1ms] @95%" in html  # the verdict's own interval
    assert "n_eff 97" in html  # the effective sample size where the evidence has it
    assert "about 368" in html  # what would decide the inconclusive one
    assert "50 samples cannot bound the p99" in html
    assert "brand_new_key_s" in html and "1.50s" in html  # unknown evidence keys still show, with units


@pytest.mark.timeout(180)
def test_a_ten_thousand_stream_run_stays_within_3_mb() -> None:
    report, obs = synthetic_run(streams=10_000)
    page = render_html(report, obs)
    size = len(page.encode("utf-8"))
    assert size <= 3_000_000, f"{size:,} bytes"
    plots = figures(page)
    assert plots["timeline"][0] > 1000 and plots["waterfall"][0] > 0


def test_cdf_points_are_exact_where_drawn_and_keep_the_maximum() -> None:
    values = [float(v) for v in range(1, 10_001)]
    x, y = cdf_points(values, max_points=100)
    assert len(x) <= 100 and x[-1] == 10_000.0 and y[-1] == 1.0
    for xi, yi in zip(x, y, strict=True):
        assert yi == pytest.approx(sum(1 for v in values if v <= xi) / len(values))
    small_x, small_y = cdf_points([3.0, 1.0, 2.0])
    assert list(small_x) == [1.0, 2.0, 3.0] and list(small_y) == pytest.approx([1 / 3, 2 / 3, 1.0])


def test_thinning_keeps_the_slowest() -> None:
    xs = list(range(20_000))
    ys = [1.0] * 20_000
    ys[12_345] = 99.0
    x, y = thin_scatter(xs, ys, max_points=500)
    assert len(x) <= 500 and 99.0 in y and 12_345 in x


def test_waterfall_sample_shows_abnormal_streams_first() -> None:
    _, obs = synthetic_run(streams=2000, seconds=60)
    sample = sample_streams(obs.population())
    abnormal = [s for s in obs.population() if not s.complete]
    assert len(sample) == ROWS
    assert sum(1 for s in sample if not s.complete) == min(len(abnormal), ROWS // 2)


def test_gpu_clock_and_power_are_drawn_where_sampled_and_faults_show_plan_evidence_undo() -> None:
    from chaos.model.observations import MetricSample

    report, obs = synthetic_run(streams=200, seconds=20)
    assert "sc-data-gpu-clock" not in render_html(report, obs)  # not sampled: no panel
    for i in range(50):
        t = obs.t0 + i * 400_000_000
        obs.add(MetricSample("gpu_sm_clock_mhz", {"gpu": "0"}, 1980.0 if i < 25 else 990.0, t))
        obs.add(MetricSample("gpu_power_watts", {"gpu": "0"}, 300.0 if i < 25 else 180.0, t))
    page = render_html(report, obs)
    assert "sc-data-gpu-clock" in page and "sc-data-gpu-power" in page
    fault = page[page.index('<div class="fault" data-fault="slow">'):]
    assert "plan (journaled before the inject)" in fault and "latency_downstream" in fault  # the plan's undo
    assert "latency_ms" in fault and "removed" in fault  # inject evidence, what the revert undid
