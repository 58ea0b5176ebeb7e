"""Benchmark: how large and how slow is report.html for a big run?

Builds a synthetic run (``tests/reports/synthetic.py``: seeded streams over three phases, a fault
window, gauges every 200 ms) of each size given, renders report.html, and prints its size in bytes
and MB and the render time. A benchmark prints figures; it asserts nothing.

    python benchmarks/bench_report.py [--streams 1000,10000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "reports")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="1000,10000")
    args = parser.parse_args()
    from synthetic import synthetic_run

    t = time.perf_counter()
    from chaos.output.reports.page import render_html

    render_html(*synthetic_run(streams=10, seconds=10))  # imports matplotlib: not counted per size
    print(f"first render (matplotlib import included): {time.perf_counter() - t:.2f}s")
    for n in (int(x) for x in args.streams.split(",")):
        report, obs = synthetic_run(streams=n)
        t = time.perf_counter()
        page = render_html(report, obs)
        took = time.perf_counter() - t
        size = len(page.encode("utf-8"))
        print(f"{n:>7} streams: report.html {size:>9,} bytes ({size / 1e6:.2f} MB), rendered in {took:.2f}s")


if __name__ == "__main__":
    main()
