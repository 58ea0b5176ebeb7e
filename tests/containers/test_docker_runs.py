"""Killed runs with a docker target: the runner dies with SIGKILL while its container runs.

With the watchdog killed too, `streamchaos rollback` alone thaws the frozen, throttled container,
gives its CPU back and removes it; with the watchdog alive, the watchdog removes it by itself, also
when no fault is in force (the container is what outlives the runner). Either way nothing of the
run is left on the daemon. (The slow tier: each starts a real runner.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaos.docker.containers import LABEL_RUN_DIR

pytestmark = pytest.mark.timeout(180)

EXPERIMENT = {
    "name": "docker-killed", "seed": 1,
    "target": {"kind": "docker"},
    "load": {"concurrency": 2, "max_tokens": 16},
    "phases": [{"name": "frozen", "duration": "60s", "faults": [{"kind": "docker.cpu_limit", "cpus": 0.5},
                                                                {"kind": "docker.pause"}]}],
    "safety": {"max_duration": "2m", "cleanup_window": "200ms"},
}


def records(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    path = run_dir / "journal.jsonl"
    out = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            body = json.loads(line)
        except json.JSONDecodeError:
            continue
        if body.get("type") == kind:
            out.append(body)
    return out


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def watchdog_pids(run_dir: Path) -> list[int]:
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


def run_containers(docker_client: Any, run_dir: Path) -> list[Any]:
    return docker_client.containers.list(all=True, filters={"label": f"{LABEL_RUN_DIR}={run_dir.resolve()}"})


def run_networks(docker_client: Any, run_dir: Path) -> list[Any]:
    """The run's own bridge network (the docker target's default), labelled like its container."""
    return docker_client.networks.list(filters={"label": f"{LABEL_RUN_DIR}={run_dir.resolve()}"})


def start_run(tmp_path: Path, docker_client: Any,
              experiment: dict[str, Any]) -> tuple[subprocess.Popen[bytes], Path, Any]:
    """A runner with every fault of its first phase injected and its watchdog up; (runner, run_dir, container)."""
    exp, run_dir = tmp_path / "exp.yaml", tmp_path / "run"
    exp.write_text(yaml.safe_dump(experiment), encoding="utf-8")
    runner = subprocess.Popen([sys.executable, "-m", "chaos", "run", str(exp), "--out", str(run_dir), "--quiet"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    faults = len(experiment["phases"][0].get("faults", []))
    try:
        wait_for(lambda: len([r for r in records(run_dir, "fault") if r["action"] == "inject"]) == faults
                 and any(r.get("topic") == "warmup" for r in records(run_dir, "note")) and watchdog_pids(run_dir),
                 90, "the target up, every fault injected and the watchdog running")
    except BaseException:
        runner.kill()
        raise
    [container] = run_containers(docker_client, run_dir)
    return runner, run_dir, container


def test_sigkill_of_runner_and_watchdog_then_rollback_leaves_nothing(tmp_path: Path, docker_client: Any,
                                                                     leftovers: list[str]) -> None:
    leftovers.append(str(tmp_path / "run"))
    runner, run_dir, container = start_run(tmp_path, docker_client, EXPERIMENT)
    assert container.status == "paused" and container.attrs["HostConfig"]["CpuQuota"] == 50_000
    assert len(run_networks(docker_client, run_dir)) == 1
    for pid in watchdog_pids(run_dir):
        os.kill(pid, signal.SIGKILL)  # the dead-man's switch is gone too: only the journal is left
    runner.kill()
    runner.wait(timeout=10)
    time.sleep(0.5)
    container.reload()
    assert container.status == "paused"  # the killed run left its container frozen, throttled and running
    done = subprocess.run([sys.executable, "-m", "chaos", "rollback", str(run_dir)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rolled back docker.pause" in done.stdout and "rolled back docker.cpu_limit" in done.stdout
    assert "rolled back target (docker.container)" in done.stdout
    assert run_containers(docker_client, run_dir) == [] and run_networks(docker_client, run_dir) == []
    assert list(run_dir.glob("container-*.log"))  # its logs kept in the run directory
    again = subprocess.run([sys.executable, "-m", "chaos", "rollback", str(run_dir)], capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 0 and "nothing to roll back" in again.stdout


def test_sigkill_of_the_runner_alone_the_watchdog_removes_the_container(tmp_path: Path, docker_client: Any,
                                                                        leftovers: list[str]) -> None:
    """No fault at all: the container itself outlives the runner, so the run keeps a watchdog for it."""
    leftovers.append(str(tmp_path / "run"))
    plain = {**EXPERIMENT, "phases": [{"name": "plain", "duration": "60s"}]}
    runner, run_dir, container = start_run(tmp_path, docker_client, plain)
    assert container.status == "running"
    runner.kill()
    runner.wait(timeout=10)
    wait_for(lambda: not run_containers(docker_client, run_dir), 60, "the watchdog to remove the container")
    wait_for(lambda: not run_networks(docker_client, run_dir), 10, "the watchdog to remove the run's network")
    # the journal's rollback records are written after each removal: done when the watchdog says so
    log = run_dir / "watchdog.log"
    wait_for(lambda: "watchdog: rolled back" in log.read_text(), 30, "the watchdog to finish its rollback")
    assert "runner process gone" in log.read_text()
    assert [r["action"] for r in records(run_dir, "resource")][-1] == "rollback"


def test_a_runner_killed_while_its_container_starts_leaves_nothing(tmp_path: Path, docker_client: Any,
                                                                  leftovers: list[str]) -> None:
    """The container exists long before it answers (here it never does: it only sleeps): a runner
    killed in that window must not leave it running, so the watchdog guards it from creation."""
    from dockerd import free_port

    from chaos.targets.host_image import host_image

    run_dir = tmp_path / "run"
    leftovers.append(str(run_dir))
    sleeper = {**EXPERIMENT, "phases": [{"name": "plain", "duration": "5s"}],
               "target": {"kind": "docker", "image": host_image(docker_client), "command": ["/usr/bin/sleep", "300"],
                          "volumes": ["/usr:/usr:ro"], "port": free_port(), "startup_timeout": "90s"}}
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(sleeper), encoding="utf-8")
    runner = subprocess.Popen([sys.executable, "-m", "chaos", "run", str(exp), "--out", str(run_dir), "--quiet"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: any("container_id" in (r.get("undo") or {}) for r in records(run_dir, "resource"))
                 and watchdog_pids(run_dir), 60, "the container created and a watchdog guarding it")
        [container] = run_containers(docker_client, run_dir)
        container.reload()
        assert container.status == "running"
        assert not any(r.get("topic") == "warmup" for r in records(run_dir, "note"))  # still starting: no answer yet
    finally:
        runner.kill()
        runner.wait(timeout=10)
    wait_for(lambda: not run_containers(docker_client, run_dir), 60, "the watchdog to remove the starting container")
    wait_for(lambda: not run_networks(docker_client, run_dir), 10, "the watchdog to remove the run's network")
    assert "runner process gone" in (run_dir / "watchdog.log").read_text()
