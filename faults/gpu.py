"""GPU faults: SM clock throttling (NVML lock, or contention / duty-cycle fallbacks), power caps, telemetry.

``gpu.throttle`` backends, all producing the same symptom (decode slows, queues build, TTFT tail grows):

- ``nvml``: lock the SM clock with ``nvmlDeviceSetGpuLockedClocks`` to the nearest supported clock at or
  below the target, read it back, reset on revert. Device-global: needs root and
  ``safety.allow_gpu_clock_changes``. A killed run is undone by ``Fault.rollback`` (the plan records the
  device UUID and the clock it locked; rollback loads only the configured NVML library and resets the
  clock only while it can still be this run's lock).
- ``contention``: a co-tenant that keeps the engine's device busy (``chaos.gpu.burner``): matrix products on
  a CUDA device, or busy workers pinned to the engine's CPUs. Workers per unit and busy share are sized
  so that, under fair sharing, the engine keeps about ``fraction_of_max`` of its device.
- ``cpu_duty``: for a CPU engine, a helper SIGSTOPs/SIGCONTs the engine process so it runs only
  ``fraction_of_max`` of each ``period``; it always SIGCONTs on the way out, and rollback does too.
- ``auto``: nvml if NVML is present, the engine is on a GPU and clock changes are allowed; else
  contention on that GPU; else cpu_duty when the engine's pid is known and it runs on CPU; else CPU
  contention. The choice and why go into the inject evidence.

Helpers are started with ``start_new_session`` from the event loop's thread, die with their parent,
and are bounded by the phase duration plus a margin (hard cap one hour); their pids and a unique tag
go into the journal so ``streamchaos rollback`` can stop them.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from chaos.gpu import burner
from chaos.gpu.nvml import LIB_ENV, Nvml, nvml_available
from chaos.host.procs import check_signalable, proc_state, start_time
from chaos.model.context import FaultAccount, RunContext, Scene
from chaos.model.errors import FaultError, FaultPermissionDenied, FaultUnsupported
from chaos.model.params import Param, Schema
from faults.base import Fault, Injection, register

if TYPE_CHECKING:
    from chaos.model.experiment import Experiment

__all__ = [
    "GpuPowerCap",
    "GpuThrottle",
    "choose_backend",
    "clock_at_or_below",
    "contention_shape",
]

SAFETY_KEY = "safety.allow_gpu_clock_changes"
MIN_FRACTION = 0.05  # below this a duty cycle or contention is an outage, not a throttle: use process.kill
HELPER_MARGIN_S = 60.0  # helpers outlive their phase by this much at most if nobody stops them
DEFAULT_PHASE_S = 600.0  # when the phase duration is unknown (a fault driven outside the runner)
READY_TIMEOUT_CPU_S = 15.0
READY_TIMEOUT_CUDA_S = 90.0  # torch import plus CUDA context creation
MAX_CPU_WORKERS = 64
VOLTA = 5  # nvmlDeviceArchitecture_t: locked SM clocks need Volta or newer
CLOCK_TOLERANCE_MHZ = 15  # a clock read this far above ours is someone else's setting
POWER_TOLERANCE_W = 1.0


# ---- pure decisions ------------------------------------------------------------------------------


def clock_at_or_below(target_mhz: float, supported: Sequence[int]) -> int:
    """The highest supported clock not above ``target_mhz``; the lowest supported one if all are above."""
    if not supported:
        raise FaultUnsupported("the GPU lists no supported SM clocks; alternatives: backend contention or cpu_duty")
    below = [c for c in supported if c <= target_mhz]
    return max(below) if below else min(supported)


def contention_shape(fraction: float) -> tuple[int, float]:
    """Co-tenant workers per device unit and their busy share so the engine keeps ``fraction`` of it.

    Under fair sharing a unit (a core, a GPU) shared with k busy workers gives the engine 1/(1+k) while
    they are busy and all of it while they idle; with busy share b the engine keeps
    1 - b*k/(1+k). Solve for the fewest workers with b <= 1.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must lie in (0, 1], found {fraction}")
    if fraction >= 1.0:
        return 0, 0.0
    workers = max(1, math.ceil((1.0 - fraction) / fraction - 1e-9))
    busy = min(1.0, (1.0 - fraction) * (1 + workers) / workers)
    return workers, busy


def choose_backend(requested: str, *, device: str, nvml_ok: bool, allowed: bool,
                   target_pid: int | None) -> tuple[str, str]:
    """The backend that acts, and why (for the evidence)."""
    on_gpu = device.startswith("cuda")
    if requested != "auto":
        return requested, f"backend {requested} requested"
    if on_gpu and nvml_ok and allowed:
        return "nvml", f"NVML present, engine on {device}, {SAFETY_KEY} is true"
    if on_gpu:
        reason = "NVML absent" if not nvml_ok else f"{SAFETY_KEY} is false"
        return "contention", f"{reason}: a co-tenant keeps {device} busy instead of locking clocks"
    if target_pid is not None:
        return "cpu_duty", f"engine on CPU (pid {target_pid}): SIGSTOP/SIGCONT duty cycle"
    return "contention", "engine on CPU with no known pid (remote target): busy workers on this host's CPUs"


def clock_still_ours(current_mhz: int, locked_mhz: int) -> bool:
    """Whether a lock we set can still be in force: under it the SM clock never reads above it.

    A GPU that reads above our lock has been reset or locked again by someone else since; below or
    at it, the lock may be ours (an idle GPU reads lower still), and resetting it is ours to do.
    """
    return current_mhz <= locked_mhz + CLOCK_TOLERANCE_MHZ


def _refusal(kind: str, what: str) -> str:
    return (
        f"{kind} {what}, which changes device-global GPU state for every tenant; set {SAFETY_KEY}: true"
        " in the experiment to allow it (only on a machine you own)"
    )


def _cuda_index(device: str, default: int) -> int:
    _, _, index = device.partition(":")
    return int(index) if index.isdigit() else default


def _configured_nvml_lib(undo: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The NVML library rollback may load: the configured one only, never a path from the journal.

    A journal is data: a crafted one naming a library would otherwise run that library's
    constructor (as root, since clock changes need root). The path the run used is recorded for
    information; when it differs from the configured one the difference is reported.
    """
    configured = os.environ.get(LIB_ENV) or None
    recorded = undo.get("nvml_lib") or None
    notes: dict[str, Any] = {}
    if recorded != configured:
        notes["nvml_lib_note"] = (
            f"the run recorded NVML library {recorded!r}; rollback loads only the configured one "
            f"({LIB_ENV}={configured!r}, or the driver's)"
        )
    return configured, notes


# ---- gpu.throttle --------------------------------------------------------------------------------


@register
@dataclass(frozen=True, kw_only=True)
class GpuThrottle(Fault):
    """Slow the engine's device to a fraction of its max SM clock (see the module docstring)."""

    kind = "gpu.throttle"
    summary = "throttle the GPU (NVML clock lock) or emulate it (contention, CPU duty cycle)"
    schema = Schema(
        params=(
            Param("device", "int", 0, doc="NVML index of the GPU to lock (nvml backend)", min=0),
            Param("sm_clock_mhz", "int", doc="target SM clock in MHz", min=1),
            Param("fraction_of_max", "fraction", doc="target as a share of the max SM clock"),
            Param("backend", "choice", "auto", choices=("auto", "nvml", "contention", "cpu_duty"),
                  doc="how to throttle; auto picks the first that can act here"),
            Param("period", "duration", 0.1, doc="cycle length of contention and cpu_duty", min=0.01, max=10.0),
        ),
        one_of=(("sm_clock_mhz", "fraction_of_max"),),
    )

    device: int
    sm_clock_mhz: int | None
    fraction_of_max: float | None
    backend: str
    period: float

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        found = []
        if self.backend == "nvml" and not experiment.safety.allow_gpu_clock_changes:
            found.append(("backend", _refusal(self.kind, "with backend nvml locks SM clocks")
                          + "; or use backend auto, contention or cpu_duty"))
        if self.fraction_of_max is not None and self.fraction_of_max < MIN_FRACTION:
            found.append(("fraction_of_max", f"must be at least {MIN_FRACTION:.0%}, found {self.fraction_of_max:.1%}; "
                                             "to stop the engine outright use process.kill"))
        return found

    def activate(self, ctx: RunContext) -> Injection:
        """Pick the backend that can act here (and say why), check it can, and return it."""
        allowed = ctx.safety.allow_gpu_clock_changes
        if self.backend == "nvml" and not allowed:
            raise FaultPermissionDenied(_refusal(self.kind, "with backend nvml locks SM clocks")
                                        + "; alternatives: backend contention or cpu_duty")
        wants_nvml = self.backend == "nvml" or (self.backend == "auto" and allowed
                                                and ctx.target.device.startswith("cuda"))
        nvml_ok = nvml_available() if wants_nvml or self.sm_clock_mhz is not None else False
        backend, why = choose_backend(self.backend, device=ctx.target.device, nvml_ok=nvml_ok, allowed=allowed,
                                      target_pid=ctx.target.pid)
        if backend == "nvml":
            self._check_nvml()
            return _ClockLock(self, ctx, why)
        fraction = self._fraction_for_fallback(nvml_ok)
        if backend == "cpu_duty":
            check_signalable(ctx.target.pid, "backend cpu_duty: the engine process")
            return _DutyCycle(self, ctx, why, fraction)
        return _Contention(self, ctx, why, fraction)

    def describe(self, scene: Scene) -> FaultAccount:
        target = (f"{self.sm_clock_mhz} MHz" if self.sm_clock_mhz is not None
                  else f"{(self.fraction_of_max or 0.0):.0%} of its max")
        allowed = scene.safety.allow_gpu_clock_changes
        accounts = {
            "nvml": (f"locks the SM clock of GPU {self.device} through NVML to {target} (device-global: "
                     "every tenant of that GPU slows down while it holds)",
                     "resets the SM clock when the phase ends if the lock is still ours; a watchdog in its own "
                     "session resets it if the runner dies; `streamchaos rollback` does too"),
            "contention": ("starts co-tenant helper processes that keep the engine's device busy, "
                           f"so the engine keeps about {target}",
                           "stops the helpers when the phase ends; they die with the runner and "
                           "`streamchaos rollback` stops them"),
            "cpu_duty": (f"SIGSTOPs and SIGCONTs the engine process so that it runs {target} of each {self.period:g}s",
                         "stops the duty cycle and SIGCONTs the engine when the phase ends; a watchdog and "
                         "`streamchaos rollback` resume it if the runner dies"),
        }
        if self.backend != "auto":
            changes, undo = accounts[self.backend]
        else:
            changes = ("picks its backend when the run starts: "
                       + ("nvml (" + accounts["nvml"][0] + ") when NVML is present and the engine is on a GPU, "
                          "else " if allowed else "")
                       + "contention on the engine's GPU, or for a CPU engine "
                       + ("a duty cycle of its process" if scene.target_spawned
                          else "busy workers on this host's CPUs (the remote engine's pid is unknown)"))
            undo = "as its backend: " + "; ".join(f"{name}: {text}" for name, (_, text) in accounts.items())
        refused = None
        if self.backend == "nvml" and not allowed:
            refused = _refusal(self.kind, "with backend nvml locks SM clocks")
        elif self.backend == "cpu_duty" and not scene.target_spawned:
            refused = "backend cpu_duty needs the engine's pid, which the runner knows only for a target it starts"
        return FaultAccount(changes, undo, refused)

    def _check_nvml(self) -> None:
        with Nvml() as nv:
            nv.handle(self.device)
            arch = nv.architecture(self.device)
            if arch is not None and arch < VOLTA:
                raise FaultUnsupported(
                    f"GPU {self.device} ({nv.name(self.device)}) is older than Volta (NVML architecture {arch}): "
                    "it cannot lock SM clocks; alternatives: backend contention or cpu_duty"
                )
            nv.supported_sm_clocks_mhz(self.device)

    def _fraction_for_fallback(self, nvml_ok: bool) -> float:
        if self.fraction_of_max is not None:
            return self.fraction_of_max
        if self.sm_clock_mhz is None:
            raise FaultError(f"{self.kind}: give exactly one of sm_clock_mhz or fraction_of_max")
        if not nvml_ok:
            raise FaultUnsupported(
                f"sm_clock_mhz: {self.sm_clock_mhz} needs NVML to read the GPU's max clock, and there is none here;"
                " give fraction_of_max instead for the contention and cpu_duty backends"
            )
        with Nvml() as nv:
            top = nv.max_sm_clock_mhz(self.device)
        return max(MIN_FRACTION, min(1.0, self.sm_clock_mhz / top))

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        backend = undo.get("backend")
        if backend == "nvml":
            lib, notes = _configured_nvml_lib(undo)
            with Nvml(lib) as nv:
                index = nv.index_of(str(undo["uuid"]), int(undo.get("device", 0)))
                locked = undo.get("locked_mhz")
                current = nv.sm_clock_mhz(index)
                if locked is None:
                    return notes | {"reset": False, "device": index,
                                    "why": "the run never recorded a lock it took effect"}
                if not clock_still_ours(current, int(locked)):
                    return notes | {
                        "reset": False, "device": index, "sm_clock_mhz": current,
                        "why": f"the SM clock reads {current} MHz, above the {locked} MHz this run locked: "
                               "someone else has changed it since; left alone",
                    }
                nv.reset_sm_clocks(index)
                return notes | {"reset": True, "device": index, "uuid": undo["uuid"],
                                "sm_clock_mhz": nv.sm_clock_mhz(index)}
        if backend in ("contention", "cpu_duty"):
            tag = str(undo.get("tag", ""))
            if not burner.valid_tag(tag):
                return {"skipped": f"the plan's helper tag {tag!r} is not one streamchaos makes; nothing was signalled"}
            result: dict[str, Any] = dict(burner.kill_verified(undo.get("helpers", []), tag))
            if backend == "cpu_duty" and undo.get("target_pid"):
                result.update(_resume(int(undo["target_pid"]), undo.get("target_starttime")))
            return result
        return {"skipped": f"unknown backend {backend!r} in the plan record"}


class _ClockLock(Injection):
    """``nvml``: the SM clock locked for the phase, read back, reset on revert if still ours."""

    outlives_runner = True  # a lock outlives the process that set it

    def __init__(self, fault: GpuThrottle, ctx: RunContext, why: str) -> None:
        super().__init__(fault, ctx)
        self.spec = fault
        self.why = why
        self._locked_mhz: int | None = None

    def plan(self) -> dict[str, Any]:
        with Nvml() as nv:
            return {"backend": "nvml", "device": self.spec.device, "uuid": nv.uuid(self.spec.device),
                    "nvml_lib": os.environ.get(LIB_ENV)}

    async def inject(self) -> dict[str, Any]:
        evidence = await asyncio.to_thread(self._lock)  # the read-back may wait: keep the loop free
        return {"backend": "nvml", "why": self.why} | evidence | {"undo": {"locked_mhz": self._locked_mhz}}

    async def revert(self) -> dict[str, Any]:
        return await asyncio.to_thread(self._unlock)

    def _lock(self) -> dict[str, Any]:
        index = self.spec.device
        with Nvml() as nv:
            top = nv.max_sm_clock_mhz(index)
            before = nv.sm_clock_mhz(index)
            supported = nv.supported_sm_clocks_mhz(index)
            target = self.spec.sm_clock_mhz or round(float(self.spec.fraction_of_max or 1.0) * top)
            chosen = clock_at_or_below(target, supported)
            nv.lock_sm_clocks(index, chosen, chosen)
            self._locked_mhz = chosen
            # Read back: under load the SM clock sits at the lock; an idle GPU may read lower still.
            readback = nv.sm_clock_mhz(index)
            deadline = time.monotonic() + 1.0
            while readback > chosen and time.monotonic() < deadline:
                time.sleep(0.05)
                readback = nv.sm_clock_mhz(index)
            reasons = nv.clock_event_reasons(index)
            if readback > chosen:
                nv.reset_sm_clocks(index)
                self._locked_mhz = None
                raise FaultError(
                    f"GPU {index}: locked the SM clock to {chosen} MHz but it still reads {readback} MHz after 1s;"
                    " the lock did not take effect (reset again); alternatives: backend contention or cpu_duty"
                )
            return {
                "device": index, "uuid": nv.uuid(index), "max_sm_clock_mhz": top, "sm_clock_before_mhz": before,
                "target_mhz": target, "locked_mhz": chosen, "readback_sm_clock_mhz": readback,
                "clock_event_reasons": reasons, "lock_in_force": readback <= chosen,
            }

    def _unlock(self) -> dict[str, Any]:
        if self._locked_mhz is None:
            return {"skipped": "no clock lock in force"}
        index, locked = self.spec.device, self._locked_mhz
        with Nvml() as nv:
            current = nv.sm_clock_mhz(index)
            self._locked_mhz = None
            if not clock_still_ours(current, locked):
                return {"reset": False, "device": index, "sm_clock_mhz": current,
                        "why": f"the SM clock reads {current} MHz, above our {locked} MHz lock: "
                               "changed by someone else; left alone"}
            nv.reset_sm_clocks(index)
            return {"reset": True, "device": index, "sm_clock_mhz": nv.sm_clock_mhz(index),
                    "clock_event_reasons": nv.clock_event_reasons(index)}


class _Helpers(Injection):
    """Backends that act through helper processes (``chaos.gpu.burner``), tagged for rollback."""

    backend: ClassVar[str]

    def __init__(self, fault: GpuThrottle, ctx: RunContext, why: str, fraction: float) -> None:
        super().__init__(fault, ctx)
        self.spec = fault
        self.why = why
        self.fraction = fraction
        self.tag = burner.new_tag()
        self._procs: list[subprocess.Popen[bytes]] = []
        self._helpers: list[dict[str, Any]] = []

    def plan(self) -> dict[str, Any]:
        return {"backend": self.backend, "tag": self.tag}

    async def start(self) -> dict[str, Any]:
        raise NotImplementedError

    async def inject(self) -> dict[str, Any]:
        try:
            evidence = await self.start()
        except BaseException:
            await asyncio.to_thread(self._stop_helpers)
            raise
        return {"backend": self.backend, "why": self.why} | evidence | {"undo": {"helpers": list(self._helpers)}}

    async def revert(self) -> dict[str, Any]:
        if not self._procs and not self._helpers:
            return {"skipped": "not injected"}
        return await asyncio.to_thread(self._stop_helpers)

    def _spawn(self, mode: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = self.ctx.run_dir / f"{self.name}.burner.log"
        phase_s = self.ctx.phase_duration_s or DEFAULT_PHASE_S
        proc = burner.spawn(mode, args, tag=self.tag, max_seconds=phase_s + HELPER_MARGIN_S, log=log)
        self._procs.append(proc)
        self._helpers.append({"pid": proc.pid, "starttime": start_time(proc.pid)})
        return proc

    async def _await_ready(self, proc: subprocess.Popen[bytes], timeout: float) -> str:
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout)
        except TimeoutError:
            line = b""
        if not line.startswith(b"ready"):
            log = self.ctx.run_dir / f"{self.name}.burner.log"
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            raise FaultError(
                f"{self.kind} ({self.backend}): helper pid {proc.pid} did not start within {timeout:g}s"
                f" (exit status {proc.poll()}); its log {log}:\n{tail}"
            )
        proc.stdout.close()
        return line.decode(errors="replace").strip()

    def _stop_helpers(self) -> dict[str, Any]:
        """Stop and reap our helpers. Idempotent."""
        result: dict[str, Any] = dict(burner.kill_verified(self._helpers, self.tag))
        for proc in self._procs:
            try:
                proc.wait(timeout=2.0)  # reap: they are our children
            except subprocess.TimeoutExpired:
                result.setdefault("unreaped", []).append(proc.pid)
            if proc.stdout is not None and not proc.stdout.closed:
                proc.stdout.close()
        self._procs.clear()
        self._helpers.clear()
        return result


class _Contention(_Helpers):
    """``contention``: co-tenant workers that keep the engine's device (GPU or CPUs) busy."""

    backend = "contention"

    async def start(self) -> dict[str, Any]:
        per_unit, busy = contention_shape(self.fraction)
        period = f"{self.spec.period:g}"
        device = self.ctx.target.device
        if device.startswith("cuda"):
            cuda = _cuda_index(device, self.spec.device)
            procs = [self._spawn("cuda", ["--device", str(cuda), "--busy", f"{busy:.4f}", "--period", period])
                     for _ in range(per_unit)]
            timeout, where = READY_TIMEOUT_CUDA_S, f"cuda:{cuda}"
            cpus: list[int] = []
        else:
            cpus = sorted(_affinity_of(self.ctx.target.pid))
            workers = min(MAX_CPU_WORKERS, per_unit * len(cpus))
            mask = ",".join(map(str, cpus))
            procs = [self._spawn("cpu", ["--busy", f"{busy:.4f}", "--period", period, "--affinity", mask])
                     for _ in range(workers)]
            timeout, where = READY_TIMEOUT_CPU_S, "cpu"
        for proc in procs:
            await self._await_ready(proc, timeout)
        return {
            "device": where, "fraction_of_max": self.fraction, "workers": len(procs), "workers_per_unit": per_unit,
            "busy_share": busy, "cpus": cpus, "helper_pids": [p.pid for p in procs],
        }


class _DutyCycle(_Helpers):
    """``cpu_duty``: a helper SIGSTOPs/SIGCONTs the engine so it runs ``fraction`` of each period."""

    backend = "cpu_duty"
    outlives_runner = True  # a SIGSTOPped engine stays stopped if everything else dies

    def __init__(self, fault: GpuThrottle, ctx: RunContext, why: str, fraction: float) -> None:
        super().__init__(fault, ctx, why, fraction)
        pid = ctx.target.pid
        assert pid is not None, "activation checked the engine's pid"
        self.pid = pid
        self.starttime = start_time(pid)

    def plan(self) -> dict[str, Any]:
        return super().plan() | {"target_pid": self.pid, "target_starttime": self.starttime}

    async def start(self) -> dict[str, Any]:
        period = self.spec.period
        args = ["--pid", str(self.pid), "--fraction", f"{self.fraction:.4f}", "--period", f"{period:g}"]
        if self.starttime is not None:
            args += ["--starttime", str(self.starttime)]
        proc = self._spawn("duty", args)
        await self._await_ready(proc, READY_TIMEOUT_CPU_S)
        observed = await _stopped_share(self.pid, seconds=min(0.5, max(0.2, 2 * period)))
        return {"target_pid": self.pid, "fraction_of_max": self.fraction, "period_s": period, "cycler_pid": proc.pid,
                "observed_stopped_share": observed}

    def _stop_helpers(self) -> dict[str, Any]:
        """Stop the cycler, then make sure the engine runs again."""
        return super()._stop_helpers() | _resume(self.pid, self.starttime)


def _affinity_of(pid: int | None) -> set[int]:
    """The CPUs the engine may run on (all of ours when unreadable)."""
    if pid is not None:
        try:
            return set(os.sched_getaffinity(pid))
        except OSError:
            pass
    return set(os.sched_getaffinity(0))


def _resume(pid: int, starttime: int | None) -> dict[str, Any]:
    """SIGCONT the engine if it is provably still the same process; report its state afterwards.

    Without a recorded start time the pid proves nothing (pids are recycled): leave it alone.
    """
    if starttime is None:
        return {"target_resumed": False, "target_state": None,
                "why": f"no start time recorded for pid {pid}: cannot tell it is still the engine"}
    if start_time(pid) != starttime:
        return {"target_resumed": False, "target_state": None, "why": f"pid {pid} is gone or reused"}
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        return {"target_resumed": False, "target_state": None, "why": f"pid {pid} is gone"}
    time.sleep(0.01)
    return {"target_resumed": True, "target_state": proc_state(pid)}


async def _stopped_share(pid: int, seconds: float) -> float:
    """Share of samples in which the process was stopped (state T): proof the duty cycle acts."""
    samples = stopped = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        state = proc_state(pid)
        samples += 1
        stopped += state in ("T", "t")
        await asyncio.sleep(0.005)
    return round(stopped / samples, 3) if samples else 0.0


# ---- gpu.power_cap -------------------------------------------------------------------------------


@register
@dataclass(frozen=True, kw_only=True)
class GpuPowerCap(Fault):
    """Lower a GPU's power limit (NVML, watts), restore the previous limit on revert."""

    kind = "gpu.power_cap"
    summary = "lower the GPU power limit through NVML; restore the previous one on revert"
    schema = Schema(
        params=(
            Param("device", "int", 0, doc="NVML index of the GPU", min=0),
            Param("watts", "float", required=True, doc="power limit in watts, within the GPU's allowed range", min=1),
        ),
    )

    device: int
    watts: float

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        if not experiment.safety.allow_gpu_clock_changes:
            return [("", _refusal(self.kind, "lowers the GPU power limit"))]
        return []

    def describe(self, scene: Scene) -> FaultAccount:
        return FaultAccount(
            changes=f"lowers the power limit of GPU {self.device} through NVML to {self.watts:g} W (device-global)",
            undo=("restores the previous limit when the phase ends if ours is still set; a watchdog restores it "
                  "if the runner dies; `streamchaos rollback` does too"),
            refused=None if scene.safety.allow_gpu_clock_changes else _refusal(self.kind, "lowers the GPU power limit"),
        )

    def activate(self, ctx: RunContext) -> Injection:
        if not ctx.safety.allow_gpu_clock_changes:
            raise FaultPermissionDenied(_refusal(self.kind, "lowers the GPU power limit"))
        with Nvml() as nv:
            low, high = nv.power_limit_constraints_watts(self.device)
        if not low <= self.watts <= high:
            raise FaultUnsupported(f"watts: {self.watts:g} is outside GPU {self.device}'s allowed power limit range "
                                   f"{low:g}-{high:g} W")
        return _PowerLimit(self, ctx)

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        lib, notes = _configured_nvml_lib(undo)
        with Nvml(lib) as nv:
            index = nv.index_of(str(undo["uuid"]), int(undo.get("device", 0)))
            current = nv.power_limit_watts(index)
            ours = undo.get("limit_watts")
            if ours is None or abs(current - float(ours)) > POWER_TOLERANCE_W:
                return notes | {
                    "restored": False, "device": index, "limit_watts": current,
                    "why": f"the power limit reads {current:g} W, not the {ours} W this run set: "
                           "changed by someone else since (or never set); left alone",
                }
            nv.set_power_limit_watts(index, float(undo["previous_watts"]))
            return notes | {"device": index, "restored_watts": undo["previous_watts"],
                            "limit_watts": nv.power_limit_watts(index)}


class _PowerLimit(Injection):
    """The lowered limit for one phase; the previous one restored on revert if ours is still set."""

    outlives_runner = True

    def __init__(self, fault: GpuPowerCap, ctx: RunContext) -> None:
        super().__init__(fault, ctx)
        self.spec = fault
        self._previous: float | None = None
        self._set: float | None = None

    def plan(self) -> dict[str, Any]:
        with Nvml() as nv:
            self._previous = nv.power_limit_watts(self.spec.device)
            return {"device": self.spec.device, "uuid": nv.uuid(self.spec.device), "previous_watts": self._previous,
                    "nvml_lib": os.environ.get(LIB_ENV)}

    async def inject(self) -> dict[str, Any]:
        index, watts = self.spec.device, self.spec.watts
        with Nvml() as nv:
            if self._previous is None:
                self._previous = nv.power_limit_watts(index)
            nv.set_power_limit_watts(index, watts)
            readback = nv.power_limit_watts(index)
            if abs(readback - watts) > POWER_TOLERANCE_W:
                nv.set_power_limit_watts(index, self._previous)
                raise FaultError(f"GPU {index}: set the power limit to {watts:g} W but it reads {readback:g} W; "
                                 f"restored {self._previous:g} W")
            self._set = readback
            return {
                "device": index, "previous_watts": self._previous, "limit_watts": readback,
                "power_watts": nv.power_watts(index), "clock_event_reasons": nv.clock_event_reasons(index),
                "undo": {"limit_watts": readback},
            }

    async def revert(self) -> dict[str, Any]:
        if self._previous is None or self._set is None:
            return {"skipped": "not injected"}
        index, previous, ours = self.spec.device, self._previous, self._set
        with Nvml() as nv:
            current = nv.power_limit_watts(index)
            self._previous = self._set = None
            if abs(current - ours) > POWER_TOLERANCE_W:
                return {"restored": False, "device": index, "limit_watts": current,
                        "why": f"the power limit reads {current:g} W, not our {ours:g} W: "
                               "changed by someone else; left alone"}
            nv.set_power_limit_watts(index, previous)
            return {"device": index, "restored_watts": previous, "limit_watts": nv.power_limit_watts(index)}
