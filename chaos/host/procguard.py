"""A guard for a server tree the runner spawns but did not write (vLLM): nothing of it outlives the run.

    python -m chaos.host.procguard --parent PID [--grace 10s-as-seconds] -- COMMAND...

The guard leads its own process group (the runner starts it with ``start_new_session``), starts
COMMAND in that group, prints the command's pid on its first stdout line, and then waits. vLLM's
API server starts an ``EngineCore`` process and that a worker; a SIGKILLed API server leaves both
running (measured: still there 15 s later, holding the KV cache's memory). So the guard ends the
whole group, SIGTERM then SIGKILL after ``--grace`` seconds:

- when COMMAND exits (a ``process.kill`` of the API server): whatever it left in the group;
- when the runner is gone (its pid is no longer our parent: killed, even with SIGKILL);
- when the guard itself gets SIGTERM or SIGINT (the runner's ``stop``).

It exits with COMMAND's status (128 + signal for a signalled one), after writing what it ended to
stderr (the target's log). The group is journaled by the runner (``group_undo``), so a guard that
was itself SIGKILLed is still rolled back by ``streamchaos rollback`` (``rollback_group``), which
checks the leader's start time first, so a reused pid is never signalled.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

from chaos.host.procs import start_time

__all__ = ["engine_core_pid", "group_members", "group_undo", "main", "rollback_group", "terminate_group"]

POLL_S = 0.2
GRACE_S = 10.0


def group_members(pgid: int, *, exclude: int | None = None) -> list[int]:
    """Live pids in process group ``pgid`` (from /proc), but ``exclude``; zombies left out."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == exclude:
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return sorted(members)


def engine_core_pid(server_pid: int) -> int | None:
    """vLLM's EngineCore process in the API server's process group (it sets that process title)."""
    try:
        pgid = os.getpgid(server_pid)
    except ProcessLookupError:
        return None
    for pid in group_members(pgid):
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
                if f.read().strip().startswith("VLLM::EngineCor"):
                    return pid
        except OSError:
            continue
    return None


def terminate_group(pgid: int, grace_s: float, *, exclude: int | None = None) -> list[int]:
    """SIGTERM every member of ``pgid`` but ``exclude``, SIGKILL those left after ``grace_s``; the pids signalled."""
    signalled = group_members(pgid, exclude=exclude)
    for pid in signalled:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while group_members(pgid, exclude=exclude) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    for pid in group_members(pgid, exclude=exclude):
        _signal(pid, signal.SIGKILL)
    return signalled


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def group_undo(guard_pid: int) -> dict[str, Any]:
    """What the journal keeps to roll the group back: its id and its leader's start time."""
    return {"pgid": guard_pid, "leader_start_time": start_time(guard_pid)}


def rollback_group(undo: Mapping[str, Any]) -> dict[str, Any]:
    """End a journaled process group if it is still the one the run started (``streamchaos rollback``)."""
    pgid, started = int(undo["pgid"]), undo.get("leader_start_time")
    members = group_members(pgid)
    if not members:
        return {"skipped": f"process group {pgid} is gone; nothing to undo"}
    if pgid in members and started is not None and start_time(pgid) != started:
        return {"skipped": f"pid {pgid} is another process now (start time differs); not signalled"}
    if pgid not in members:  # the guard died; the kernel allocates no pid that is still a live group's id,
        # so a group that still has members under this id is the one the run started
        return {"ended": terminate_group(pgid, GRACE_S), "note": "the guard was gone; its group was ended"}
    return {"ended": terminate_group(pgid, GRACE_S)}


def _remove_dirs(paths: list[str]) -> None:
    """After the group ended, nothing uses them: a killed runner's target leaves no sockets behind."""
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.host.procguard", description=__doc__.splitlines()[0])
    parser.add_argument("--parent", type=int, required=True, help="the runner's pid: the group ends when it is gone")
    parser.add_argument("--grace", type=float, default=GRACE_S, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--cpus",
                        help="CPU list (0-2,5) the command and everything it forks may run on (chaos.host.cpuset)")
    parser.add_argument("--remove-dir", action="append", default=[],
                        help="a directory the command's tree uses (IPC sockets): removed once the group ended")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to guard after --")
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    if args.cpus:
        from chaos.host.cpuset import parse_cpu_list

        os.sched_setaffinity(0, parse_cpu_list(args.cpus))  # before the fork: the whole tree inherits it
    # same group: ours; its output goes where ours goes (the target's log), never to the pid pipe
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(), stderr=subprocess.STDOUT)
    print(child.pid, flush=True)
    sys.stdout.close()
    me = os.getpid()
    why = ""
    while child.poll() is None:
        if stopping:
            why = f"guard got {signal.Signals(stopping[0]).name}"
            break
        if os.getppid() != args.parent:
            why = f"runner {args.parent} is gone"
            break
        time.sleep(POLL_S)
    if why:
        ended = terminate_group(me, args.grace, exclude=me)
        child.wait()
        _remove_dirs(args.remove_dir)
        sys.stderr.write(f"[streamchaos guard] {why}: ended process group {me} ({len(ended)} processes: {ended})\n")
        return _status(child.returncode)
    left = terminate_group(me, args.grace, exclude=me)  # what the command left behind
    _remove_dirs(args.remove_dir)
    sys.stderr.write(f"[streamchaos guard] pid {child.pid} exited with status {child.returncode}; "
                     f"{len(left)} processes it left in the group were ended: {left}\n")
    return _status(child.returncode)


if __name__ == "__main__":
    sys.exit(main())
