"""Helper processes for the non-invasive GPU-throttle backends: CPU/GPU contention and SIGSTOP duty cycles.

Run as ``python PATH/chaos/gpu/burner.py MODE ...`` (by path, not ``-m``, so a helper starts in ~0.1s without
importing every fault family); the fault side uses ``spawn``, ``kill_verified`` and ``find_burners``.

    cpu   --busy F --period S            spin F of every period on the CPU (a co-tenant on the engine's cores)
    cuda  --device N --busy F --period S matrix products on cuda:N for F of every period (a GPU co-tenant)
    duty  --pid P --fraction F --period S let process P run only F of every period (SIGCONT/SIGSTOP)

Every helper is bounded: it exits after ``--max-seconds`` (hard cap one hour), when its parent
dies (PR_SET_PDEATHSIG plus a ``getppid`` check, so a killed runner leaves no burner behind), and on
SIGTERM/SIGINT/SIGHUP. The duty cycler always sends SIGCONT to its target on the way out. Each
helper's command line carries ``--tag``, so a rollback in another process can check that a pid is
still the burner it started before killing it (pids get recycled). After setup a helper prints one
line ``ready {json}`` on stdout, so the fault knows it is running (or reads why not from stderr).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from chaos.host.procs import exit_status, proc_state, start_time

__all__ = [
    "HARD_CAP_S",
    "SCRIPT",
    "exit_status",
    "find_burners",
    "is_burner",
    "kill_verified",
    "main",
    "new_tag",
    "proc_state",
    "spawn",
    "start_time",
    "valid_tag",
]

HARD_CAP_S = 3600.0
SCRIPT = str(Path(__file__).resolve())
_PR_SET_PDEATHSIG = 1
# What a helper's command line names: this module, and where it lived before it moved out of faults/
# (a rollback of a journal written then must still recognise the helpers that run started).
_SCRIPT_PATHS = (b"chaos/gpu/burner.py", b"faults/burner.py")
_MODULE_NAMES = (b"chaos.gpu.burner", b"faults.burner")


_TAG = re.compile(r"streamchaos-[0-9a-f]{16}")


def new_tag() -> str:
    """A tag unique to one inject: its helpers, and only they, carry it."""
    return f"streamchaos-{uuid.uuid4().hex[:16]}"


def valid_tag(tag: str) -> bool:
    """Whether ``tag`` has the shape ``new_tag`` makes (a journal may be crafted: never trust it blindly)."""
    return _TAG.fullmatch(tag) is not None


def is_burner(pid: int, tag: str) -> bool:
    """True when ``pid`` is a live ``chaos.gpu.burner`` helper whose ``--tag`` argument is exactly ``tag``."""
    if not valid_tag(tag):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    # A zombie has an empty cmdline: nothing left to kill.
    script = any(a.endswith(_SCRIPT_PATHS) for a in argv[1:2]) or any(m in argv for m in _MODULE_NAMES)
    tagged = any(flag == b"--tag" and value == tag.encode() for flag, value in zip(argv, argv[1:], strict=False))
    return script and tagged and proc_state(pid) not in (None, "Z", "X")


def find_burners(tag: str) -> list[int]:
    """Every live helper started with ``--tag tag`` (tags are unique per inject, so no pid reuse risk)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and is_burner(int(entry), tag):
            found.append(int(entry))
    return sorted(found)


# ---- the fault side ------------------------------------------------------------------------------


def spawn(mode: str, args: Sequence[str], *, tag: str, max_seconds: float,
          log: Path | None = None) -> subprocess.Popen[bytes]:
    """Start one helper in its own session; call from the thread that will outlive it (PDEATHSIG)."""
    cmd = [
        sys.executable, SCRIPT, mode, *args,
        "--tag", tag, "--parent-pid", str(os.getpid()), "--max-seconds", f"{min(max_seconds, HARD_CAP_S):.3f}",
    ]
    env = dict(os.environ)
    stderr: Any = subprocess.DEVNULL
    if log is not None:
        from chaos.host.runfiles import open_append

        log.parent.mkdir(parents=True, exist_ok=True)
        stderr = open_append(log)  # handed to the child, closed below
    try:
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, env=env,
            start_new_session=True, close_fds=True,
        )
    finally:
        if log is not None:
            stderr.close()


def kill_verified(helpers: Sequence[dict[str, Any]], tag: str, timeout: float = 3.0) -> dict[str, list[int]]:
    """Stop this fault's helpers: SIGTERM, then SIGKILL after ``timeout``; never a stranger.

    ``helpers`` are the recorded ``{"pid", "starttime"}``; a recorded pid is signalled only while it
    is still a burner with ``tag`` and the same start time (pids get recycled). Helpers carrying the
    tag but never recorded (the runner died between spawn and journal) are found through /proc.
    Returns which pids were stopped, which were already gone, and which could not be stopped.
    """
    recorded = {int(h["pid"]): h.get("starttime") for h in helpers}
    live = {p for p, st in recorded.items() if is_burner(p, tag) and (st is None or start_time(p) == st)}
    live.update(find_burners(tag))
    gone = sorted(p for p in recorded if p not in live)
    for pid in live:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    pending = sorted(live)
    while pending and time.monotonic() < deadline:
        time.sleep(0.02)
        pending = [p for p in pending if is_burner(p, tag)]
    for pid in pending:
        _signal_group(pid, signal.SIGKILL)
    if pending:
        time.sleep(0.1)
    stuck = [p for p in pending if is_burner(p, tag)]
    return {"stopped": sorted(p for p in live if p not in stuck), "already_gone": gone, "stuck": stuck}


def _signal_group(pid: int, sig: int) -> None:
    # Each helper leads its own session and process group (start_new_session), so pgid == pid.
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


# ---- the helper side -----------------------------------------------------------------------------


class _Stop(Exception):
    """Raised from a signal handler to leave the work loop through its ``finally``."""


def _on_signal(signum: int, frame: object) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # a second signal must not interrupt the cleanup
    raise _Stop(signal.Signals(signum).name)


def _guard(parent_pid: int) -> None:
    """Die with the parent: PR_SET_PDEATHSIG(SIGTERM), then close the race with a getppid check."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the getppid checks in the loops still end us
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    if os.getppid() != parent_pid:
        raise _Stop("parent gone before start")


def _ready(**facts: Any) -> None:
    sys.stdout.write("ready " + json.dumps(facts) + "\n")
    sys.stdout.flush()


def _cycles(args: argparse.Namespace) -> Iterator[float]:
    """Yield the start of each period until the deadline or the parent's death."""
    deadline = time.monotonic() + min(args.max_seconds, HARD_CAP_S)
    next_t = time.monotonic()
    while True:
        now = time.monotonic()
        if now >= deadline or os.getppid() != args.parent_pid:
            return
        if now - next_t > args.period:
            next_t = now  # fell behind (stopped, swapped out): restart the grid rather than catch up
        yield next_t
        # A fixed grid, so sleep jitter does not drift the duty share.
        next_t += args.period


def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _run_cpu(args: argparse.Namespace) -> None:
    if args.affinity:
        os.sched_setaffinity(0, {int(c) for c in args.affinity.split(",")})
    _ready(mode="cpu", pid=os.getpid(), busy=args.busy, affinity=sorted(os.sched_getaffinity(0)))
    x = 1.0
    for t0 in _cycles(args):
        busy_until = t0 + args.busy * args.period
        while time.monotonic() < busy_until:
            for _ in range(2000):
                x = x * 1.0000001 + 1e-9
        _sleep_until(t0 + args.period)


def _run_cuda(args: argparse.Namespace) -> None:
    # Run by path, this file's directory heads sys.path: keep our module names from shadowing torch's imports.
    here = os.path.dirname(SCRIPT)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    import torch

    device = torch.device(f"cuda:{args.device}")
    a = torch.randn(args.size, args.size, device=device)
    b = torch.randn(args.size, args.size, device=device)
    torch.cuda.synchronize(device)
    _ready(mode="cuda", pid=os.getpid(), busy=args.busy, device=str(device), name=torch.cuda.get_device_name(device))
    c = torch.empty_like(a)
    for t0 in _cycles(args):
        busy_until = t0 + args.busy * args.period
        while time.monotonic() < busy_until:
            torch.mm(a, b, out=c)
            torch.cuda.synchronize(device)
        _sleep_until(t0 + args.period)


def _cont(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def _run_duty(args: argparse.Namespace) -> None:
    pid = args.pid
    if args.starttime is not None and start_time(pid) != args.starttime:
        raise _Stop(f"pid {pid} is no longer the target process")
    run_s, stop_s = args.fraction * args.period, (1.0 - args.fraction) * args.period
    _ready(mode="duty", pid=os.getpid(), target=pid, run_s=run_s, stop_s=stop_s)
    try:
        for t0 in _cycles(args):
            os.kill(pid, signal.SIGCONT)
            _sleep_until(t0 + run_s)
            if stop_s > 0:
                if args.starttime is not None and start_time(pid) != args.starttime:
                    return  # the target died and its pid was reused: never stop a stranger
                os.kill(pid, signal.SIGSTOP)
                _sleep_until(t0 + args.period)
    except ProcessLookupError:
        return  # the target is gone: nothing left to cycle
    finally:
        # However we leave (deadline, SIGTERM, parent death, an error), the target runs again.
        _cont(pid)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chaos/gpu/burner.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--tag", required=True, help="identifies this fault's helpers for a later rollback")
    common.add_argument("--parent-pid", type=int, required=True, help="exit when this process is no longer the parent")
    common.add_argument("--max-seconds", type=float, required=True,
                        help=f"exit after this long (capped at {HARD_CAP_S:g})")
    common.add_argument("--period", type=float, default=0.1, help="seconds per cycle")
    cpu = sub.add_parser("cpu", parents=[common])
    cpu.add_argument("--busy", type=float, required=True, help="busy share of each period, 0..1")
    cpu.add_argument("--affinity", default="", help="comma-separated CPUs to run on")
    cuda = sub.add_parser("cuda", parents=[common])
    cuda.add_argument("--busy", type=float, required=True)
    cuda.add_argument("--device", type=int, default=0)
    cuda.add_argument("--size", type=int, default=4096, help="square matrix size")
    duty = sub.add_parser("duty", parents=[common])
    duty.add_argument("--pid", type=int, required=True, help="the process to duty-cycle")
    duty.add_argument("--starttime", type=int, default=None, help="its /proc start time, to detect pid reuse")
    duty.add_argument("--fraction", type=float, required=True, help="running share of each period, 0..1")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for name in ("busy", "fraction"):
        value = getattr(args, name, None)
        if value is not None and not 0.0 <= value <= 1.0:
            print(f"burner: --{name} must lie in [0, 1], found {value}", file=sys.stderr)
            return 2
    if args.period <= 0:
        print(f"burner: --period must be positive, found {args.period}", file=sys.stderr)
        return 2
    run = {"cpu": _run_cpu, "cuda": _run_cuda, "duty": _run_duty}[args.mode]
    try:
        _guard(args.parent_pid)
        run(args)
    except _Stop as why:
        print(f"burner {args.mode} stopping: {why}", file=sys.stderr)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
