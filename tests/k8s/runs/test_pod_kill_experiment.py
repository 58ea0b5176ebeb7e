"""The shipped experiments/pod-kill.yaml, run by the runner against manifests/demo-stack.yaml applied to
the cluster (three pods of the builtin stack), as a runner outside the cluster runs it: a port-forward,
and exactly the RBAC `streamchaos manifests rbac --outside` prints."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from clusters import ClusterUnderTest

from chaos.api import run_async
from chaos.experiment import load_experiment
from chaos.k8s.manifests import experiment_rules
from chaos.output.replay import replay

ROOT = Path(__file__).resolve().parents[3]
DEMO = "app.kubernetes.io/name=streamchaos-demo"

pytestmark = pytest.mark.timeout(300)  # slow: tests/conftest.py marks the folder


async def test_the_shipped_pod_kill_experiment(cluster: ClusterUnderTest, namespace: str, tmp_path: Path) -> None:
    cluster.apply(namespace, [d for d in yaml.safe_load_all((ROOT / "manifests" / "demo-stack.yaml").read_text()) if d])
    before = {p["metadata"]["uid"] for p in cluster.wait_ready(namespace, DEMO, 3, timeout=120)}
    raw = yaml.safe_load((ROOT / "experiments" / "pod-kill.yaml").read_text(encoding="utf-8"))
    shipped = load_experiment(ROOT / "experiments" / "pod-kill.yaml")
    kubeconfig = cluster.runner_kubeconfig(namespace, experiment_rules(shipped, in_cluster=False))
    raw["target"]["kubernetes"].update(namespace=namespace, access="port-forward", kubeconfig=str(kubeconfig))
    raw["safety"]["allowed_targets"]["namespaces"] = [namespace]  # the test's own namespace; the selector as shipped
    path = tmp_path / "pod-kill.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    started = time.monotonic()
    result = await run_async(path, out_dir=tmp_path / "run", handle_signals=False)
    took = time.monotonic() - started
    print(f"pod-kill: {result.status}, exit {result.exit_code}, {took:.1f}s wall, "
          f"{len(result.observations.streams)} streams")
    assert result.status == "completed", result.error
    assert result.exit_code == 0, [(v.name, v.phase, v.status, v.figure, v.evidence.get("reason"))
                                   for v in result.failing()]

    obs = result.observations
    capacity = next(v for v in result.verdicts if v.sla == "capacity")
    assert capacity.status == "pass" and 0 < capacity.figure < 30
    (row,) = capacity.evidence["disruptions"]
    assert row["baseline_ready"] == 3 and row["lowest_ready"] == 2
    (revert,) = [e for e in obs.faults if e.action == "revert"]
    (victim,) = revert.evidence["pods"]
    assert victim["uid"] in before and victim["gone_s"] is not None
    (replacement,) = revert.evidence["replacements"]
    assert replacement["uid"] not in before and replacement["ready_s"] is not None
    # the pods' life is in the observations: the victim deleted, the replacement Ready
    pod_notes = [n.data for n in obs.notes_on("k8s_pod")]
    deleted = next(d for d in pod_notes if d["event"] == "DELETED")
    assert {"event": "DELETED", "uid": victim["uid"]}.items() <= deleted.items()
    assert any(d["uid"] == replacement["uid"] and d["ready"] for d in pod_notes)
    # each pod's metrics, labelled by pod: the three first pods and the replacement
    scraped = {m.labels.get("pod") for m in obs.series("vllm:num_requests_running")}
    assert {victim["name"], replacement["name"]} <= scraped and len(scraped) == 4
    assert any(s.phase == "kill" for s in obs.population())
    page = (result.out_dir / "report.html").read_text(encoding="utf-8")
    assert "series-streamchaos_k8s_pods_ready" in page and "Kubernetes pods: ready (serving) and terminating" in page
    # the observations are enough to judge it again offline
    replayed = replay(load_experiment(result.out_dir / "experiment.yaml"), result.out_dir)
    again = next(v for v in replayed.verdicts if v.sla == "capacity")
    assert (again.status, again.figure, again.evidence["disruptions"]) == (
        capacity.status, capacity.figure, capacity.evidence["disruptions"])
