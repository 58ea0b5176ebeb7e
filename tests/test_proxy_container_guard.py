"""A Toxiproxy container outlives a runner that is killed: its watchdog must exist before the
container does (``proxy.server: docker``), not only after the load has started (issue 23 point 2);
``auto`` never makes one (issue 41: the embedded server, whose API answers only the run). The order
of the runner's own steps, recorded."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import chaos.execution.proxy as proxy_module
from chaos.execution.runner import Runner
from chaos.experiment import experiment_from_dict
from chaos.model.context import ProxyInfo, TargetInfo


def _runner(tmp_path: Path, server: str) -> Runner:
    exp = experiment_from_dict({
        "name": "guard-order",
        "target": {"kind": "builtin", "model": "tiny"},
        "proxy": {"enabled": True, "server": server},
        "phases": [{"name": "steady", "duration": "1s"}],
    })
    runner = Runner(exp, out_dir=tmp_path / "run", handle_signals=False)
    runner.journal = SimpleNamespace(run_id="run-guard", resource=lambda body: None)  # type: ignore[assignment]
    return runner


@pytest.mark.parametrize(("server", "made"), [("docker", "docker"), ("auto", "embedded")])
def test_the_watchdog_is_there_before_the_load_when_a_toxiproxy_container_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: str, made: str) -> None:
    steps: list[str] = []
    runner = _runner(tmp_path, server)

    async def guard(self: Runner, resources: Any, target: Any, *, urls: Any, token: Any) -> None:
        steps.append("guard")
        self.watchdogs.append(SimpleNamespace())  # type: ignore[arg-type]

    @contextlib.asynccontextmanager
    async def running_proxy(experiment: Any, info: TargetInfo, out_dir: Path, owner: Any) -> AsyncIterator[Any]:
        steps.append("proxy")
        yield SimpleNamespace(
            info=ProxyInfo(api_url="http://127.0.0.1:1", proxy_name="p", listen="127.0.0.1:2",
                           upstream="127.0.0.1:3", server=made),
            client_base_url="http://127.0.0.1:2/v1", facts=lambda: {})

    monkeypatch.setattr(Runner, "_guard", guard)
    monkeypatch.setattr(proxy_module, "running_proxy", running_proxy)
    target = SimpleNamespace(info=TargetInfo(kind="builtin", base_url="http://127.0.0.1:4/v1"))

    async def bring_up() -> None:
        async with contextlib.AsyncExitStack() as resources:
            await runner._start_path(resources, target)  # type: ignore[arg-type]

    asyncio.run(bring_up())
    expected = {"docker": ["guard", "proxy"], "auto": ["proxy"]}[server]
    assert steps == expected
