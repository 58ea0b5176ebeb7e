"""Facts about the host and software a run ran with, for the report's environment section.

A leaf module: standard library only, cheap (package versions are read from installed metadata,
nothing is imported), so the runner notes them at the start of every run.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from importlib import metadata
from typing import Any

__all__ = ["PACKAGES", "environment_facts"]

# The packages whose versions change what a run measures or how it is judged.
PACKAGES = ("streamchaos", "torch", "numpy", "scipy", "httpx", "uvicorn", "starlette", "prometheus-client",
            "toxiproxy-python", "nvidia-ml-py", "vllm")


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment_facts() -> dict[str, Any]:
    """Host name, OS, CPU count, Python and the installed versions of ``PACKAGES`` (absent ones left out)."""
    versions = {name: v for name in PACKAGES if (v := _version(name)) is not None}
    return {
        "host": socket.gethostname(),
        "os": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "versions": versions,
    }
