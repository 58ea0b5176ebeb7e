"""safety.allowed_targets on a real (fake-API) cluster: a Kubernetes target resolves its namespace
and pods, and a namespace or pod selector the allow-list does not cover is refused before any load
or fault, with nothing deleted."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from clusters import ClusterUnderTest, kube_experiment

from chaos.api import run_async
from chaos.k8s.manifests import experiment_rules
from chaos.model.context import AllowedTargets

pytestmark = pytest.mark.timeout(180)  # slow: tests/conftest.py marks the folder

KILL = {"kind": "k8s.pod_kill", "count": 1, "grace_period": "0s"}


def with_allowed(experiment: object, **allowed: tuple[str, ...]) -> object:
    safety = replace(experiment.safety, allowed_targets=AllowedTargets(**allowed))  # type: ignore[attr-defined]
    return replace(experiment, safety=safety)  # type: ignore[type-var]


@pytest.mark.parametrize("allowed", [
    {"namespaces": ("somewhere-else",)},  # not the target's namespace
    {"namespaces": ("*",), "selectors": ("app=other",)},  # the fault's pods are not within the allowed selector
], ids=["namespace", "selector"])
async def test_a_cluster_the_allow_list_does_not_cover_is_refused_before_anything(
    cluster: ClusterUnderTest, namespace: str, tmp_path: Path, allowed: dict[str, tuple[str, ...]],
) -> None:
    cluster.deploy(namespace, "web", replicas=2)
    before = {p["metadata"]["uid"] for p in cluster.wait_ready(namespace, "web", 2)}
    base = kube_experiment(namespace, [KILL])
    kubeconfig = cluster.runner_kubeconfig(namespace, experiment_rules(base, in_cluster=False))
    target = replace(base.target, kubernetes=replace(base.target.kubernetes, kubeconfig=str(kubeconfig)))
    experiment = with_allowed(replace(base, target=target), **allowed)
    result = await run_async(experiment, out_dir=tmp_path / "run", handle_signals=False)
    assert result.status == "failed" and result.exit_code == 2, result.error
    assert "safety.allowed_targets" in (result.error or "")
    assert result.observations.streams == [] and result.observations.faults == []  # no load, no fault
    assert {p["metadata"]["uid"] for p in cluster.pods(namespace, "web")} == before  # nothing deleted
    if not cluster.real:  # nothing written, read back from the fake's audit log (a real cluster's is elsewhere)
        assert [r for r in cluster.audit(namespace=namespace) if r["user"].startswith("system:serviceaccount:")
                and r["verb"] in ("create", "update", "patch", "delete")] == []


async def test_the_same_run_goes_ahead_when_allowed(cluster: ClusterUnderTest, namespace: str, tmp_path: Path) -> None:
    cluster.deploy(namespace, "web", replicas=2)
    cluster.wait_ready(namespace, "web", 2)
    base = kube_experiment(namespace, [KILL])
    kubeconfig = cluster.runner_kubeconfig(namespace, experiment_rules(base, in_cluster=False))
    target = replace(base.target, kubernetes=replace(base.target.kubernetes, kubeconfig=str(kubeconfig)))
    experiment = with_allowed(replace(base, target=target), namespaces=(namespace,), selectors=("app=web",))
    result = await run_async(experiment, out_dir=tmp_path / "run", handle_signals=False)
    assert result.status == "completed", result.error
    assert [e.action for e in result.observations.faults][:2] == ["plan", "inject"]
