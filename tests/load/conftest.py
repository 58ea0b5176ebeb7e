"""Fixtures for the load generator tests: a loopback mock SSE server and small load specs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from chaos.load.mock import ThreadedMockServer
from chaos.load.workload import LoadSettings, PromptSettings


@pytest.fixture
def mock_server() -> Iterator[ThreadedMockServer]:
    with ThreadedMockServer(tick_s=0.005) as server:
        yield server


def _make_spec(**overrides: Any) -> LoadSettings:
    """A stand-in for chaos.experiment.LoadSpec with small, fast defaults."""
    prompts = overrides.pop("prompts", PromptSettings(min_chars=16, max_chars=64))
    base: dict[str, Any] = {"concurrency": 2, "max_tokens": (4, 4), "request_timeout": 10.0, "prompts": prompts}
    base.update(overrides)
    return LoadSettings(**base)


@pytest.fixture
def make_spec() -> Callable[..., LoadSettings]:
    return _make_spec
