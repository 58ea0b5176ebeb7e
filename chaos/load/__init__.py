"""The streaming load generator: SSE parsing, one request → StreamRecord, workloads, drivers, lag."""

from __future__ import annotations

from chaos.load.driver import LoadDriver, make_load, running_load
from chaos.load.generator import LoadGenerator
from chaos.load.lag import LagMonitor, lag_summary
from chaos.load.sse import SSEEvent, SSEParser
from chaos.load.workers import WorkerPool
from chaos.load.workload import LoadTarget

__all__ = ["LagMonitor", "LoadDriver", "LoadGenerator", "LoadTarget", "SSEEvent", "SSEParser", "WorkerPool",
           "lag_summary", "make_load", "running_load"]
