"""GPU faults: SM clock throttling (NVML lock, or contention / duty-cycle fallbacks), power caps, telemetry.

``gpu.throttle`` backends, all producing the same symptom (decode slows, queues build, TTFT tail grows):

- ``nvml``: lock the SM clock with ``nvmlDeviceSetGpuLockedClocks`` to the nearest supported clock at or
  below the target, read it back, reset on revert. Device-global: needs root and
  ``safety.allow_gpu_clock_changes``. A killed run is undone by ``Fault.rollback`` (the plan records the
  device UUID and the NVML library used).
- ``contention``: a co-tenant that keeps the engine's device busy (``faults.burner``): matrix products on
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
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self

from chaos.errors import FaultError, FaultPermissionDenied, FaultUnsupported
from chaos.observations import MetricSample
from chaos.params import Param, Schema
from faults import burner
from faults.base import Fault, FaultEnv, register
from faults.nvml import LIB_ENV, Nvml, nvml_available

__all__ = [
    "GpuPowerCap",
    "GpuTelemetry",
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


def choose_backend(requested: str, *, device: str, nvml_ok: bool, allowed: bool, target_pid: int | None) -> tuple[str, str]:
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


def _allowed_by(experiment: Any) -> bool:
    safety = getattr(experiment, "safety", None)
    if isinstance(safety, Mapping):
        return bool(safety.get("allow_gpu_clock_changes", False))
    return bool(getattr(safety, "allow_gpu_clock_changes", False))


def _refusal(kind: str, what: str) -> str:
    return (
        f"{kind} {what}, which changes device-global GPU state for every tenant; set {SAFETY_KEY}: true"
        " in the experiment to allow it (only on a machine you own)"
    )


def _phase_seconds(env: FaultEnv) -> float:
    experiment = env.extras.get("experiment")
    try:
        return float(experiment.phase(env.phase).duration)  # type: ignore[union-attr]
    except (AttributeError, KeyError, TypeError, ValueError):
        return float(env.extras.get("phase_duration_s", DEFAULT_PHASE_S))


def _cuda_index(device: str, default: int) -> int:
    _, _, index = device.partition(":")
    return int(index) if index.isdigit() else default


# ---- gpu.throttle --------------------------------------------------------------------------------


@register
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

    def __init__(self, name: str, params: Mapping[str, Any]) -> None:
        super().__init__(name, params)
        self._backend: str | None = None
        self._why = ""
        self._fraction: float | None = params.get("fraction_of_max")
        self._undo: dict[str, Any] | None = None
        self._locked_index: int | None = None
        self._procs: list[subprocess.Popen[bytes]] = []
        self._helpers: list[dict[str, Any]] = []

    @property
    def outlives_runner(self) -> bool:
        """Locked clocks and a stopped engine outlive a killed runner: the runner starts a watchdog."""
        return (self._backend or self.params.get("backend", "auto")) in ("nvml", "cpu_duty", "auto")

    def problems(self, experiment: Any) -> list[tuple[str, str]]:
        found = []
        if self.params.get("backend") == "nvml" and not _allowed_by(experiment):
            found.append(("backend", _refusal(self.kind, "with backend nvml locks SM clocks") + "; or use backend auto, contention or cpu_duty"))
        fraction = self.params.get("fraction_of_max")
        if fraction is not None and fraction < MIN_FRACTION:
            found.append(("fraction_of_max", f"must be at least {MIN_FRACTION:.0%}, found {fraction:.1%}; to stop the engine outright use process.kill"))
        return found

    # -- deciding --------------------------------------------------------------------------------

    def check(self, env: FaultEnv) -> None:
        requested = self.params["backend"]
        allowed = bool(env.extras.get("allow_gpu_clock_changes", False))
        if requested == "nvml" and not allowed:
            raise FaultPermissionDenied(_refusal(self.kind, "with backend nvml locks SM clocks") + "; alternatives: backend contention or cpu_duty")
        wants_nvml = requested == "nvml" or (requested == "auto" and allowed and env.target.device.startswith("cuda"))
        needs_max_clock = self.params.get("sm_clock_mhz") is not None
        nvml_ok = nvml_available() if wants_nvml or needs_max_clock else False
        backend, why = choose_backend(requested, device=env.target.device, nvml_ok=nvml_ok, allowed=allowed, target_pid=env.target.pid)
        if backend == "nvml":
            self._check_nvml()
        else:
            self._fraction = self._fraction_for_fallback(nvml_ok)
            if backend == "cpu_duty":
                _check_signalable(env.target.pid, "backend cpu_duty")
        self._backend, self._why = backend, why

    def _check_nvml(self) -> None:
        index = self.params["device"]
        with Nvml() as nv:
            nv.handle(index)
            arch = nv.architecture(index)
            if arch is not None and arch < VOLTA:
                raise FaultUnsupported(
                    f"GPU {index} ({nv.name(index)}) is older than Volta (NVML architecture {arch}): it cannot lock"
                    " SM clocks; alternatives: backend contention or cpu_duty"
                )
            nv.supported_sm_clocks_mhz(index)

    def _fraction_for_fallback(self, nvml_ok: bool) -> float:
        if self.params.get("fraction_of_max") is not None:
            return float(self.params["fraction_of_max"])
        mhz = self.params.get("sm_clock_mhz")
        if mhz is None:
            raise FaultError(f"{self.kind}: give exactly one of sm_clock_mhz or fraction_of_max")
        if not nvml_ok:
            raise FaultUnsupported(
                f"sm_clock_mhz: {mhz} needs NVML to read the GPU's max clock, and there is none here;"
                " give fraction_of_max instead for the contention and cpu_duty backends"
            )
        with Nvml() as nv:
            top = nv.max_sm_clock_mhz(self.params["device"])
        return max(MIN_FRACTION, min(1.0, mhz / top))

    def _ensure_decided(self, env: FaultEnv) -> str:
        if self._backend is None:
            self.check(env)
        assert self._backend is not None
        return self._backend

    # -- the lifecycle ---------------------------------------------------------------------------

    def plan(self, env: FaultEnv) -> dict[str, Any]:
        backend = self._ensure_decided(env)
        undo: dict[str, Any] = {"backend": backend}
        if backend == "nvml":
            index = self.params["device"]
            with Nvml() as nv:
                undo.update(device=index, uuid=nv.uuid(index), nvml_lib=os.environ.get(LIB_ENV))
        else:
            undo["tag"] = f"streamchaos-{uuid.uuid4().hex[:16]}"
            if backend == "cpu_duty":
                pid = env.target.pid
                undo.update(target_pid=pid, target_starttime=burner.start_time(pid) if pid else None)
        self._undo = undo
        return dict(undo)

    async def inject(self, env: FaultEnv) -> dict[str, Any]:
        if self._undo is None:
            self.plan(env)
        assert self._undo is not None and self._backend is not None
        head = {"backend": self._backend, "why": self._why}
        if self._backend == "nvml":
            return head | await asyncio.to_thread(self._lock)  # the read-back may wait: keep the loop free
        try:
            if self._backend == "cpu_duty":
                evidence = await self._start_duty(env)
            else:
                evidence = await self._start_contention(env)
        except BaseException:
            await asyncio.to_thread(self._stop_helpers)
            raise
        return head | evidence | {"undo": {"helpers": list(self._helpers)}}

    async def revert(self, env: FaultEnv) -> dict[str, Any]:
        if self._backend == "nvml":
            return self._unlock()
        if not self._procs and not self._helpers:
            return {"skipped": "not injected"}
        return await asyncio.to_thread(self._stop_helpers)

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        backend = undo.get("backend")
        if backend == "nvml":
            with Nvml(undo.get("nvml_lib") or None) as nv:
                index = nv.index_of(str(undo["uuid"]), int(undo.get("device", 0)))
                nv.reset_sm_clocks(index)
                return {"reset": True, "device": index, "uuid": undo["uuid"], "sm_clock_mhz": nv.sm_clock_mhz(index)}
        if backend in ("contention", "cpu_duty"):
            result: dict[str, Any] = dict(burner.kill_verified(undo.get("helpers", []), str(undo["tag"])))
            if backend == "cpu_duty" and undo.get("target_pid"):
                result.update(_resume(int(undo["target_pid"]), undo.get("target_starttime")))
            return result
        return {"skipped": f"unknown backend {backend!r} in the plan record"}

    # -- nvml ------------------------------------------------------------------------------------

    def _lock(self) -> dict[str, Any]:
        index = self.params["device"]
        with Nvml() as nv:
            top = nv.max_sm_clock_mhz(index)
            before = nv.sm_clock_mhz(index)
            supported = nv.supported_sm_clocks_mhz(index)
            target = self.params.get("sm_clock_mhz") or round(float(self.params["fraction_of_max"]) * top)
            chosen = clock_at_or_below(target, supported)
            nv.lock_sm_clocks(index, chosen, chosen)
            self._locked_index = index
            # Read back: under load the SM clock sits at the lock; an idle GPU may read lower still.
            readback = nv.sm_clock_mhz(index)
            deadline = time.monotonic() + 1.0
            while readback > chosen and time.monotonic() < deadline:
                time.sleep(0.05)
                readback = nv.sm_clock_mhz(index)
            reasons = nv.clock_event_reasons(index)
            if readback > chosen:
                nv.reset_sm_clocks(index)
                self._locked_index = None
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
        if self._locked_index is None:
            return {"skipped": "no clock lock in force"}
        index = self._locked_index
        with Nvml() as nv:
            nv.reset_sm_clocks(index)
            self._locked_index = None
            return {"reset": True, "device": index, "sm_clock_mhz": nv.sm_clock_mhz(index), "clock_event_reasons": nv.clock_event_reasons(index)}

    # -- helpers ---------------------------------------------------------------------------------

    def _spawn(self, env: FaultEnv, mode: str, args: list[str]) -> subprocess.Popen[bytes]:
        assert self._undo is not None
        log = env.run_dir / f"{self.name}.burner.log"
        proc = burner.spawn(mode, args, tag=self._undo["tag"], max_seconds=_phase_seconds(env) + HELPER_MARGIN_S, log=log)
        self._procs.append(proc)
        self._helpers.append({"pid": proc.pid, "starttime": burner.start_time(proc.pid)})
        return proc

    async def _await_ready(self, env: FaultEnv, proc: subprocess.Popen[bytes], timeout: float) -> str:
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout)
        except TimeoutError:
            line = b""
        if not line.startswith(b"ready"):
            log = env.run_dir / f"{self.name}.burner.log"
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            raise FaultError(
                f"{self.kind} ({self._backend}): helper pid {proc.pid} did not start within {timeout:g}s"
                f" (exit status {proc.poll()}); its log {log}:\n{tail}"
            )
        proc.stdout.close()
        return line.decode(errors="replace").strip()

    async def _start_contention(self, env: FaultEnv) -> dict[str, Any]:
        assert self._fraction is not None
        per_unit, busy = contention_shape(self._fraction)
        period = f"{self.params['period']:g}"
        if env.target.device.startswith("cuda"):
            cuda = _cuda_index(env.target.device, self.params["device"])
            procs = [self._spawn(env, "cuda", ["--device", str(cuda), "--busy", f"{busy:.4f}", "--period", period]) for _ in range(per_unit)]
            timeout, where = READY_TIMEOUT_CUDA_S, f"cuda:{cuda}"
            cpus: list[int] = []
        else:
            cpus = sorted(_affinity_of(env.target.pid))
            workers = min(MAX_CPU_WORKERS, per_unit * len(cpus))
            mask = ",".join(map(str, cpus))
            procs = [self._spawn(env, "cpu", ["--busy", f"{busy:.4f}", "--period", period, "--affinity", mask]) for _ in range(workers)]
            timeout, where = READY_TIMEOUT_CPU_S, "cpu"
        for proc in procs:
            await self._await_ready(env, proc, timeout)
        return {
            "device": where, "fraction_of_max": self._fraction, "workers": len(procs), "workers_per_unit": per_unit,
            "busy_share": busy, "cpus": cpus, "helper_pids": [p.pid for p in procs],
        }

    async def _start_duty(self, env: FaultEnv) -> dict[str, Any]:
        assert self._fraction is not None and self._undo is not None
        pid = env.target.pid
        assert pid is not None
        period = float(self.params["period"])
        args = ["--pid", str(pid), "--fraction", f"{self._fraction:.4f}", "--period", f"{period:g}"]
        if self._undo.get("target_starttime") is not None:
            args += ["--starttime", str(self._undo["target_starttime"])]
        proc = self._spawn(env, "duty", args)
        await self._await_ready(env, proc, READY_TIMEOUT_CPU_S)
        observed = await _stopped_share(pid, seconds=min(0.5, max(0.2, 2 * period)))
        return {"target_pid": pid, "fraction_of_max": self._fraction, "period_s": period, "cycler_pid": proc.pid, "observed_stopped_share": observed}

    def _stop_helpers(self) -> dict[str, Any]:
        """Stop and reap our helpers; for cpu_duty make sure the engine runs again. Idempotent."""
        assert self._undo is not None
        result: dict[str, Any] = dict(burner.kill_verified(self._helpers, self._undo["tag"]))
        for proc in self._procs:
            try:
                proc.wait(timeout=2.0)  # reap: they are our children
            except subprocess.TimeoutExpired:
                result.setdefault("unreaped", []).append(proc.pid)
            if proc.stdout is not None and not proc.stdout.closed:
                proc.stdout.close()
        self._procs.clear()
        self._helpers.clear()
        if self._backend == "cpu_duty" and self._undo.get("target_pid"):
            result.update(_resume(int(self._undo["target_pid"]), self._undo.get("target_starttime")))
        return result


def _check_signalable(pid: int | None, what: str) -> None:
    if pid is None:
        raise FaultUnsupported(f"{what} needs the engine's pid, which the runner knows only for a target it started; use backend contention")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise FaultUnsupported(f"{what}: the engine process {pid} is not running") from None
    except PermissionError as exc:
        raise FaultPermissionDenied(f"{what}: not allowed to signal the engine process {pid} (another user's?)") from exc


def _affinity_of(pid: int | None) -> set[int]:
    """The CPUs the engine may run on (all of ours when unreadable)."""
    if pid is not None:
        try:
            return set(os.sched_getaffinity(pid))
        except OSError:
            pass
    return set(os.sched_getaffinity(0))


def _resume(pid: int, starttime: int | None) -> dict[str, Any]:
    """SIGCONT the engine if it is still the same process; report its state afterwards."""
    if starttime is not None and burner.start_time(pid) != starttime:
        return {"target_resumed": False, "target_state": None, "why": f"pid {pid} is gone or reused"}
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        return {"target_resumed": False, "target_state": None, "why": f"pid {pid} is gone"}
    time.sleep(0.01)
    return {"target_resumed": True, "target_state": burner.proc_state(pid)}


async def _stopped_share(pid: int, seconds: float) -> float:
    """Share of samples in which the process was stopped (state T): proof the duty cycle acts."""
    samples = stopped = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        state = burner.proc_state(pid)
        samples += 1
        stopped += state in ("T", "t")
        await asyncio.sleep(0.005)
    return round(stopped / samples, 3) if samples else 0.0


# ---- gpu.power_cap -------------------------------------------------------------------------------


@register
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
    outlives_runner = True

    def __init__(self, name: str, params: Mapping[str, Any]) -> None:
        super().__init__(name, params)
        self._previous: float | None = None

    def problems(self, experiment: Any) -> list[tuple[str, str]]:
        if not _allowed_by(experiment):
            return [("", _refusal(self.kind, "lowers the GPU power limit"))]
        return []

    def check(self, env: FaultEnv) -> None:
        if not env.extras.get("allow_gpu_clock_changes", False):
            raise FaultPermissionDenied(_refusal(self.kind, "lowers the GPU power limit"))
        index, watts = self.params["device"], float(self.params["watts"])
        with Nvml() as nv:
            low, high = nv.power_limit_constraints_watts(index)
        if not low <= watts <= high:
            raise FaultUnsupported(f"watts: {watts:g} is outside GPU {index}'s allowed power limit range {low:g}-{high:g} W")

    def plan(self, env: FaultEnv) -> dict[str, Any]:
        index = self.params["device"]
        with Nvml() as nv:
            self._previous = nv.power_limit_watts(index)
            return {"device": index, "uuid": nv.uuid(index), "previous_watts": self._previous, "nvml_lib": os.environ.get(LIB_ENV)}

    async def inject(self, env: FaultEnv) -> dict[str, Any]:
        self.check(env)
        index, watts = self.params["device"], float(self.params["watts"])
        with Nvml() as nv:
            if self._previous is None:
                self._previous = nv.power_limit_watts(index)
            nv.set_power_limit_watts(index, watts)
            readback = nv.power_limit_watts(index)
            if abs(readback - watts) > 1.0:
                nv.set_power_limit_watts(index, self._previous)
                raise FaultError(f"GPU {index}: set the power limit to {watts:g} W but it reads {readback:g} W; restored {self._previous:g} W")
            return {
                "device": index, "previous_watts": self._previous, "limit_watts": readback,
                "power_watts": nv.power_watts(index), "clock_event_reasons": nv.clock_event_reasons(index),
            }

    async def revert(self, env: FaultEnv) -> dict[str, Any]:
        if self._previous is None:
            return {"skipped": "not injected"}
        index = self.params["device"]
        with Nvml() as nv:
            nv.set_power_limit_watts(index, self._previous)
            restored = self._previous
            self._previous = None
            return {"device": index, "restored_watts": restored, "limit_watts": nv.power_limit_watts(index)}

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        with Nvml(undo.get("nvml_lib") or None) as nv:
            index = nv.index_of(str(undo["uuid"]), int(undo.get("device", 0)))
            nv.set_power_limit_watts(index, float(undo["previous_watts"]))
            return {"device": index, "restored_watts": undo["previous_watts"], "limit_watts": nv.power_limit_watts(index)}


# ---- telemetry -----------------------------------------------------------------------------------


class GpuTelemetry:
    """GPU series for the observations, polled by the runner about once a second.

    ``sample()`` returns ``MetricSample``s named ``gpu_sm_clock_mhz``, ``gpu_clock_event_reasons``,
    ``gpu_memory_used_bytes`` and ``gpu_power_watts``, labelled ``{"gpu": "<index>"}``; a reading a
    GPU does not support is left out. Keeps one NVML session open until ``close()``.
    """

    SERIES: ClassVar[dict[str, str]] = {
        "gpu_sm_clock_mhz": "sm_clock_mhz",
        "gpu_clock_event_reasons": "clock_event_reasons",
        "gpu_memory_used_bytes": "memory_used_bytes",
        "gpu_power_watts": "power_watts",
    }

    def __init__(self, devices: Sequence[int] | None = None, lib_path: str | None = None) -> None:
        self.devices = list(devices) if devices is not None else None
        self.lib_path = lib_path
        self._nvml: Nvml | None = None

    def available(self) -> bool:
        """True when NVML answers and sees a GPU here; never raises."""
        return nvml_available(self.lib_path)

    def sample(self, t: int | None = None) -> list[MetricSample]:
        if self._nvml is None:
            nv = Nvml(self.lib_path)
            nv.init()
            self._nvml = nv
        nv = self._nvml
        t = time.monotonic_ns() if t is None else t
        devices = self.devices if self.devices is not None else list(range(nv.device_count()))
        readers = {
            "sm_clock_mhz": nv.sm_clock_mhz,
            "clock_event_reasons": nv.clock_event_reasons,
            "memory_used_bytes": nv.memory_used_bytes,
            "power_watts": nv.power_watts,
        }
        out = []
        for index in devices:
            for series, reading in self.SERIES.items():
                try:
                    value = readers[reading](index)
                except FaultUnsupported:
                    continue
                out.append(MetricSample(name=series, labels={"gpu": str(index)}, value=float(value), t=t))
        return out

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.shutdown()
            self._nvml = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
