"""Reports of real runs: three short runs of the builtin stack (two healthy, one with 200 ms of
planted latency through the proxy), then `report --compare`, `report --history`, the Prometheus
endpoint scraped during a run, live progress, and report.html rendered in headless Chromium."""

from __future__ import annotations

import io
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import chaos
from chaos.cli import main
from chaos.model.observations import StreamRecord
from chaos.output.exporter import PrometheusExporter
from chaos.output.live import LiveProgress

pytestmark = pytest.mark.timeout(300)  # slow: tests/conftest.py marks the folder

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
SCRAPE_AFTER = 12  # streams


class Scraper:
    """Run listener: scrapes the exporter's endpoint once, mid-run, as Prometheus would."""

    def __init__(self, exporter: PrometheusExporter) -> None:
        self.exporter, self.seen, self.text = exporter, 0, ""

    def on_event(self, event: Any) -> None:
        if isinstance(event, StreamRecord) and not event.background:
            self.seen += 1
            if self.seen == SCRAPE_AFTER and self.exporter.url:
                self.text = httpx.get(self.exporter.url, timeout=5).text


@dataclass
class Probes:
    healthy_a: Path
    healthy_b: Path
    slowed: Path
    scraped: str
    progress: str


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory) -> Probes:
    runs = tmp_path_factory.mktemp("probes")
    progress = io.StringIO()
    with PrometheusExporter(port=0) as exporter:
        scraper = Scraper(exporter)
        first = chaos.run(HERE / "probe.yaml", out_dir=runs / "a-healthy",
                          listeners=[exporter, scraper, LiveProgress(progress, line_every_s=1.0)])
    second = chaos.run(HERE / "probe.yaml", out_dir=runs / "b-healthy")
    slowed = chaos.run(HERE / "probe-slowed.yaml", out_dir=runs / "c-slowed")
    for result in (first, second, slowed):
        assert result.status == "completed", result.error
    return Probes(first.out_dir, second.out_dir, slowed.out_dir, scraper.text, progress.getvalue())


def test_two_healthy_runs_compare_with_nothing_flagged(probes: Probes, capsys: pytest.CaptureFixture[str]) -> None:
    # 25%: the smallest change worth flagging on a shared 2-core box; the planted latency is +400%
    code = main(["report", "--compare", str(probes.healthy_a), str(probes.healthy_b), "--min-change", "25%"])
    out = capsys.readouterr().out
    assert code == 0 and "nothing flagged" in out, out
    assert "95% intervals of the p50" in out  # the quantile rows were tested, not skipped


def test_a_planted_slowdown_is_flagged(probes: Probes, capsys: pytest.CaptureFixture[str]) -> None:
    page = probes.slowed.parent / "compare.html"
    code = main(["report", "--compare", str(probes.healthy_b), str(probes.slowed), "--min-change", "25%",
                 "--html", str(page)])
    out = capsys.readouterr().out
    assert code == 1, out
    ttft = next(line for line in out.splitlines() if line.split()[:2] == ["!!", "ttft"])
    assert "regression: significantly worse" in ttft and "intervals of the p50 disjoint" in ttft
    assert 'class="flagged" data-sla="ttft"' in page.read_text()


def test_history_over_the_runs_flags_the_slowed_one(probes: Probes, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    for run in (probes.healthy_a, probes.healthy_b, probes.slowed):
        (tmp_path / run.name).symlink_to(run)
    assert main(["report", "--history", str(tmp_path), "--min-change", "25%"]) == 1
    out = capsys.readouterr().out
    assert "3 runs" in out and "ttft [run] regression: significantly worse" in out
    assert 'data-plot="trend-ttft-run" data-points="3"' in (tmp_path / "history.html").read_text()


def test_the_prometheus_endpoint_was_scraped_during_the_run(probes: Probes) -> None:
    assert probes.scraped, "the scrape never happened"
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(probes.scraped) for s in family.samples}

    def total(name: str, **labels: str) -> float:
        return sum(v for (n, key), v in samples.items() if n == name and all((k, labels[k]) in key for k in labels))

    assert total("streamchaos_ttft_seconds_count", experiment="report-probe", phase="steady") == SCRAPE_AFTER
    assert total("streamchaos_streams_total", outcome="complete") == SCRAPE_AFTER
    assert total("streamchaos_token_gap_seconds_count") > SCRAPE_AFTER
    assert total("streamchaos_phase_active", phase="steady") == 1  # mid-run
    assert not any(n == "streamchaos_verdict" for n, _ in samples)  # verdicts come at the end


def test_live_progress_printed_the_runs_figures(probes: Probes) -> None:
    lines = [line for line in probes.progress.splitlines() if "phase steady (1/1)" in line and "streams/s" in line]
    assert lines, probes.progress
    assert "TTFT p50" in lines[-1] and "TTFT p50 -" not in lines[-1]


def chromium() -> str:
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)")
    return path


ARTIFACTS = Path(os.environ.get("STREAMCHAOS_ARTIFACTS", ROOT / "test-artifacts"))

DATA_POINTS_JS = """
() => [...document.querySelectorAll('figure.plot')].map(f => {
  let points = 0;
  for (const g of f.querySelectorAll('g[id^="sc-data-"]')) {
    const uses = g.querySelectorAll('use').length;
    points += uses || [...g.querySelectorAll('path')].reduce(
      (n, p) => n + ((p.getAttribute('d') || '').match(/[ML]/g) || []).length, 0);
  }
  const box = f.querySelector('svg').getBoundingClientRect();
  return {plot: f.dataset.plot, points, width: box.width, height: box.height};
})
"""


def test_report_html_renders_in_headless_chromium(probes: Probes) -> None:
    executable = chromium()
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is in the dev extra: pip install -e '.[dev]'")
    page_file = probes.slowed / "report.html"
    # the same checks must catch a page that fetches something or logs an error
    tampered = probes.slowed.parent / "tampered.html"
    tampered.write_text(page_file.read_text().replace(
        "</body>", '<img src="http://127.0.0.1:9/pixel.png"><script>console.error("planted")</script></body>'))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "report-probe-slowed.png"
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            def visit(path: Path,
                      screenshot: Path | None = None) -> tuple[list[dict[str, Any]], int, list[str], list[str]]:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                errors: list[str] = []
                requests: list[str] = []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.on("request", lambda r: requests.append(r.url))
                page.goto(path.as_uri(), wait_until="load")
                plots = page.evaluate(DATA_POINTS_JS)
                rows = page.locator("table.verdicts tr.verdict").count()
                if screenshot is not None:
                    page.screenshot(path=str(screenshot), full_page=True)
                page.close()
                return plots, rows, errors, requests

            plots, verdict_rows, console_errors, requests = visit(page_file, shot)
            _, _, planted_errors, planted_requests = visit(tampered)
        finally:
            browser.close()
    assert "planted" in " ".join(planted_errors) and "http://127.0.0.1:9/pixel.png" in planted_requests
    names = {p["plot"] for p in plots}
    assert {"timeline", "waterfall", "cdf-ttft", "cdf-itl"} <= names, names
    for plot in plots:
        assert plot["points"] > 0 and plot["width"] > 100 and plot["height"] > 50, plot
    assert verdict_rows == 4
    assert console_errors == []
    assert requests == [page_file.as_uri()], requests  # the page itself, nothing else
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")


def test_report_json_keeps_its_keys_and_adds_the_environment_and_fault_plans(probes: Probes) -> None:
    import json

    report = json.loads((probes.slowed / "report.json").read_text())
    assert {"experiment", "description", "seed", "status", "exit_code", "error", "start", "end", "duration_s", "target",
            "proxy", "phases", "faults", "gpu", "load", "verdicts"} <= set(report)  # the contract as it was
    env = report["environment"]
    assert env["versions"]["streamchaos"] and env["python"] and env["host"] and env["target"]["kind"] == "builtin"
    assert env["proxy"]["why"]  # which proxy server, and why that one
    (fault,) = report["faults"]
    assert fault["plan"] and fault["undo"] and fault["evidence"] and fault["injected_at"] is not None
