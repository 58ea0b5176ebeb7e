"""A thin backend over pynvml (nvidia-ml-py): read and change SM clocks and power limits, errors translated.

Every NVML error is translated at this boundary into a ``ChaosError`` subclass, most specific first,
with ``raise ... from exc``. Units are converted here too: NVML speaks milliwatts, callers watts.

The library is found the way pynvml finds it (``CDLL("libnvidia-ml.so.1")``), unless the
environment variable ``STREAMCHAOS_NVML_LIB`` (or the ``lib_path`` argument) names a file: that file
is preloaded with ``RTLD_GLOBAL`` first, and because glibc matches an already-loaded object by its
soname, pynvml's own ``CDLL`` then returns it. Tests load a fake NVML this way; so can an operator
whose driver library lives off the loader path.

Device indices are NVML indices (PCI bus order), which can differ from CUDA's unless
``CUDA_DEVICE_ORDER=PCI_BUS_ID``; faults record the device UUID so a rollback acts on the same GPU.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self

import pynvml

from chaos.model.errors import FaultError, FaultPermissionDenied, FaultUnsupported

__all__ = ["LIB_ENV", "Nvml", "nvml_available"]

LIB_ENV = "STREAMCHAOS_NVML_LIB"
ALTERNATIVES = "alternatives: backend contention or cpu_duty"

_preload_lock = threading.Lock()
_preloaded: dict[str, Any] = {}  # path → CDLL, kept alive for the life of the process


def _preload(path: str | None) -> None:
    """Load ``path`` with RTLD_GLOBAL so pynvml's soname lookup returns it (once per path)."""
    if not path:
        if _preloaded:
            # glibc now answers every "libnvidia-ml.so.1" with the library loaded earlier: the driver's
            # own cannot be loaded beside it in this process, so say so rather than use the wrong one.
            raise FaultUnsupported(
                f"this process loaded its NVML library from {next(iter(_preloaded))} ({LIB_ENV}); the driver's"
                f" library cannot be loaded beside it; set {LIB_ENV} again or use a fresh process; {ALTERNATIVES}"
            )
        return
    with _preload_lock:
        if path in _preloaded:
            return
        if not os.path.isfile(path):
            raise FaultUnsupported(
                f"no NVML library at {path!r} (from {LIB_ENV} or the rollback record); point it at a"
                f" libnvidia-ml.so.1 or unset it to use the driver's; {ALTERNATIVES}"
            )
        if _preloaded:
            raise FaultUnsupported(
                f"this process already loaded its NVML library from {next(iter(_preloaded))}; {path} cannot"
                f" replace it (pynvml keeps the first); use a fresh process; {ALTERNATIVES}"
            )
        try:
            _preloaded[path] = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise FaultUnsupported(f"cannot load the NVML library {path!r}: {exc}; {ALTERNATIVES}") from exc


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """Turn pynvml errors into ChaosErrors that say what was being done and what to do instead."""
    try:
        yield
    except pynvml.NVMLError_NoPermission as exc:
        raise FaultPermissionDenied(
            f"NVML refused to {what}: no permission (changing GPU clocks and power limits needs root,"
            f" or CAP_SYS_ADMIN in a container); {ALTERNATIVES}"
        ) from exc
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound) as exc:
        raise FaultUnsupported(
            f"NVML cannot {what} on this GPU or driver ({exc}; locked SM clocks need Volta or newer);"
            f" {ALTERNATIVES}"
        ) from exc
    except (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded) as exc:
        raise FaultUnsupported(
            f"no NVML library or NVIDIA driver here ({exc}) to {what}; set {LIB_ENV} to a"
            f" libnvidia-ml.so.1 if it is off the loader path; {ALTERNATIVES}"
        ) from exc
    except pynvml.NVMLError_GpuIsLost as exc:
        raise FaultError(f"the GPU is lost (fell off the bus) while trying to {what}: {exc}") from exc
    except pynvml.NVMLError_InvalidArgument as exc:
        raise FaultError(f"NVML rejected the arguments to {what}: {exc}") from exc
    except pynvml.NVMLError as exc:
        raise FaultError(f"NVML failed to {what}: {exc}") from exc


class Nvml:
    """An initialised NVML session; use as a context manager (init on enter, shutdown on exit)."""

    def __init__(self, lib_path: str | None = None) -> None:
        self.lib_path = lib_path if lib_path is not None else os.environ.get(LIB_ENV) or None
        self._handles: dict[int, Any] = {}
        self._open = False

    def __enter__(self) -> Self:
        self.init()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def init(self) -> None:
        _preload(self.lib_path)
        with _translated("initialise"):
            pynvml.nvmlInit()
        self._open = True

    def shutdown(self) -> None:
        if not self._open:
            return
        self._open = False
        self._handles.clear()
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass  # shutting down a session that failed half-way is not worth an error

    # ---- devices ------------------------------------------------------------------------------

    def device_count(self) -> int:
        with _translated("count devices"):
            return int(pynvml.nvmlDeviceGetCount())

    def handle(self, index: int) -> Any:
        if index not in self._handles:
            count = self.device_count()
            if not 0 <= index < count:
                raise FaultUnsupported(f"no GPU with NVML index {index}: this host has {count} (0..{count - 1})")
            with _translated(f"open GPU {index}"):
                self._handles[index] = pynvml.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def uuid(self, index: int) -> str:
        with _translated(f"read the UUID of GPU {index}"):
            return str(pynvml.nvmlDeviceGetUUID(self.handle(index)))

    def name(self, index: int) -> str:
        with _translated(f"read the name of GPU {index}"):
            return str(pynvml.nvmlDeviceGetName(self.handle(index)))

    def architecture(self, index: int) -> int | None:
        """NVML architecture number (Volta = 5, Ampere = 7, Hopper = 9), None when the driver cannot say."""
        try:
            with _translated(f"read the architecture of GPU {index}"):
                return int(pynvml.nvmlDeviceGetArchitecture(self.handle(index)))
        except FaultUnsupported:
            return None

    def index_of(self, uuid: str, hint: int = 0) -> int:
        """The NVML index of the GPU with ``uuid`` (``hint`` is tried first)."""
        count = self.device_count()
        order = [hint] + [i for i in range(count) if i != hint] if 0 <= hint < count else list(range(count))
        for index in order:
            if self.uuid(index) == uuid:
                return index
        raise FaultError(f"no GPU with UUID {uuid} on this host (it has {count}); was the record made elsewhere?")

    # ---- clocks -------------------------------------------------------------------------------

    def sm_clock_mhz(self, index: int) -> int:
        with _translated(f"read the SM clock of GPU {index}"):
            return int(pynvml.nvmlDeviceGetClockInfo(self.handle(index), pynvml.NVML_CLOCK_SM))

    def max_sm_clock_mhz(self, index: int) -> int:
        with _translated(f"read the max SM clock of GPU {index}"):
            return int(pynvml.nvmlDeviceGetMaxClockInfo(self.handle(index), pynvml.NVML_CLOCK_SM))

    def supported_sm_clocks_mhz(self, index: int) -> list[int]:
        """Every SM clock the GPU supports at any memory clock, highest first."""
        handle = self.handle(index)
        clocks: set[int] = set()
        with _translated(f"list the supported clocks of GPU {index}"):
            for mem in pynvml.nvmlDeviceGetSupportedMemoryClocks(handle):
                clocks.update(int(c) for c in pynvml.nvmlDeviceGetSupportedGraphicsClocks(handle, mem))
        return sorted(clocks, reverse=True)

    def lock_sm_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        with _translated(f"lock the SM clock of GPU {index} to {min_mhz}-{max_mhz} MHz"):
            pynvml.nvmlDeviceSetGpuLockedClocks(self.handle(index), min_mhz, max_mhz)

    def reset_sm_clocks(self, index: int) -> None:
        with _translated(f"reset the locked SM clocks of GPU {index}"):
            pynvml.nvmlDeviceResetGpuLockedClocks(self.handle(index))

    def clock_event_reasons(self, index: int) -> int:
        """The clock-event ("throttle") reasons bitmask; falls back to the pre-12.2 Throttle name."""
        handle = self.handle(index)
        with _translated(f"read the clock-event reasons of GPU {index}"):
            try:
                return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
            except pynvml.NVMLError_FunctionNotFound:
                return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))

    # ---- memory and power ---------------------------------------------------------------------

    def memory_used_bytes(self, index: int) -> int:
        with _translated(f"read the memory use of GPU {index}"):
            return int(pynvml.nvmlDeviceGetMemoryInfo(self.handle(index)).used)

    def power_watts(self, index: int) -> float:
        with _translated(f"read the power draw of GPU {index}"):
            return float(pynvml.nvmlDeviceGetPowerUsage(self.handle(index))) / 1000.0  # mW

    def power_limit_watts(self, index: int) -> float:
        with _translated(f"read the power limit of GPU {index}"):
            return float(pynvml.nvmlDeviceGetPowerManagementLimit(self.handle(index))) / 1000.0  # mW

    def power_limit_constraints_watts(self, index: int) -> tuple[float, float]:
        with _translated(f"read the power limit range of GPU {index}"):
            low, high = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(self.handle(index))
        return low / 1000.0, high / 1000.0

    def set_power_limit_watts(self, index: int, watts: float) -> None:
        # The v1 setter: nvidia-ml-py 13.615.71's _v2 wrapper ignores the return code.
        with _translated(f"set the power limit of GPU {index} to {watts:g} W"):
            pynvml.nvmlDeviceSetPowerManagementLimit(self.handle(index), round(watts * 1000))


def nvml_available(lib_path: str | None = None) -> bool:
    """True when NVML initialises and sees at least one GPU; never raises."""
    try:
        with Nvml(lib_path) as nvml:
            return nvml.device_count() > 0
    except Exception:  # noqa: BLE001 - a probe: any failure means "not available"
        return False
