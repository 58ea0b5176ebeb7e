"""A runner SIGKILLed while k8s.scale holds a deployment down: its watchdog restores the replicas from the
journal (with the cluster configuration the runner gave it, never one the journal names), and a later
`streamchaos rollback` finds nothing left to do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from clusters import ClusterUnderTest, kube_experiment

from chaos.k8s.manifests import experiment_rules

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(180)  # slow: tests/conftest.py marks the folder


def journal(run_dir: Path) -> list[dict]:
    path = run_dir / "journal.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip().startswith("{")]


def test_a_killed_runner_leaves_no_deployment_scaled_down(cluster: ClusterUnderTest, namespace: str,
                                                          tmp_path: Path) -> None:
    cluster.deploy(namespace, "web", replicas=3)
    cluster.wait_ready(namespace, "web", 3)
    fault = {"kind": "k8s.scale", "deployment": "web", "replicas": 1}
    kubeconfig = cluster.runner_kubeconfig(namespace, experiment_rules(kube_experiment(namespace, [fault]),
                                                                       in_cluster=False))
    experiment = tmp_path / "scale.yaml"
    experiment.write_text(yaml.safe_dump({
        "name": "scale-killed", "target": {"kind": "kubernetes", "kubernetes": {
            "namespace": namespace, "service": "web", "access": "port-forward", "kubeconfig": str(kubeconfig)}},
        "load": {"concurrency": 2, "max_tokens": 8},
        "phases": [{"name": "down", "duration": "60s", "faults": [fault]}],
        "safety": {"allowed_targets": {"namespaces": [namespace]}},
    }), encoding="utf-8")
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "STREAMCHAOS_KUBECONFIG")}
    runner = subprocess.Popen([sys.executable, "-m", "chaos.cli", "run", str(experiment), "--out", str(run_dir),
                               "--quiet"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=open(tmp_path / "runner.log", "wb"))
    try:
        cluster.wait(lambda: any(r.get("action") == "inject" and r.get("kind") == "k8s.scale"
                                 for r in journal(run_dir)), 90, "the scale to be injected")
        cluster.wait(lambda: cluster.replicas(namespace, "web") == 1, 10, "the deployment to be scaled down")
        runner.send_signal(signal.SIGKILL)
        runner.wait(10)
    finally:
        if runner.poll() is None:
            runner.kill()
    cluster.wait(lambda: cluster.replicas(namespace, "web") == 3, 30, "the watchdog to restore the replicas")
    # the watchdog logs what it did once its rollback returns, a moment after the cluster shows it
    log_file = run_dir / "watchdog.log"
    cluster.wait(lambda: log_file.exists() and "'restored': True" in log_file.read_text(encoding="utf-8"), 30,
                 "the watchdog to log its rollback")
    log = log_file.read_text(encoding="utf-8")
    assert "runner process gone" in log and "'restored': True" in log
    (rolled,) = [r for r in journal(run_dir) if r.get("action") == "rollback"]
    assert rolled["kind"] == "k8s.scale" and rolled["evidence"]["restored"] is True
    assert rolled["undo"]["replicas_before"] == 3

    again = subprocess.run([sys.executable, "-m", "chaos.cli", "rollback", str(run_dir),
                            "--kubeconfig", str(kubeconfig)], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 0 and "nothing to roll back" in again.stdout
    cluster.wait_ready(namespace, "web", 3)
