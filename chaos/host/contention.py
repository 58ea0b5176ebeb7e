"""The noisy neighbour, measured: how busy this host was, and how much of it the run itself used.

A verdict that compares two phases of one run (``recovery``: is the TTFT back to the baseline's?)
assumes the host gave the stack the same CPU in both. On a shared box it may not: a CI job starting
beside the run, a second tenant's batch, another experiment. A CI run of gpu-throttle saw its
recovery-phase TTFT p50 at 1.77x the baseline's (6.7 → 11.9 ms) while another test's vLLM took a
core; the stack had recovered, the host had not stayed the same.

At every phase's start and end, and every ``HOST_PERIOD_S`` between, the runner reads
``/proc/stat`` (CPU time of the whole host), the CPU time of the run's own processes (the runner and
everything it started; the target's process tree where the run knows it) and how long their threads
waited, runnable, for a CPU (``/proc/PID/task/TID/schedstat``), and records per interval four series
in cores:

- ``host_busy_cores``: the whole host's busy CPU;
- ``host_run_cores``: the run's processes and the target's;
- ``host_neighbour_cores``: the rest, what the run does not own;
- ``host_run_wait_cores``: how many of the run's threads were, on average, ready to run and kept
  waiting for a CPU.

The samples at the phase boundaries, stamped with the phase's own start and end, make a phase's
intervals tile it: its mean is the counters' growth over exactly the phase, whatever the period.
The period only shows how the CPU moved inside a phase. It was 0.5 s, with nothing at the
boundaries: sixteen cold samples per 8 s were a third of the runner's CPU at one stream (9.5 of
15 ms), and a phase's first and last interval reached into its neighbours.

``phase_contention`` (pure) reduces them to per-phase means, each interval weighted by its length;
``chaos.execution.verify`` turns a failed phase comparison into ``inconclusive`` when, in the judged
phase against its reference, the run's threads waited materially longer for a CPU *and* the
neighbours took more of it. The wait is what tells the two causes apart: a stack slowed by its own
defect sleeps (its threads do not wait for a CPU) even where a greedy neighbour soaks up the CPU it
leaves; a stack the host starved waits. Linux only; elsewhere nothing is recorded and no verdict changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.host.sampling import polled
from chaos.model.observations import MetricSample, Note, Observations, PhaseWindow

__all__ = [
    "CONTENTION_NOTE",
    "HOST_PERIOD_S",
    "HOST_SATURATED",
    "HostSampler",
    "PhaseContention",
    "SATURATED_SHARE",
    "contention_shift",
    "host_contention",
    "parse_proc_stat",
    "parse_process_stat",
    "parse_schedstat",
    "phase_contention",
    "saturated_host",
]

HOST_PERIOD_S = 2.0
# A sample this soon after the last one starts no interval: one phase's end and the next one's start
# are one boundary, microseconds apart, and a periodic tick just after a boundary adds nothing.
MIN_INTERVAL_NS = 50_000_000
CONTENTION_NOTE = "host_contention"
# a host this busy starves whatever relays a stream, bunching its events (measured: 1.998-2.001 of 2 cores
# beside the suite and two busy loops; 1.11-1.16 for the same nginx-fronted smoke on a quiet box)
SATURATED_SHARE = 0.95
HOST_SATURATED = "host saturated"  # the inconclusive cause a verdict gives when such a host explains its figure
BUSY, RUN, NEIGHBOUR, WAIT = "host_busy_cores", "host_run_cores", "host_neighbour_cores", "host_run_wait_cores"
# A neighbour explains a failed comparison when, over the reference phase, the run's threads waited
# for a CPU this much longer (cores of waiting, and this factor) while CPU moved from the run to the
# neighbours: theirs up by at least this much (cores, or this share of the CPUs on a big host) and
# the run's own not up by as much. In CI, beside another test's vLLM, engine-crash's recovery read
# 1.93x (0.93-0.98x alone) while the neighbours went 1.01 → 1.20 cores, the run's own 0.97 → 0.80
# and its threads' wait 0.72 → 1.26 cores; three busy loops started in a recovery phase on a loaded
# CI box took the neighbours 1.09 → 1.54 cores and the run 0.89 → 0.46.
WAIT_RISE_CORES, WAIT_RISE_FACTOR = 0.1, 1.5
KEPT_OPEN_LIMIT = 128  # /proc files a sampler keeps open (a few per thread of the run's processes)
PROC_CHUNK = 65536
NEIGHBOUR_RISE_CORES, NEIGHBOUR_RISE_SHARE = 0.1, 0.02


def parse_proc_stat(text: str) -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs from ``/proc/stat``'s ``cpu`` line. Pure.

    Busy is everything but idle and iowait; guest time is already inside user and nice."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
            idle = ticks[3] + ticks[4]
            return sum(ticks) - idle, sum(ticks)
    raise ValueError("no aggregate cpu line in /proc/stat")


def parse_process_stat(text: str) -> tuple[int, int]:
    """(ppid, utime + stime ticks) from ``/proc/PID/stat``. Pure. The command name may hold spaces
    and parentheses, so fields are counted from its last ``)``."""
    rest = text[text.rindex(")") + 2:].split()
    return int(rest[1]), int(rest[11]) + int(rest[12])  # fields 4, 14 and 15 of proc(5)


def _read(path: str) -> str:
    """A /proc file's whole text, by raw descriptor reads: ``Path.read_text`` builds a buffered text
    stream per file (an fstat, an isatty ioctl, two lseeks: nine system calls, against three here),
    and a sample reads a few files per thread of the run every sample. Undecodable bytes (a
    process may name itself anything) are replaced, not fatal."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


class _KeptOpen:
    """The run's own /proc files, opened once and read again from offset 0 each sample (``pread``).

    A seq_file (``stat``, ``schedstat``, ``children``) regenerates its text on a read at offset 0,
    so a kept descriptor reads fresh figures in one system call where ``_read`` takes three (open,
    read, close) on a cold runner. A descriptor of a process or thread that ended
    fails its read (ESRCH) and is dropped; ones a sample did not read are closed after it, so a
    recycled pid is opened afresh. At most ``limit``: a run near its open-files limit keeps streams
    before these."""

    def __init__(self, limit: int = KEPT_OPEN_LIMIT) -> None:
        self.limit = limit
        self._fds: dict[str, int] = {}
        self._read_now: set[str] = set()

    def read(self, path: str) -> str:
        fd = self._fds.get(path)
        if fd is None:
            if len(self._fds) >= self.limit:
                return _read(path)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            self._fds[path] = fd
        self._read_now.add(path)
        try:
            chunks = [os.pread(fd, PROC_CHUNK, 0)]
            while len(chunks[-1]) == PROC_CHUNK:  # a seq_file reads short only at its end
                chunks.append(os.pread(fd, PROC_CHUNK, PROC_CHUNK * len(chunks)))
        except OSError:
            self._close(path)
            raise
        return b"".join(chunks).decode("utf-8", "replace")

    def sweep(self) -> None:
        """Close what the last sample did not read: threads and processes that are gone."""
        for path in [p for p in self._fds if p not in self._read_now]:
            self._close(path)
        self._read_now.clear()

    def close(self) -> None:
        for path in list(self._fds):
            self._close(path)

    def _close(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)


def _process_table(proc: Path) -> dict[int, tuple[int, int]]:
    """pid → (ppid, CPU ticks) for every process readable now; ones that exit meanwhile are skipped."""
    table: dict[int, tuple[int, int]] = {}
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            table[int(entry.name)] = parse_process_stat(_read(f"{entry.path}/stat"))
        except (OSError, ValueError, IndexError):
            continue
    return table


def parse_schedstat(text: str) -> int:
    """Nanoseconds a thread spent runnable but waiting for a CPU, from its ``schedstat``. Pure."""
    return int(text.split()[1])


def _waits(proc: Path, pids: Iterable[int]) -> dict[tuple[int, int], int]:
    """(pid, tid) → run-queue wait in ns, for every thread of ``pids`` readable now."""
    out: dict[tuple[int, int], int] = {}
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"{proc}/{pid}/task")]
        except (OSError, ValueError):
            continue
        for tid in tids:
            try:
                out[(pid, tid)] = parse_schedstat(_read(f"{proc}/{pid}/task/{tid}/schedstat"))
            except (OSError, ValueError, IndexError):
                continue
    return out


def _grown(now: Mapping[Any, int], before: Mapping[Any, int]) -> int:
    """What the counters grew by since ``before``; one new since then counts whole (it began in the interval)."""
    return sum(value - before.get(key, 0) for key, value in now.items() if value >= before.get(key, 0))


def _tree(table: Mapping[int, tuple[int, int]], roots: Iterable[int]) -> set[int]:
    """The roots that exist and all their descendants."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    seen: set[int] = set()
    todo = [r for r in roots if r in table]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(children.get(pid, ()))
    return seen


def _walk(proc: Path, roots: Iterable[int],
          files: _KeptOpen) -> tuple[dict[int, int], dict[tuple[int, int], int]] | None:
    """From ``roots`` down through each thread's ``children`` file: pid → CPU ticks and (pid, tid) →
    run-queue wait, for the run's processes only. None where the kernel has no ``children`` files
    (CONFIG_PROC_CHILDREN off): the caller then reads the whole process table.

    Why not read the whole table every time: that is a ``stat`` read per process on the host, twice a
    second, for the few the run owns: 7.9 ms a sample with 139 processes here (1.6% of a core of the
    runner's), against 0.49 ms for the run's own tree."""
    ticks: dict[int, int] = {}
    waits: dict[tuple[int, int], int] = {}
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in ticks:
            continue
        base = f"{proc}/{pid}"
        try:
            ticks[pid] = parse_process_stat(files.read(f"{base}/stat"))[1]
            tids = [int(t) for t in os.listdir(f"{base}/task")]
        except (OSError, ValueError, IndexError):
            ticks.pop(pid, None)
            continue  # gone meanwhile, or never ours to read
        for tid in tids:
            task = f"{base}/task/{tid}"
            try:
                waits[(pid, tid)] = parse_schedstat(files.read(f"{task}/schedstat"))
                children = files.read(f"{task}/children")
            except FileNotFoundError:
                if not os.path.exists(f"{task}/stat"):
                    continue  # the thread ended between listdir and here
                return None  # the thread is there, its children file is not: no such files on this kernel
            except (OSError, ValueError, IndexError):
                continue
            todo.extend(int(child) for child in children.split())
    return ticks, waits


class HostSampler:
    """Reads the host's and the run's CPU ticks and waits; ``sample()`` returns the four series for
    the interval since the previous call (nothing on the first). ``roots()`` names the processes
    the run owns."""

    def __init__(self, roots: Callable[[], Iterable[int]], proc: Path = Path("/proc")) -> None:
        self.roots = roots
        self.proc = proc
        self.tick_hz = os.sysconf("SC_CLK_TCK")
        self.whole_table = False  # set once the kernel turns out to have no children files
        self._last: tuple[int, int, dict[int, int], dict[tuple[int, int], int]] | None = None  # t, busy, ours, waits
        self._files = _KeptOpen()
        self._lock = threading.Lock()  # the periodic sample may run in a thread (whole_table)

    def _ours(self) -> tuple[dict[int, int], dict[tuple[int, int], int]]:
        roots = list(self.roots())
        if not self.whole_table:
            walked = _walk(self.proc, roots, self._files)
            self._files.sweep()
            if walked is not None:
                return walked
            self.whole_table = True
            self._files.close()
        table = _process_table(self.proc)
        tree = _tree(table, roots)
        return {pid: table[pid][1] for pid in tree}, _waits(self.proc, tree)

    def close(self) -> None:
        """Close the /proc files kept open between samples."""
        with self._lock:
            self._files.close()

    def sample(self, t: int | None = None) -> list[MetricSample]:
        """The interval since the last sample, ending at ``t`` (now by default: a phase boundary passes
        its own stamp, taken microseconds before); nothing on the first call, nor within
        ``MIN_INTERVAL_NS`` of the last one (that one's interval already ends here)."""
        with self._lock:
            return self._sample(time.monotonic_ns() if t is None else t)

    def _sample(self, t: int) -> list[MetricSample]:
        if self._last is not None and t - self._last[0] < MIN_INTERVAL_NS:
            return []
        busy, _total = parse_proc_stat(_read(f"{self.proc}/stat") if self.whole_table
                                       else self._files.read(f"{self.proc}/stat"))
        ours, waits = self._ours()
        last, self._last = self._last, (t, busy, ours, waits)
        if last is None:
            return []
        t0, busy0, ours0, waits0 = last
        seconds = (t - t0) / 1e9
        if seconds <= 0:
            return []
        # a process of ours that exited took its last interval with it (a small undercount, counted as neighbour)
        busy_cores = (busy - busy0) / self.tick_hz / seconds
        run_cores = min(busy_cores, _grown(ours, ours0) / self.tick_hz / seconds)
        wait_cores = _grown(waits, waits0) / 1e9 / seconds
        return [MetricSample(BUSY, {}, busy_cores, t), MetricSample(RUN, {}, run_cores, t),
                MetricSample(NEIGHBOUR, {}, max(0.0, busy_cores - run_cores), t), MetricSample(WAIT, {}, wait_cores, t)]


def host_cpus() -> int:
    return os.cpu_count() or 1


class _AtPhaseBoundaries:
    """A run listener that samples at each phase's start and end, stamped with the phase's own stamp.

    The sample is read at once, in the listener (about 0.3 ms, on the loop as the periodic one is);
    its records go to the sink on the loop's next turn, so the bus is not re-entered while it is
    still handing out the phase's event. Not where the sampler reads the whole process table (a
    kernel without children files: milliseconds): there the periodic samples in a thread are all."""

    def __init__(self, sampler: HostSampler, sink: Callable[[MetricSample | Note], None]) -> None:
        self.sampler, self.sink = sampler, sink
        self.loop = asyncio.get_running_loop()
        self.open = True

    def on_event(self, event: object) -> None:
        if not self.open or not isinstance(event, PhaseWindow) or self.sampler.whole_table:
            return
        try:
            records = self.sampler.sample(event.t_end if event.t_end is not None else event.t_start)
        except (OSError, ValueError):
            return  # the periodic sample meets the same error and notes it
        if records:
            self.loop.call_soon(self._deliver, records)

    def _deliver(self, records: list[MetricSample]) -> None:
        if self.open:
            for record in records:
                self.sink(record)


@contextlib.asynccontextmanager
async def host_contention(sink: Callable[[MetricSample | Note], None], roots: Callable[[], Iterable[int]], *,
                          target_known: bool, period_s: float = HOST_PERIOD_S,
                          subscribe: Callable[[Any], None] | None = None) -> AsyncIterator[bool]:
    """Record the host's CPU use while entered (Linux); yields whether it records.

    ``target_known``: the run knows the target's processes (it started them). Where it does not (an
    engine started elsewhere on this host), the target's CPU is counted as neighbour's, so the
    figures are recorded but no verdict is changed by them. ``subscribe``: how to hear the run's
    events (``EventBus.subscribe``), for the samples at phase boundaries; without it, only periodic."""
    if not Path("/proc/stat").is_file():
        yield False
        return
    sampler = HostSampler(roots)
    boundaries = _AtPhaseBoundaries(sampler, sink)
    if subscribe is not None:
        subscribe(boundaries)
    sink(Note(topic=CONTENTION_NOTE, t=time.monotonic_ns(), data={"cpus": host_cpus(), "period_s": period_s,
                                                                   "target_processes_known": target_known}))
    # On the loop, not in a thread, while the walk down the run's own tree works: it reads only /proc
    # files that do not wait on the process they describe (stat, schedstat, children; no mm lock, as
    # cmdline and maps take), about 0.1 ms for a run's few processes, while a thread hand-off twice a
    # second was a third of the idle runner's CPU (26 against 17 ms per 8 s at one stream). Reading
    # the whole process table instead (a kernel without children files: 8 ms at 139 processes) would
    # hold the loop, and a run with `load.process: runner` stamps on it: that goes to a thread.
    try:
        async with polled(sampler.sample, sink, period_s=period_s, name="host_contention",
                          errors=(OSError, ValueError), in_thread=lambda: sampler.whole_table):
            yield True
    finally:
        boundaries.open = False  # the bus has no unsubscribe: the listener goes quiet
        sampler.close()


@dataclass(frozen=True)
class PhaseContention:
    """Mean cores over one phase's intervals."""

    phase: str
    busy: float
    run: float
    neighbour: float
    wait: float  # the run's threads waiting for a CPU
    intervals: int


def _mean_within(samples: Sequence[MetricSample], start: int, end: int, first_ns: int) -> tuple[float, int]:
    """The mean over the intervals that end in (start, end], each weighted by its length: the time
    since the series' previous sample, ``first_ns`` for the first (its start is not recorded).
    ``samples`` in time order. Pure."""
    total = weight = 0.0
    n, previous = 0, None
    for sample in samples:
        if start < sample.t <= end:
            length = sample.t - previous if previous is not None else first_ns
            total += sample.value * length
            weight += length
            n += 1
        previous = sample.t
    return (total / weight, n) if n and weight > 0 else (0.0, 0)


def phase_contention(obs: Observations) -> dict[str, PhaseContention]:
    """Per phase with recorded intervals, the mean busy, run and neighbour cores. Pure."""
    notes = obs.notes_on(CONTENTION_NOTE)
    period_s = float((notes[-1].data.get("period_s") if notes else None) or HOST_PERIOD_S)
    first_ns = int(period_s * 1e9)
    series = {name: obs.series(name) for name in (BUSY, RUN, NEIGHBOUR, WAIT)}  # each in time order
    out: dict[str, PhaseContention] = {}
    for window in obs.phases:
        if window.t_end is None:
            continue
        busy, n = _mean_within(series[BUSY], window.t_start, window.t_end, first_ns)
        if n == 0:
            continue
        run, _ = _mean_within(series[RUN], window.t_start, window.t_end, first_ns)
        neighbour, _ = _mean_within(series[NEIGHBOUR], window.t_start, window.t_end, first_ns)
        wait, _ = _mean_within(series[WAIT], window.t_start, window.t_end, first_ns)
        out[window.name] = PhaseContention(window.name, busy, run, neighbour, wait, n)
    return out


def contention_shift(obs: Observations, judged: str, reference: str) -> dict[str, Any] | None:
    """Why the host, not the stack, may explain a difference between ``judged`` and ``reference``;
    None when it cannot. Pure.

    Both must hold over the reference phase: the run's threads waited longer for a CPU, and CPU
    moved from the run to the neighbours. Never where the run did not know the target's processes."""
    notes = obs.notes_on(CONTENTION_NOTE)
    if not notes or not notes[-1].data.get("target_processes_known"):
        return None
    cpus = int(notes[-1].data.get("cpus") or host_cpus())
    per_phase = phase_contention(obs)
    if judged not in per_phase or reference not in per_phase:
        return None
    j, r = per_phase[judged], per_phase[reference]
    waited_longer = j.wait - r.wait >= WAIT_RISE_CORES and j.wait >= WAIT_RISE_FACTOR * r.wait
    neighbours_gained = j.neighbour - r.neighbour
    cpu_moved = (neighbours_gained >= max(NEIGHBOUR_RISE_CORES, NEIGHBOUR_RISE_SHARE * cpus)
                 and j.run - r.run < neighbours_gained)
    if not (waited_longer and cpu_moved):
        return None
    return {
        "cpus": cpus,
        "neighbour_cores": {reference: round(r.neighbour, 2), judged: round(j.neighbour, 2)},
        "run_cores": {reference: round(r.run, 2), judged: round(j.run, 2)},
        "run_wait_cores": {reference: round(r.wait, 2), judged: round(j.wait, 2)},
        "why": (f"other processes on this host used {j.neighbour:.2f} cores in {judged!r} against {r.neighbour:.2f} "
                f"in {reference!r}, and the run's threads waited for a CPU {j.wait:.2f} cores' worth against "
                f"{r.wait:.2f}: the host changed between the phases"),
    }


def saturated_host(obs: Observations, phase: str | None) -> dict[str, Any] | None:
    """The host's busy cores over ``phase`` (None: every phase) when at least ``SATURATED_SHARE`` of its
    cores were busy (this module's samples), else None. Pure."""
    notes = obs.notes_on(CONTENTION_NOTE)
    if not notes:
        return None
    cpus = int(notes[-1].data.get("cpus") or 0)
    per_phase = [c for name, c in phase_contention(obs).items() if phase is None or name == phase]
    intervals = sum(c.intervals for c in per_phase)
    if cpus <= 0 or not intervals:
        return None
    busy = sum(c.busy * c.intervals for c in per_phase) / intervals
    wait = sum(c.wait * c.intervals for c in per_phase) / intervals
    if busy < SATURATED_SHARE * cpus:
        return None
    return {"cpus": cpus, "busy_cores": round(busy, 3), "run_wait_cores": round(wait, 3)}
