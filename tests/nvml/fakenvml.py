"""Build the fake ``libnvidia-ml.so.1`` with gcc and point a process (or this one) at it.

Used by ``tests/nvml`` and ``tests/faults/test_gpu.py``. The library is compiled once per
session into a temporary directory with the real soname, so that preloading it with
``RTLD_GLOBAL`` makes pynvml's ``CDLL("libnvidia-ml.so.1")`` return it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "fake_nvml.c"
KNOBS = ("FAKE_NVML_STATE", "FAKE_NVML_DENY", "FAKE_NVML_ARCH", "FAKE_NVML_DEVICES", "FAKE_NVML_LOST")


def gcc() -> str | None:
    """Path of gcc (or $CC), or None when there is no C compiler."""
    return shutil.which(os.environ.get("CC", "gcc"))


def build_fake_nvml(out_dir: Path) -> Path:
    """Compile the fake into ``out_dir/libnvidia-ml.so.1`` and return its path."""
    compiler = gcc()
    if compiler is None:
        raise RuntimeError("no C compiler (gcc or $CC) on PATH")
    out = out_dir / "libnvidia-ml.so.1"
    cmd = [compiler, "-shared", "-fPIC", "-O1", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(out), str(SOURCE)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"building the fake NVML failed ({' '.join(cmd)}):\n{proc.stderr}")
    return out


def read_state(path: Path) -> dict[str, int]:
    """The fake's state file as ``{"dev0.locked_max": 990, ...}`` (empty before any setter ran)."""
    if not path.exists():
        return {}
    state: dict[str, int] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            state[key] = int(value)
    return state


def reset_pynvml() -> None:
    """Forget pynvml's cached function pointers and init refcount so the next init starts clean."""
    import pynvml

    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml._nvmlLib_refcount = 0


@contextmanager
def fake_env(lib: Path, state: Path, **knobs: str) -> Iterator[dict[str, str]]:
    """Set STREAMCHAOS_NVML_LIB, FAKE_NVML_STATE and the given FAKE_NVML_* knobs in os.environ.

    The fake reads its knobs with getenv on every call, so changing them here takes effect in this
    process at once; the returned mapping is the full environment for child processes.
    """
    saved = {k: os.environ.get(k) for k in (*KNOBS, "STREAMCHAOS_NVML_LIB")}
    for k in KNOBS:
        os.environ.pop(k, None)
    os.environ["STREAMCHAOS_NVML_LIB"] = str(lib)
    os.environ["FAKE_NVML_STATE"] = str(state)
    for key, value in knobs.items():
        os.environ[f"FAKE_NVML_{key.upper()}"] = value
    try:
        yield dict(os.environ)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
