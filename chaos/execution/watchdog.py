"""A dead-man's switch for faults that outlive a process (GPU clocks, power caps, stopped processes).

Started by the runner in its own session while such a fault may be active. It stands down when
the journal says *its* run ended (the ``end`` record carrying the run id it was given); it rolls
the run back when the runner's process is gone or has not renewed its lease (``RUN_DIR/lease``
mtime) for ``--lease`` seconds. It never runs longer than ``--max-seconds``. The URLs rollback may
contact are the ones the runner passed on its command line (``--allow-url``), not the journal's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path

from chaos.host.cadence import sleep_to_next_tick
from chaos.host.redact import strip_userinfo
from chaos.host.runfiles import open_append, touch

__all__ = ["WatchdogHandle", "main", "watchdog"]

LEASE_PERIOD_S = 1.0  # how often the runner renews the lease
LEASE_TIMEOUT_S = 10.0  # a lease this stale means the runner is stuck: roll back


def _run_ended(journal: Path, run_id: str) -> bool:
    try:
        with open(journal, "rb") as f:
            f.seek(max(0, os.path.getsize(journal) - 4096))
            tail = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return False
    for line in reversed(tail):
        try:
            body = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(body, dict) and body.get("type") == "end" and body.get("run_id") == run_id:
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.execution.watchdog")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--pid", type=int, required=True, help="the runner's process id")
    parser.add_argument("--run-id", required=True, help="the run id of the journal's first record")
    parser.add_argument("--allow-url", action="append", default=[], help="a URL rollback may contact (repeatable)")
    parser.add_argument("--lease", type=float, default=LEASE_TIMEOUT_S,
                        help="seconds without a lease renewal before acting")
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    parser.add_argument("--poll", type=float, default=0.25)
    args = parser.parse_args(argv)
    from chaos.host.procs import alive

    journal, lease = args.run_dir / "journal.jsonl", args.run_dir / "lease"
    deadline = time.monotonic() + args.max_seconds
    while time.monotonic() < deadline:
        if _run_ended(journal, args.run_id):
            return 0
        runner_gone = not alive(args.pid)
        try:
            stale = time.time() - lease.stat().st_mtime > args.lease
        except OSError:
            stale = True
        if runner_gone or stale:
            time.sleep(args.poll)  # the runner may just have written its end record
            if _run_ended(journal, args.run_id):
                return 0
            return _roll_back(args.run_dir, args.allow_url, "runner process gone" if runner_gone else "lease expired")
        time.sleep(args.poll)
    return 0


def _roll_back(run_dir: Path, allowed_urls: list[str], why: str) -> int:
    """Roll the run back; another rollback of it already in progress (a second watchdog, the user's
    ``streamchaos rollback``) is left to finish, and this one stands down (0)."""
    from chaos.execution.rollback import rollback_run
    from chaos.model.errors import RollbackInProgress

    # said before acting: whoever finds the run's resources gone (or a rollback that hangs) reads why
    print(f"watchdog: {why}; rolling back the run", file=sys.stderr, flush=True)
    try:
        done = rollback_run(run_dir, allowed_urls=allowed_urls)
    except RollbackInProgress as exc:
        print(f"watchdog: rollback already in progress by pid {exc.holder}; standing down", file=sys.stderr,
              flush=True)
        return 0
    print(f"watchdog: rolled back {len(done)} fault(s): {done}", file=sys.stderr, flush=True)
    return 0


class WatchdogHandle:
    """The watchdog of one run: the runner waits for it to stand down after writing the end record."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    def wait_stood_down(self, timeout: float = 5.0) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout)


@contextlib.asynccontextmanager
async def watchdog(run_dir: Path, run_id: str, max_duration: float, allowed_urls: Iterable[str],
                   admin_token: str | None = None,
                   extra_env: Mapping[str, str] | None = None) -> AsyncIterator[WatchdogHandle]:
    """While entered: a watchdog process in its own session, and a task renewing its lease.

    On exit the lease renewal stops; the watchdog itself stands down when the journal's ``end``
    record appears (the runner writes it after every revert), or rolls back if it never does. The
    target's admin token reaches it through its environment, never its command line; so does
    ``extra_env`` (a Kubernetes target's kubeconfig and context).
    """
    import asyncio

    lease = run_dir / "lease"
    open_append(lease).close()  # created 0600 (or ours already), never through a link
    command = [sys.executable, "-m", "chaos.execution.watchdog", str(run_dir), "--pid", str(os.getpid()), "--run-id",
               run_id,
               "--max-seconds", str(int(max_duration + 600))]
    for url in allowed_urls:
        command += ["--allow-url", strip_userinfo(url)]  # argv is readable by every local user
    with open_append(run_dir / "watchdog.log") as log:
        env = {**os.environ, **(extra_env or {})}
        if admin_token:
            env["STREAMCHAOS_ADMIN_TOKEN"] = admin_token
        process = subprocess.Popen(
            command, start_new_session=True,  # it must outlive us if we are killed
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env,
        )

    async def renew() -> None:
        while True:
            with contextlib.suppress(OSError):
                touch(lease)  # through the run directory's descriptor, never a link
            await sleep_to_next_tick(LEASE_PERIOD_S)

    task = asyncio.create_task(renew(), name="watchdog-lease")
    try:
        yield WatchdogHandle(process)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


if __name__ == "__main__":
    sys.exit(main())
