"""GPU telemetry for the observations: SM clock, clock-event reasons, memory and power, once a second.

``GpuTelemetry`` reads one sample per GPU through NVML (``chaos.gpu.nvml``); ``gpu_telemetry(sink)`` is
the runner's resource: while it is entered, a task polls and hands each ``MetricSample`` to the
sink. Where NVML does not answer (no driver, no GPU) it does nothing at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, ClassVar, Self

from chaos.host.sampling import polled
from chaos.model.errors import ChaosError, FaultUnsupported
from chaos.model.observations import MetricSample, Note

__all__ = ["GPU_TELEMETRY_PERIOD_S", "GpuTelemetry", "gpu_telemetry"]

GPU_TELEMETRY_PERIOD_S = 1.0


class GpuTelemetry:
    """GPU series for the observations.

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
        from chaos.gpu.nvml import Nvml  # pynvml only where telemetry is wanted

        self.devices = list(devices) if devices is not None else None
        self.lib_path = lib_path
        self._nvml_type = Nvml
        self._nvml: Any = None

    def available(self) -> bool:
        """True when NVML answers and sees a GPU here; never raises."""
        from chaos.gpu.nvml import nvml_available

        return nvml_available(self.lib_path)

    def sample(self, t: int | None = None) -> list[MetricSample]:
        if self._nvml is None:
            nv = self._nvml_type(self.lib_path)
            nv.init()
            self._nvml = nv
        nv = self._nvml
        t = time.monotonic_ns() if t is None else t
        devices = self.devices if self.devices is not None else list(range(nv.device_count()))
        out = []
        for index in devices:
            for series, reading in self.SERIES.items():
                try:
                    value = getattr(nv, reading)(index)
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


@contextlib.asynccontextmanager
async def gpu_telemetry(sink: Callable[[MetricSample | Note], None],
                        period_s: float = GPU_TELEMETRY_PERIOD_S) -> AsyncIterator[bool]:
    """Poll every GPU NVML sees while entered; yields whether telemetry is on."""
    telemetry = GpuTelemetry()
    if not await asyncio.to_thread(telemetry.available):
        yield False
        return

    try:
        async with polled(telemetry.sample, sink, period_s=period_s, name="gpu_telemetry", errors=(ChaosError,)):
            yield True
    finally:
        telemetry.close()
