"""Fixtures for end-to-end tests: stacks with planted defects, started as real processes."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).parent
READY = "streamchaos stack ready url="


def start_stack(args: list[str], timeout: float = 60.0) -> tuple[subprocess.Popen[str], str]:
    """Start a stack process (planted or real) and wait for its ready line."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    found: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(READY) and not found:
                found.append(line[len(READY):].strip())

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not found:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"stack {args} did not become ready")
        time.sleep(0.02)
    return proc, found[0]


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture
def planted() -> Iterator[Callable[..., str]]:
    """``planted("leak", "--max-num-seqs", "64")`` → the URL of a stack with that defect."""
    procs: list[subprocess.Popen[str]] = []

    def start(defect: str, *extra: str) -> str:
        proc, url = start_stack([sys.executable, str(HERE / "planted_stack.py"), "--defect", defect, "--port", "0", *extra])
        procs.append(proc)
        return url

    yield start
    for proc in procs:
        stop(proc)
