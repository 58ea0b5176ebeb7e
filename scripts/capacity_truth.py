"""How often the capacity search finds the known capacity: the builtin stack with 4 batch slots,
whose capacity under a 30 ms TTFT p50 budget is 4 streams (tests/e2e/test_capacity_runs.py says
why), searched with N seeds; prints each seed's interval and the share that contains the truth.

    python scripts/capacity_truth.py [--runs 20] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from test_capacity_runs import EXPERIMENT  # noqa: E402 - the test's experiment, one source

TRUTH = 4.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="capacity-truth-"))
    out.mkdir(parents=True, exist_ok=True)
    experiment = out / "capacity-truth.yaml"
    experiment.write_text(EXPERIMENT, encoding="utf-8")
    inside, rows = 0, []
    for seed in range(1, args.runs + 1):
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "chaos.cli", "capacity", str(experiment), "--seed", str(seed),
                               "--out", str(out / f"seed-{seed}"), "--quiet"],
                              cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
        took = time.monotonic() - began
        try:
            (case,) = json.loads((out / f"seed-{seed}" / "capacity.json").read_text())["cases"]
            lo, hi = case["capacity"]["passing"], case["capacity"]["failing"]
        except (OSError, ValueError, KeyError):
            lo = hi = None
        hit = lo is not None and lo <= TRUTH and (hi is None or TRUTH < hi)
        inside += hit
        rows.append(f"seed {seed}: [{lo}, {hi}) exit {done.returncode}, {len(case['probes']) if lo else '?'} probes, "
                    f"{took:.0f}s {'ok' if hit else 'MISSED'}")
        print(rows[-1], flush=True)
    print(f"{inside}/{args.runs} intervals contain the capacity {TRUTH:g} ({inside / args.runs:.0%})")
    return 0 if inside >= 0.95 * args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
