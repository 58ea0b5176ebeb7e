"""A dead-man's switch for faults that outlive a process (GPU clocks, power caps, stopped processes).

Started by the runner in its own session when an experiment has such faults. It stands down when
the journal says the run ended; it rolls the run back when the runner's process is gone or has not
renewed its lease (``RUN_DIR/lease`` mtime) for ``--lease`` seconds. It never runs longer than
``--max-seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def _run_ended(journal: Path) -> bool:
    try:
        with open(journal, "rb") as f:
            f.seek(max(0, os.path.getsize(journal) - 4096))
            tail = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return False
    for line in reversed(tail):
        try:
            if json.loads(line).get("type") == "end":
                return True
        except json.JSONDecodeError:
            continue
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.watchdog")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--pid", type=int, required=True, help="the runner's process id")
    parser.add_argument("--lease", type=float, default=10.0, help="seconds without a lease renewal before acting")
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    parser.add_argument("--poll", type=float, default=0.25)
    args = parser.parse_args(argv)
    journal, lease = args.run_dir / "journal.jsonl", args.run_dir / "lease"
    deadline = time.monotonic() + args.max_seconds
    while time.monotonic() < deadline:
        if _run_ended(journal):
            return 0
        runner_gone = not _process_alive(args.pid)
        try:
            stale = time.time() - lease.stat().st_mtime > args.lease
        except OSError:
            stale = True
        if runner_gone or stale:
            time.sleep(args.poll)  # the runner may just have written its end record
            if _run_ended(journal):
                return 0
            from chaos.rollback import rollback_run

            why = "runner process gone" if runner_gone else "lease expired"
            done = rollback_run(args.run_dir)
            print(f"watchdog: {why}; rolled back {len(done)} fault(s): {done}", file=sys.stderr)
            return 0
        time.sleep(args.poll)
    return 0


if __name__ == "__main__":
    sys.exit(main())
