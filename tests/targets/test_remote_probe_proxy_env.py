"""A remote target's probe goes where the load goes: straight to the target, whatever HTTP(S)_PROXY
the environment sets (the load generator never reads them; a probe that did would reach a corporate
proxy, or fail on a dead one, for a target the load reaches directly)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.model.experiment import TargetSpec
from chaos.targets.base import RemoteTarget

pytestmark = pytest.mark.timeout(60)
SERVER = Path(__file__).resolve().parents[1] / "e2e" / "held_streams_server.py"


def test_a_dead_proxy_in_the_environment_does_not_stop_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    server = subprocess.Popen([sys.executable, str(SERVER), "1", "0.01"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there: a probe through it fails
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        info = asyncio.run(RemoteTarget(TargetSpec(kind="openai"), f"http://127.0.0.1:{port}/v1").start())
        assert info.model == "held"
    finally:
        server.kill()
        server.wait(10)
