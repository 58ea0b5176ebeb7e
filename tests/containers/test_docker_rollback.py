"""`streamchaos rollback` on containers, from crafted journals: the labels decide, not the journal.

A container is removed, unpaused or given its CPU back only when it carries both of the run's
labels (the run id from the journal's first record, the directory rollback was pointed at). One the
journal never named (the runner died between creating it and journaling its id) is still found.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from chaos.docker.containers import run_labels

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_id() -> str:
    """A run id per test: rollback searches every container carrying the journal's run id, so two tests
    on two xdist workers sharing one id would each find (and rightly leave alone) the other's sidecar."""
    return uuid.uuid4().hex[:16]


def write_journal(run_dir: Path, run_id: str, *records: dict[str, Any]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = run_dir / "journal.jsonl"
    lines = [{"type": "run", "experiment": "crafted", "t0": 0, "wall_t0": 0.0, "pid": 1, "run_id": run_id}, *records]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    path.chmod(0o600)
    return path


def resource_plan(**undo: Any) -> dict[str, Any]:
    return {"type": "resource", "name": "target", "kind": "docker.container", "action": "plan", "t": 1, "undo": undo}


def fault_plan(name: str, kind: str, **undo: Any) -> dict[str, Any]:
    return {"type": "fault", "fault": name, "kind": kind, "action": "plan", "t": 2, "phase": "p", "undo": undo}


def rollback(run_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "chaos", "rollback", str(run_dir)], env=env, capture_output=True,
                          text=True, timeout=60)


def test_a_journal_naming_another_runs_container_cannot_make_rollback_touch_it(tmp_path: Path, sidecar: Any,
                                                                               run_id: str, docker_client: Any) -> None:
    other = sidecar(run_labels(run_id, tmp_path / "another-run", "target"))  # same run id, another directory
    other.pause()
    other.client.api.update_container(other.id, cpu_period=100_000, cpu_quota=30_000)
    run_dir = tmp_path / "run"
    write_journal(run_dir, run_id, resource_plan(container_id=other.id),
                  fault_plan("freeze", "docker.pause", container_id=other.id),
                  fault_plan("starve", "docker.cpu_limit", container_id=other.id, previous_quota_us=0,
                             previous_period_us=0, set_quota_us=30_000, set_period_us=100_000,
                             run_dir=str(tmp_path / "another-run")))
    done = rollback(run_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("is not this run's") == 3, done.stdout  # the plan's own run_dir claim counts for nothing
    other.reload()
    assert other.status == "paused" and other.attrs["HostConfig"]["CpuQuota"] == 30_000


def test_rollback_removes_a_container_the_journal_never_named(tmp_path: Path, sidecar: Any, run_id: str,
                                                              docker_client: Any) -> None:
    run_dir = tmp_path / "run"
    orphan = sidecar(run_labels(run_id, run_dir, "target"))  # created, then the runner died before journaling its id
    write_journal(run_dir, run_id, resource_plan(container_name="streamchaos-x",
                                                 labels=run_labels(run_id, run_dir, "target")))
    done = rollback(run_dir)
    assert done.returncode == 0 and "rolled back target (docker.container)" in done.stdout, done.stdout + done.stderr
    assert docker_client.containers.list(all=True, filters={"id": orphan.id}) == []
    assert (run_dir / f"container-{orphan.id[:12]}.log").exists()
    again = rollback(run_dir)
    assert again.returncode == 0 and "nothing to roll back" in again.stdout  # journaled: idempotent


def test_rollback_unpauses_and_restores_the_cpu_of_its_own_container_before_removing_it(tmp_path: Path,
                                                                                        sidecar: Any, run_id: str,
                                                                                        docker_client: Any) -> None:
    run_dir = tmp_path / "run"
    ours = sidecar(run_labels(run_id, run_dir, "target"))
    ours.pause()
    ours.client.api.update_container(ours.id, cpu_period=100_000, cpu_quota=30_000)
    write_journal(run_dir, run_id, resource_plan(container_id=ours.id),
                  fault_plan("starve", "docker.cpu_limit", container_id=ours.id, previous_quota_us=0,
                             previous_period_us=0, set_quota_us=30_000, set_period_us=100_000),
                  fault_plan("freeze", "docker.pause", container_id=ours.id))
    done = rollback(run_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()  # newest first: the pause, the quota, then the container itself
    assert [line.split(" (")[0] for line in lines] == ["rolled back freeze", "rolled back starve", "rolled back target"]
    assert '"unpaused": true' in lines[0] and '"restored": true' in lines[1] and '"cpu_quota_us": -1' in lines[1]
    assert docker_client.containers.list(all=True, filters={"id": ours.id}) == []
