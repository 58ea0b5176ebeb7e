"""The kill matrix: a run with a fault of every family active is interrupted with SIGINT, SIGTERM
or SIGKILL, at inject time and mid-phase. Afterwards (and after `streamchaos rollback` for SIGKILL)
nothing is left changed: no toxic on the proxy, no hook fault or reserved KV block in the stack, the
fake GPU's clocks unlocked, no contention helper alive.

The stack and Toxiproxy are started by the test, outside the runner, so that what a killed runner
leaves behind stays visible (the runner's own children die with it)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from chaos.gpu.burner import find_burners
from chaos.stack.process import StackProcess
from chaos.toxiproxy.server import ToxiproxyThread

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nvml"))
from fakenvml import build_fake_nvml, gcc, read_state  # noqa: E402

pytestmark = pytest.mark.timeout(300)

FAULTS = [
    {"kind": "network.latency", "latency": "30ms"},
    {"kind": "client.disconnect", "fraction": "30%", "after_tokens": 3},
    {"kind": "server.stall", "where": "event_loop", "duration": "20ms", "every": "400ms"},
    {"kind": "server.timeout", "where": "send", "fraction": "10%"},
    {"kind": "kv.pressure", "method": "reserve", "fraction": "25%"},
    {"kind": "gpu.throttle", "name": "clocks", "backend": "nvml", "fraction_of_max": "50%"},
    {"kind": "gpu.throttle", "name": "contention", "backend": "contention", "fraction_of_max": "80%"},
]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if gcc() is None:
        pytest.skip("gcc is needed to build the fake NVML library")
    tmp = tmp_path_factory.mktemp("kill-matrix")
    lib = build_fake_nvml(tmp)
    stack = StackProcess.start("--port", "0", "--kv-blocks", "256")
    tpx = ToxiproxyThread()
    tpx.start()
    try:
        yield {"tmp": tmp, "lib": lib, "stack": stack.url, "tpx": tpx.url, "token": stack.admin_token,
               "admin_headers": stack.admin_headers}
    finally:
        tpx.stop()
        stack.close()


def write_experiment(world: dict[str, Any], path: Path) -> None:
    experiment = {
        "name": "kill-matrix", "seed": 1,
        "target": {"kind": "builtin", "url": world["stack"]},
        "proxy": {"server": "external", "url": world["tpx"]},
        "load": {"concurrency": 3, "max_tokens": 32},
        "phases": [{"name": "chaos", "duration": "6s", "faults": FAULTS}],
        "sla": [{"kind": "errors", "budget": "100%"}],
        "safety": {"max_duration": "60s", "cleanup_window": "200ms", "drain_timeout": "2s",
                   "allow_gpu_clock_changes": True},
    }
    path.write_text(yaml.safe_dump(experiment), encoding="utf-8")


def journal(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "journal.jsonl"
    if not path.exists():
        return []
    lines = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        try:
            lines.append(json.loads(raw))
        except json.JSONDecodeError:
            pass
    return lines


def fault_events(run_dir: Path, action: str) -> list[dict[str, Any]]:
    return [e for e in journal(run_dir) if e.get("type") == "fault" and e["action"] == action]


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def assert_nothing_left(world: dict[str, Any], run_dir: Path, state_file: Path) -> None:
    toxics = httpx.get(f"{world['tpx']}/proxies/streamchaos/toxics", timeout=5)
    assert toxics.status_code == 404 or toxics.json() == [], toxics.text
    admin = world["stack"] + "/admin"
    headers = world["admin_headers"]
    assert httpx.get(admin + "/faults", headers=headers, timeout=5).json() == {"faults": {}}
    state = httpx.get(admin + "/state", headers=headers, timeout=5).json()
    assert state["kv_blocks_reserved"] == 0, state
    assert read_state(state_file).get("dev0.locked_max", 0) == 0, read_state(state_file)
    for plan in fault_events(run_dir, "plan"):
        tag = plan.get("undo", {}).get("tag")
        if tag:
            assert find_burners(tag) == [], f"contention helpers of {plan['fault']} still alive"
    assert httpx.get(world["stack"] + "/health", timeout=5).status_code == 200


@pytest.mark.parametrize("when", ["inject", "mid-phase"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_interrupted_run_leaves_nothing_changed(world: dict[str, Any], sig: signal.Signals, when: str,
                                                tmp_path: Path) -> None:
    exp, run_dir, state_file = tmp_path / "exp.yaml", tmp_path / "run", tmp_path / "nvml.state"
    write_experiment(world, exp)
    # the stack's admin token reaches the runner (and its watchdog) by environment, as an operator's would
    env = {**__import__("os").environ, "STREAMCHAOS_NVML_LIB": str(world["lib"]), "FAKE_NVML_STATE": str(state_file),
           "STREAMCHAOS_ADMIN_TOKEN": world["token"]}
    runner = subprocess.Popen([sys.executable, "-m", "chaos", "run", str(exp), "--out", str(run_dir), "--quiet"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        if when == "inject":
            wait_for(lambda: fault_events(run_dir, "plan"), 60, "the first fault plan")
        else:
            wait_for(lambda: len(fault_events(run_dir, "inject")) == len(FAULTS), 60, "every fault injected")
            time.sleep(0.5)
            # every family really changed something, so "nothing left" below is a real check
            assert read_state(state_file).get("dev0.locked_max", 0) > 0
            assert httpx.get(f"{world['tpx']}/proxies/streamchaos/toxics", timeout=5).json() != []
            headers = world["admin_headers"]
            assert set(httpx.get(world["stack"] + "/admin/faults", headers=headers, timeout=5).json()["faults"]) \
                == {"server.stall", "server.timeout"}
            assert httpx.get(world["stack"] + "/admin/state", headers=headers,
                             timeout=5).json()["kv_blocks_reserved"] > 0
            tags = [p["undo"]["tag"] for p in fault_events(run_dir, "plan") if p.get("undo", {}).get("tag")]
            assert any(find_burners(tag) for tag in tags)
        runner.send_signal(sig)
        _, stderr = runner.communicate(timeout=90)
    finally:
        if runner.poll() is None:
            runner.kill()
    if sig == signal.SIGKILL:
        assert runner.returncode == -signal.SIGKILL
        # the target and Toxiproxy come from configuration (the flags), never from the journal alone
        command = [sys.executable, "-m", "chaos", "rollback", str(run_dir), "--target-url", world["stack"],
                   "--toxiproxy-url", world["tpx"]]
        # the killed runner's watchdog may be rolling back right now: the command waits for it (--wait 60s)
        rollback = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert rollback.returncode == 0, rollback.stdout + rollback.stderr
        again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert again.returncode == 0 and "nothing to roll back" in again.stdout  # idempotent
    else:
        assert runner.returncode == 4, stderr
        planned = {e["fault"] for e in fault_events(run_dir, "plan")}
        reverted = {e["fault"] for e in fault_events(run_dir, "revert")}
        assert planned and planned <= reverted, f"planned {planned}, reverted {reverted}"
        assert json.loads((run_dir / "report.json").read_text())["status"] == "interrupted"
    assert_nothing_left(world, run_dir, state_file)


def _watchdog_pids(run_dir: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"chaos.execution.watchdog" in cmdline and str(run_dir).encode() in cmdline:
                pids.append(int(entry.name))
    return pids


def test_rollback_restores_a_killed_gpu_throttle_run(world: dict[str, Any], tmp_path: Path) -> None:
    """Runner and watchdog both SIGKILLed with the fake GPU's clocks locked: `streamchaos rollback`
    alone unlocks them, from the journal."""
    import os

    exp, run_dir, state_file = tmp_path / "exp.yaml", tmp_path / "run", tmp_path / "nvml.state"
    exp.write_text(yaml.safe_dump({
        "name": "gpu-killed", "target": {"kind": "builtin", "url": world["stack"]},
        "load": {"concurrency": 1, "max_tokens": 8},
        "phases": [{"name": "throttle", "duration": "30s",
                    "faults": [{"kind": "gpu.throttle", "backend": "nvml", "sm_clock_mhz": 900}]}],
        "safety": {"max_duration": "60s", "allow_gpu_clock_changes": True},
    }), encoding="utf-8")
    env = {**os.environ, "STREAMCHAOS_NVML_LIB": str(world["lib"]), "FAKE_NVML_STATE": str(state_file)}
    runner = subprocess.Popen([sys.executable, "-m", "chaos", "run", str(exp), "--out", str(run_dir), "--quiet"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: fault_events(run_dir, "inject") and _watchdog_pids(run_dir), 60,
                 "the clock lock and its watchdog")
        for pid in _watchdog_pids(run_dir):
            os.kill(pid, signal.SIGKILL)  # the dead-man's switch is gone too: only the journal is left
        runner.kill()
        runner.wait(timeout=10)
    finally:
        if runner.poll() is None:
            runner.kill()
    locked = read_state(state_file)
    assert locked.get("dev0.locked_max", 0) > 0, locked  # the killed run left the GPU throttled
    rollback = subprocess.run([sys.executable, "-m", "chaos", "rollback", str(run_dir)], env=env, capture_output=True,
                              text=True, timeout=60)
    assert rollback.returncode == 0 and "rolled back" in rollback.stdout, rollback.stdout + rollback.stderr
    assert read_state(state_file).get("dev0.locked_max", 0) == 0
    assert [e["action"] for e in journal(run_dir) if e.get("type") == "fault"][-1] == "rollback"
