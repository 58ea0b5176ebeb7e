"""Regenerate the report screenshot (docs/reports.md) from a real run, and print the figures its paragraph quotes.

    python scripts/screenshot_report.py [--out RUN_DIR] [--png docs/report-screenshot.png]

Runs experiments/network-jitter.yaml (about 20 s: the builtin stack and the embedded Toxiproxy),
screenshots its report.html with headless Chromium (`apt-get install chromium`), then prints each
TTFT verdict as report.json has it. Copy those figures into the paragraph under the screenshot in
docs/reports.md ("In the screenshot ..."): tests/test_readme_figures.py checks its quantile and budget
against the experiment, not the measured values.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENT = ROOT / "experiments" / "network-jitter.yaml"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def screenshot(page: Path, png: Path) -> None:
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        sys.exit(f"no headless browser found ({', '.join(BROWSERS)}); on Debian: apt-get install -y chromium")
    with tempfile.TemporaryDirectory() as profile:  # a throwaway profile: nothing read from or left in ~
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={profile}", "--window-size=1280,1600", f"--screenshot={png}",
                        page.resolve().as_uri()], check=True, capture_output=True, timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="run directory (default: a fresh temporary one)")
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "report-screenshot.png")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="streamchaos-screenshot-")) / "run"
    done = subprocess.run([sys.executable, "-m", "chaos", "run", str(EXPERIMENT), "--out", str(out), "--quiet"],
                          cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"the run ended with exit {done.returncode}; see {out}")
    screenshot(out / "report.html", args.png)
    print(f"wrote {args.png} from {out / 'report.html'}")
    for v in json.loads((out / "report.json").read_text(encoding="utf-8"))["verdicts"]:
        if v["sla"] == "ttft":
            ev = v.get("evidence") or {}
            print(f"  {v.get('name') or v['sla']} [{v['phase']}]: {v['status']}, p{ev['quantile'] * 100:g} "
                  f"{v['figure'] * 1e3:.1f} ms (interval {ev['lower'] * 1e3:.1f}-{ev['upper'] * 1e3:.1f} ms), "
                  f"budget {v['budget'] * 1e3:.0f} ms, n {v['samples']} (n_eff {ev.get('n_eff', 0):.0f})")


if __name__ == "__main__":
    main()
