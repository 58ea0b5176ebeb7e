"""Shipped experiments run again and again under a CPU hog: how often a verdict is not what it is meant to be.

    python scripts/soak.py [--runs 30] [--first-seed 1] [--hogs 2] [--experiments smoke,...|all] [--out DIR]

Each run is ``streamchaos run EXPERIMENT --seed N --quiet`` with a fresh seed, on the target the
experiment names (the builtin stack for most), while ``--hogs`` processes each spin a core; the
experiments that need a cluster, a GPU or vLLM are left out (``--experiments`` can name them).
Per experiment: runs, runs as meant (exit 0), false failures (a verdict meant to pass that failed,
or one meant to fail that passed), inconclusive verdicts with their SLA and reason, and the load
average. Figures go to ``DIR/soak.json`` and ``DIR/soak.md``; exit 1 when any run was not as meant.
This is issue 23's proof that verdicts do not depend on the machine's mood; it takes hours at 30 runs,
so it can be taken in parts: ``--first-seed 11 --runs 20`` runs seeds 11-30.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from chaos.model.verdict import counts_as

ROOT = Path(__file__).resolve().parents[1]
NEEDS_ELSEWHERE = {"pod-kill", "vllm-engine-kill", "vllm-server-faults"}  # a cluster, vLLM (gpu-throttle: cpu_duty)


def _spin(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def judged(report: dict[str, Any]) -> dict[str, Any]:
    """Of one report.json: the verdicts not as meant, split into false failures and inconclusives. Pure."""
    false, undecided = [], []
    for v in report.get("verdicts", []):
        name = f"{v.get('name') or v['sla']}[{v.get('phase') or 'run'}]"
        counted = counts_as(v["status"], v.get("expect", "pass"), v.get("when_unobservable", "tolerate"))
        if v.get("ok") is not True and counted == "inconclusive":
            evidence = v.get("evidence") or {}
            undecided.append(f"{name}: {evidence.get('reason') or evidence.get('inconclusive_cause', '')}"[:200])
        elif v.get("ok") is False:
            false.append(name)
    return {"false": false, "inconclusive": undecided}


def soak_one(name: str, seeds: range, hogs: int, out: Path) -> dict[str, Any]:
    path = ROOT / "experiments" / f"{name}.yaml"
    row: dict[str, Any] = {"experiment": name, "runs": 0, "as_meant": 0, "false": Counter(), "inconclusive": Counter(),
                           "errors": [], "load_average": []}
    for seed in seeds:
        run_dir = out / f"{name}-{seed}"
        stop_at = time.monotonic() + 600
        spinners = [multiprocessing.Process(target=_spin, args=(stop_at,), daemon=True) for _ in range(hogs)]
        for p in spinners:
            p.start()
        try:
            done = subprocess.run([sys.executable, "-m", "chaos", "run", str(path), "--seed", str(seed),
                                   "--out", str(run_dir), "--quiet"],
                                  cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
        finally:
            for p in spinners:
                p.terminate()
                p.join(5)
        row["runs"] += 1
        row["load_average"].append(round(os.getloadavg()[0], 1))
        report_path = run_dir / "report.json"
        if not report_path.exists():
            row["errors"].append(f"seed {seed}: exit {done.returncode}: {(done.stdout + done.stderr).strip()[-200:]}")
            continue
        verdicts = judged(json.loads(report_path.read_text(encoding="utf-8")))
        row["false"].update(verdicts["false"])
        row["inconclusive"].update(v.split(":")[0] for v in verdicts["inconclusive"])
        row["as_meant"] += int(done.returncode == 0)
        print(f"{name} seed {seed}: exit {done.returncode} {verdicts if done.returncode else ''}", flush=True)
    return row


def markdown(rows: list[dict[str, Any]], hogs: int) -> str:
    lines = [f"# Shipped experiments under {hogs} busy processes", "",
             "| experiment | runs | as meant | false failures | inconclusive | setup errors | load average |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        la = r["load_average"]
        lines.append(f"| {r['experiment']} | {r['runs']} | {r['as_meant']} | {dict(r['false']) or 0} | "
                     f"{dict(r['inconclusive']) or 0} | {len(r['errors'])} | "
                     f"{min(la, default=0)}-{max(la, default=0)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--experiments", default="all")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    names = (sorted(p.stem for p in (ROOT / "experiments").glob("*.yaml") if p.stem not in NEEDS_ELSEWHERE)
             if args.experiments == "all" else [n.strip() for n in args.experiments.split(",") if n.strip()])
    out = Path(args.out or ROOT / "runs" / f"soak-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    seeds = range(args.first_seed, args.first_seed + args.runs)
    rows = [soak_one(name, seeds, args.hogs, out) for name in names]
    (out / "soak.json").write_text(json.dumps(rows, indent=2, default=dict), encoding="utf-8")
    (out / "soak.md").write_text(markdown(rows, args.hogs), encoding="utf-8")
    print(markdown(rows, args.hogs))
    return 1 if any(r["as_meant"] < r["runs"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
