"""Every network fault kind against a real (embedded) Toxiproxy: its toxic is listed while injected,
gone after revert, and a crashed run's plan is undone by rollback; network.down really refuses."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from chaos.execution.proxy import start_proxy
from chaos.experiment import experiment_from_dict
from chaos.model.context import RunContext, TargetInfo
from chaos.toxiproxy.server import ToxiproxyThread
from faults.base import REGISTRY

PARAMS: dict[str, dict[str, Any]] = {
    "network.latency": {"latency": "50ms", "jitter": "10ms", "direction": "both"},
    "network.bandwidth": {"rate": "10KB/s"},
    "network.slicer": {"average_size": "4B", "size_variation": "4B", "delay": "100us"},
    "network.reset": {"after": "100ms"},
    "network.timeout": {"timeout": "1s"},
    "network.limit_data": {"bytes": "1KB"},
    "network.slow_close": {"delay": "200ms"},
    "network.buffer": {"max_time": "500ms"},
}


def experiment(proxy: dict[str, Any]) -> Any:
    return experiment_from_dict({"name": "n", "proxy": proxy, "phases": [{"name": "a", "duration": "1s"}]})


@pytest.fixture
def env(tmp_path: Path) -> Any:
    """A proxy on an embedded Toxiproxy hosted in this process, in front of a closed port."""
    with ToxiproxyThread() as tpx:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            target = TargetInfo(kind="openai", base_url=f"http://127.0.0.1:{s.getsockname()[1]}/v1")
        handle = asyncio.run(start_proxy(experiment({"server": "external", "url": tpx.url}), target, tmp_path))
        # it is our embedded server, so the non-standard buffer toxic is there
        info = replace(handle.info, supports_buffer=True)
        yield RunContext(seed=1, target=target, run_dir=tmp_path, proxy=info), experiment({"server": "embedded"}), \
            tpx.url
        asyncio.run(handle.stop())


def listed(api: str) -> list[dict[str, Any]]:
    return httpx.get(f"{api}/proxies/streamchaos/toxics", timeout=5).json()


@pytest.mark.parametrize("kind", sorted(PARAMS))
def test_fault_lists_its_toxic_and_reverts(env: Any, kind: str) -> None:
    fault_env, exp, api = env
    cls = REGISTRY[kind]
    values, problems = cls.schema.parse(PARAMS[kind])
    assert problems == []
    fault = cls.from_params(kind, values)
    assert fault.problems(exp) == []
    injection = fault.activate(fault_env)
    undo = injection.plan()
    evidence = asyncio.run(injection.inject())
    names = {t["name"] for t in listed(api)}
    assert names == {t["name"] for t in evidence["toxics"]} and names  # evidence = what the server lists
    assert asyncio.run(injection.revert())["removed"]
    assert listed(api) == []
    asyncio.run(injection.revert())  # idempotent
    asyncio.run(injection.inject())  # a crash after this: rollback from the plan alone
    assert listed(api) != []
    cls.rollback(undo)
    assert listed(api) == []


def test_network_down_refuses_connections_and_comes_back(env: Any) -> None:
    fault_env, _, api = env
    cls = REGISTRY["network.down"]
    injection = cls.from_params("down", {}).activate(fault_env)
    undo = injection.plan()
    assert asyncio.run(injection.inject())["enabled"] is False
    host, port = fault_env.proxy.listen.rsplit(":", 1)
    with pytest.raises(ConnectionRefusedError), socket.create_connection((host, int(port)), timeout=2):
        pass
    cls.rollback(undo)
    assert httpx.get(f"{api}/proxies/streamchaos", timeout=5).json()["enabled"] is True
    with socket.create_connection((host, int(port)), timeout=2):
        pass


def test_bad_attributes_that_crash_real_toxiproxy_are_rejected_at_validation() -> None:
    exp = experiment({"server": "binary"})
    slicer = REGISTRY["network.slicer"]
    values, problems = slicer.schema.parse({"average_size": "4B", "size_variation": "8B"})
    assert problems == []
    assert [key for key, _ in slicer.from_params("s", values).problems(exp)] == ["size_variation"]
    assert REGISTRY["network.slicer"].schema.parse({"average_size": "0B"})[1]  # average_size 0 crashes the real server
    assert REGISTRY["network.bandwidth"].schema.parse({"rate": "0KB/s"})[1]
    buffer = REGISTRY["network.buffer"]
    assert any("embedded" in message
               for _, message in buffer.from_params("b", buffer.schema.parse({})[0]).problems(exp))
