"""Facts about local processes read from /proc, and whether we may signal one. A leaf module.

A pid alone is not an identity (pids get recycled): every "is it still the process I started?"
question pairs the pid with its start time (``start_time``), as rollback and the watchdog do.
"""

from __future__ import annotations

import os

from chaos.model.errors import FaultPermissionDenied, FaultUnsupported

__all__ = ["alive", "check_signalable", "exit_status", "proc_state", "start_time"]


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (field 3 is index 0), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def proc_state(pid: int) -> str | None:
    """The process state letter (R, S, D, T, t, Z, ...), or None when there is no such process."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def start_time(pid: int) -> int | None:
    """The process start time in clock ticks since boot (stat field 22): with the pid, an identity."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def exit_status(pid: int) -> int | None:
    """The wait status of a zombie (stat field 52), None when it is not a zombie or already reaped."""
    fields = _stat_fields(pid)
    if not fields or fields[0] != "Z" or len(fields) < 50:
        return None
    return int(fields[49])


def alive(pid: int, starttime: int | None = None) -> bool:
    """Running (not a zombie), and the same process when ``starttime`` is given."""
    state = proc_state(pid)
    if state is None or state in ("Z", "X"):
        return False
    return starttime is None or start_time(pid) == starttime


def check_signalable(pid: int | None, what: str) -> None:
    """Raise ``FaultUnsupported`` when ``pid`` is unknown or gone, ``FaultPermissionDenied`` when not ours."""
    if pid is None:
        raise FaultUnsupported(f"{what} needs a pid, which the runner knows only for a target it started")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise FaultUnsupported(f"{what} (pid {pid}) is not running") from None
    except PermissionError as exc:
        raise FaultPermissionDenied(f"{what}: not allowed to signal pid {pid} (another user's?)") from exc
