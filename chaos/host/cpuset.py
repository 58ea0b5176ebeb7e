"""Which host CPUs a spawned server may run on, so it cannot starve the load generator that judges it.

vLLM on CPU keeps every core it is given busy: its model worker computes on the cores OpenMP is
bound to, its EngineCore spins (``sched_yield``) waiting for the worker, and its API server and a
dozen gloo/ZMQ threads wake constantly. On a 2-core host (kernel 6.18) that starved every other
process: the runner's event loop, ready to run, waited up to 667 ms for a core (``perf sched
latency``), its client-lag p99 was 250-420 ms, 71% of 32-token streams arrived in a single read and
``streaming`` blamed a proxy. With vLLM confined to one core and the other left to the load, the
same smoke run had client lag p99 13 ms, TTFT p75 28 ms instead of 100-129 ms, and every verdict
passed. So on CPU the vllm target leaves one CPU to the load by default.

``target.cpus``: ``auto`` (on CPU with two or more CPUs allowed: all but the last; on CUDA: no
restriction), ``all`` (no restriction), or a list such as ``0-5,8``. Pure functions; the affinity
itself is set by ``chaos.host.procguard`` before it starts the server, so every process vLLM forks
inherits it.
"""

from __future__ import annotations

import os
import re

__all__ = ["allowed_cpus", "format_cpu_list", "parse_cpu_list", "server_cpus", "validate_setting"]

_ITEM = re.compile(r"(\d+)(?:-(\d+))?")
MAX_CPU = 4095  # the kernel's own ceiling for a CPU number on common configurations


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """``"0-3,8"`` → (0, 1, 2, 3, 8), sorted and unique; ValueError saying what is wrong. Pure."""
    cpus: set[int] = set()
    for raw in text.split(","):
        item = raw.strip()
        match = _ITEM.fullmatch(item)
        if not match:
            raise ValueError(f"expected CPU numbers and ranges such as 0-3,8, found {item!r}")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise ValueError(f"range {item!r} runs backwards: write {high}-{low}")
        if high > MAX_CPU:
            raise ValueError(f"CPU {high} is beyond {MAX_CPU}")
        cpus.update(range(low, high + 1))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: tuple[int, ...]) -> str:
    """(0, 1, 2, 5) → ``"0-2,5"``, as taskset and /proc write it. Pure."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in runs)


def validate_setting(setting: str) -> str | None:
    """Why ``target.cpus`` is malformed, or None. Pure (the host's CPUs are checked at start-up)."""
    if setting in ("auto", "all"):
        return None
    try:
        parse_cpu_list(setting)
    except ValueError as exc:
        return f"expected auto, all or a CPU list such as 0-3,8: {exc}"
    return None


def server_cpus(setting: str, device: str, allowed: tuple[int, ...]) -> tuple[int, ...] | None:
    """The CPUs the server gets, or None for no restriction; ValueError when a list names a CPU this
    process may not use. ``allowed``: the runner's own affinity, sorted. Pure."""
    if setting == "all":
        return None
    if setting == "auto":
        if device != "cpu" or len(allowed) < 2:
            return None
        return allowed[:-1]  # the last one is the load generator's
    wanted = parse_cpu_list(setting)
    missing = sorted(set(wanted) - set(allowed))
    if missing:
        raise ValueError(f"target.cpus names CPUs {format_cpu_list(tuple(missing))}, which this process may not use "
                         f"(allowed: {format_cpu_list(allowed)})")
    return wanted


def allowed_cpus() -> tuple[int, ...]:
    """This process's CPU affinity, sorted."""
    return tuple(sorted(os.sched_getaffinity(0)))
