"""Fixtures for end-to-end tests: stacks with planted defects, started as real processes."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chaos.stack.process import StackProcess

HERE = Path(__file__).parent


def start_stack(command: list[str], timeout: float = 60.0) -> StackProcess:
    """Start a stack process (planted or real) and wait for its ready line."""
    return StackProcess.start(command=command, timeout=timeout)


@pytest.fixture
def planted() -> Iterator[Callable[..., str]]:
    """``planted("leak", "--max-num-seqs", "64")`` → the URL of a stack with that defect."""
    stacks: list[StackProcess] = []

    def start(defect: str, *extra: str) -> str:
        stack = start_stack([sys.executable, str(HERE / "planted_stack.py"), "--defect", defect, "--port", "0", *extra])
        stacks.append(stack)
        return stack.url

    yield start
    for stack in stacks:
        stack.close()
