"""k8s.pod_kill, k8s.pod_evict and k8s.scale: injected, evidenced and reverted on a cluster, acting as a
ServiceAccount granted exactly what `streamchaos manifests rbac` generates (a missing grant fails the
test with a 403); refusals by RBAC or by a disruption budget become errors that say what would allow them."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx
import pytest
from clusters import ClusterUnderTest, fake_timings, kube_experiment, started_target
from fake_apiserver import PDB_SYNC, SCHEDULE_DELAY

from chaos.experiment import experiment_from_dict
from chaos.k8s.manifests import experiment_rules
from chaos.k8s.pods import choose
from chaos.model.errors import ChaosError, ExperimentInvalid, FaultError, FaultPermissionDenied
from faults.k8s import Scale

pytestmark = pytest.mark.timeout(120)  # slow: tests/conftest.py marks the folder


async def run_fault(cluster: ClusterUnderTest, namespace: str, fault: dict[str, Any], *, hold_s: float = 0.0,
                    during: Any = None, rules: Any = None) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Start the target, activate the fault, plan, inject, (run ``during``), revert: (plan, inject, revert)."""
    experiment = kube_experiment(namespace, [fault])
    target, ctx = await started_target(cluster, namespace, experiment, rules=rules)
    try:
        (_, spec), = experiment.faults()
        injection = spec.activate(ctx)
        plan = injection.plan()
        try:
            evidence = await injection.inject()
            if during is not None:
                await during(target)
            await asyncio.sleep(hold_s)
        finally:
            reverted = await injection.revert()
        return plan, evidence, reverted
    finally:
        await target.stop()


async def test_pod_kill_cuts_the_streams_of_the_pod_and_its_replacement_becomes_ready(
        cluster: ClusterUnderTest, namespace: str) -> None:
    cluster.deploy(namespace, "web", replicas=1, grace_s=5)  # one pod: every stream is on the victim
    (before,) = cluster.wait_ready(namespace, "web", 1)
    cut: dict[str, Any] = {}
    experiment = kube_experiment(namespace, [{"kind": "k8s.pod_kill", "grace_period": "0s", "at": "1s"}])
    target, ctx = await started_target(cluster, namespace, experiment)
    try:
        (_, spec), = experiment.faults()
        injection = spec.activate(ctx)
        injection.plan()
        async with httpx.AsyncClient(timeout=30) as client:
            async with client.stream("POST", target.info.base_url + "/completions", json={
                    "model": "mock", "prompt": "x", "max_tokens": 400, "stream": True}) as response:
                scheduled = await injection.inject()  # the delete comes 1s later, mid-stream
                body = b""
                try:
                    async for chunk in response.aiter_bytes():
                        body += chunk
                except httpx.HTTPError as exc:
                    cut["error"] = repr(exc)
            cut["done"] = b"[DONE]" in body
            await cluster_wait_async(cluster, lambda: len(cluster.ready_pods(namespace, "web")) == 1
                                     and before["metadata"]["uid"] not in uids(cluster.pods(namespace, "web")), 30)
            reverted = await injection.revert()
            after = await client.post(target.info.base_url + "/completions",
                                      json={"model": "mock", "prompt": "x", "max_tokens": 3, "stream": True},
                                      headers={"Connection": "close"})
    finally:
        await target.stop()
    assert scheduled["scheduled"] is True and scheduled["serving"] == 1
    assert cut["done"] is False  # the stream ended without its terminal event: the pod's process was killed
    (victim,) = reverted["pods"]
    assert victim["uid"] == before["metadata"]["uid"] and 0.9 <= victim["requested_after_s"] < 5
    assert victim["gone_s"] is not None and victim["gone_s"] < 3  # grace 0: gone at once, not after the pod's 5s
    (replacement,) = reverted["replacements"]
    assert replacement["uid"] != victim["uid"] and replacement["ready_s"] is not None and replacement["ready_s"] > 0
    assert reverted["capacity_back"] is True and reverted["times_from"] == "the first request"
    assert after.status_code == 200 and "[DONE]" in after.text  # new connections reach the replacement


async def cluster_wait_async(cluster: ClusterUnderTest, predicate: Any, timeout: float) -> None:
    await asyncio.to_thread(cluster.wait, predicate, timeout, "the cluster to settle")


def uids(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods}


async def test_pod_kill_by_fraction_deletes_that_share_and_names_each_uid(cluster: ClusterUnderTest,
                                                                         namespace: str) -> None:
    cluster.deploy(namespace, "web", replicas=3)
    uids = {p["metadata"]["uid"] for p in cluster.wait_ready(namespace, "web", 3)}
    plan, evidence, reverted = await run_fault(
        cluster, namespace, {"kind": "k8s.pod_kill", "fraction": 0.5, "grace_period": "0s"}, hold_s=2.5)
    assert plan["action"] == "delete" and plan["fraction"] == 0.5 and "cannot be undone" in plan["note"]
    killed = {p["uid"] for p in evidence["pods"]}
    assert len(killed) == 2 and killed <= uids  # 50% of 3, rounded up
    assert evidence["serving_before"] == 3
    now = await asyncio.to_thread(cluster.wait_ready, namespace, "web", 3)
    assert not killed & {p["metadata"]["uid"] for p in now}
    assert {r["uid"] for r in reverted["replacements"]} <= {p["metadata"]["uid"] for p in now}
    assert len(reverted["replacements"]) == 2


def test_victims_are_chosen_by_the_seed() -> None:
    pods = [{"metadata": {"name": f"web-{c}"}} for c in "edcba"]
    pick = lambda seed, **kw: [p["metadata"]["name"] for p in choose(pods, rng=random.Random(seed), **kw)]
    assert pick(1, count=2, fraction=None) == pick(1, count=2, fraction=None)
    assert {tuple(pick(s, count=2, fraction=None)) for s in range(20)} != {tuple(pick(1, count=2, fraction=None))}
    assert len(pick(3, count=None, fraction=0.01)) == 1 and len(pick(3, count=None, fraction=0.4)) == 2
    assert len(pick(3, count=9, fraction=None)) == 5


async def test_pod_evict_refused_by_a_budget_says_which_budget_and_what_would_allow_it(
        cluster: ClusterUnderTest, namespace: str) -> None:
    cluster.deploy(namespace, "web", replicas=2, budget={"minAvailable": 2})
    cluster.wait_ready(namespace, "web", 2)
    await asyncio.to_thread(cluster.wait, lambda: (cluster.policy.read_namespaced_pod_disruption_budget(
        "web", namespace).status.expected_pods or 0) == 2, 20, "the budget's status")
    with pytest.raises(FaultError) as refused:
        await run_fault(cluster, namespace, {"kind": "k8s.pod_evict", "count": 1})
    message = str(refused.value)
    assert "refused to create pods/eviction web-" in message and f"in namespace {namespace}" in message
    assert "disruption budget" in message and "PodDisruptionBudget web (minAvailable 2)" in message
    assert "2 healthy pods, needs 2, 0 disruptions allowed" in message
    assert "lower minAvailable" in message and "retry_for" in message
    assert len(cluster.ready_pods(namespace, "web")) == 2  # nothing was evicted

    _, evidence, _ = await run_fault(cluster, namespace, {"kind": "k8s.pod_evict", "count": 1,
                                                          "on_refused": "record", "retry_for": "1s"})
    (refusal,) = evidence["refused"]
    assert evidence["pods"] == [] and "after retrying for 1s" in refusal["refused"]


async def test_pod_evict_within_the_budget_evicts_and_the_pod_is_replaced(cluster: ClusterUnderTest,
                                                                          namespace: str) -> None:
    cluster.deploy(namespace, "web", replicas=2, budget={"maxUnavailable": 1})
    cluster.wait_ready(namespace, "web", 2)
    await asyncio.to_thread(cluster.wait, lambda: (cluster.policy.read_namespaced_pod_disruption_budget(
        "web", namespace).status.disruptions_allowed or 0) == 1, 20, "a disruption to be allowed")
    _, evidence, reverted = await run_fault(cluster, namespace, {"kind": "k8s.pod_evict", "count": 1,
                                                                 "grace_period": "0s"}, hold_s=2.5)
    (victim,) = evidence["pods"]
    assert evidence["action"] == "evict" and "refused" not in evidence
    assert reverted["pods"][0]["gone_s"] is not None and reverted["replacements"]
    now = await asyncio.to_thread(cluster.wait_ready, namespace, "web", 2)
    assert victim["uid"] not in {p["metadata"]["uid"] for p in now}


async def test_a_missing_grant_is_a_permission_error_naming_it(cluster: ClusterUnderTest, namespace: str) -> None:
    cluster.deploy(namespace, "web", replicas=2)
    cluster.wait_ready(namespace, "web", 2)
    experiment = kube_experiment(namespace, [{"kind": "k8s.pod_kill"}])
    rules = [r for r in experiment_rules(experiment, in_cluster=False)
             if r.resource != "pods" or "delete" not in r.verbs]
    rules.append(type(rules[0])("", "pods", ("get", "list", "watch"), "without delete"))
    with pytest.raises(FaultPermissionDenied) as denied:
        await run_fault(cluster, namespace, {"kind": "k8s.pod_kill"}, rules=rules)
    message = str(denied.value)
    assert "refused to delete pods web-" in message and f"in namespace {namespace}" in message and "403" in message
    assert '{apiGroups: [""], resources: ["pods"], verbs: ["delete"]}' in message
    assert len(cluster.pods(namespace, "web")) == 2


async def test_scale_sets_the_replicas_and_restores_them(cluster: ClusterUnderTest, namespace: str) -> None:
    cluster.deploy(namespace, "web", replicas=3)
    cluster.wait_ready(namespace, "web", 3)
    plan, evidence, reverted = await run_fault(
        cluster, namespace, {"kind": "k8s.scale", "deployment": "web", "replicas": 1}, hold_s=2.0)
    uid = cluster.apps.read_namespaced_deployment("web", namespace).metadata.uid
    assert plan == {"namespace": namespace, "deployment": "web", "uid": uid, "replicas_before": 3, "replicas_set": 1,
                    "api_server": plan["api_server"]}  # journaled before the change: a complete undo
    assert evidence["replicas_before"] == 3 and evidence["replicas_set"] == 1 and evidence["undo"]["uid"] == uid
    assert reverted["restored"] is True and reverted["replicas"] == 3
    assert reverted["settled_after_s"] is not None  # the pods did go down to one while it held
    assert cluster.replicas(namespace, "web") == 3
    await asyncio.to_thread(cluster.wait_ready, namespace, "web", 3)


async def test_scale_leaves_alone_replicas_someone_else_changed(cluster: ClusterUnderTest, namespace: str) -> None:
    cluster.deploy(namespace, "web", replicas=3)
    cluster.wait_ready(namespace, "web", 3)

    async def an_autoscaler_steps_in(target: Any) -> None:
        await asyncio.to_thread(cluster.apps.patch_namespaced_deployment_scale, "web", namespace,
                                {"spec": {"replicas": 2}})

    _, _, reverted = await run_fault(cluster, namespace, {"kind": "k8s.scale", "deployment": "web", "replicas": 1},
                                     during=an_autoscaler_steps_in)
    assert reverted["restored"] is False and "has 2 replicas, not the 1 this run set" in reverted["why"]
    assert cluster.replicas(namespace, "web") == 2


async def test_scale_leaves_alone_a_deployment_that_was_replaced(cluster: ClusterUnderTest, namespace: str) -> None:
    cluster.deploy(namespace, "web", replicas=2)
    cluster.wait_ready(namespace, "web", 2)

    async def redeployed(target: Any) -> None:  # same name, new object, at the count the run set
        await asyncio.to_thread(cluster.apps.delete_namespaced_deployment, "web", namespace)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(cluster.deploy, namespace, "web", replicas=1, service=False)

    _, _, reverted = await run_fault(cluster, namespace, {"kind": "k8s.scale", "deployment": "web", "replicas": 1},
                                     during=redeployed)
    assert reverted["restored"] is False and "is another object now" in reverted["why"]
    assert cluster.replicas(namespace, "web") == 1


async def test_scale_rollback_from_the_journal_restores_only_the_runs_change(cluster: ClusterUnderTest, namespace: str,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    cluster.deploy(namespace, "web", replicas=3)
    cluster.wait_ready(namespace, "web", 3)
    experiment = kube_experiment(namespace, [{"kind": "k8s.scale", "deployment": "web", "replicas": 1}])
    target, ctx = await started_target(cluster, namespace, experiment)
    try:
        (_, spec), = experiment.faults()
        injection = spec.activate(ctx)
        undo = injection.plan()
        evidence = await injection.inject()  # ... and the runner dies here: no revert
        undo.update(evidence["undo"])
        await injection.api.close()
    finally:
        await target.stop()
    assert cluster.replicas(namespace, "web") == 1
    monkeypatch.setenv("STREAMCHAOS_KUBECONFIG", str(ctx.target.cluster.kubeconfig))  # configuration, not the journal
    assert await asyncio.to_thread(Scale.rollback, undo) == {"restored": True, "replicas": 3, "deployment": "web",
                                                             "namespace": namespace}
    assert cluster.replicas(namespace, "web") == 3
    again = await asyncio.to_thread(Scale.rollback, undo)  # idempotent: 3 is not the run's 1 any more
    assert again["restored"] is False and cluster.replicas(namespace, "web") == 3
    with pytest.raises(ChaosError) as elsewhere:
        await asyncio.to_thread(Scale.rollback, {**undo, "api_server": "https://other-cluster.example:6443"})
    assert "reaches" in str(elsewhere.value) and "nothing was changed" in str(elsewhere.value)


def test_k8s_faults_need_a_kubernetes_target_and_whole_seconds() -> None:
    with pytest.raises(ExperimentInvalid) as bad:
        experiment_from_dict({"name": "x", "phases": [{"name": "p", "duration": "1s", "faults": [
            {"kind": "k8s.pod_kill", "count": 1, "fraction": 0.5},
            {"kind": "k8s.scale", "deployment": "web", "replicas": -1}]}]})
    text = str(bad.value)
    assert "phases[0].faults[0]: give at most one of count, fraction" in text
    assert "phases[0].faults[1].replicas: must be at least 0" in text
    with pytest.raises(ExperimentInvalid) as builtin:
        experiment_from_dict({"name": "x", "phases": [{"name": "p", "duration": "1s",
                                                       "faults": [{"kind": "k8s.pod_evict"}]}]})
    assert "k8s.pod_evict acts on the pods of a Kubernetes target: set target.kind: kubernetes" in str(builtin.value)
    with pytest.raises(ExperimentInvalid) as seconds:
        kube_experiment("demo", [{"kind": "k8s.pod_kill", "grace_period": "1500ms"}])
    assert "grace_period: the API takes whole seconds, found 1.5s" in str(seconds.value)


# -- as a real cluster times it, and the calls it was asked (read back from the fake's audit log) -------------

WRITES = ("create", "update", "patch", "delete", "deletecollection")


def runner_writes(cluster: ClusterUnderTest, namespace: str) -> list[tuple[str, str, str]]:
    """(verb, resource, name) of every write the runner's ServiceAccounts asked in ``namespace``, in order,
    but the port-forwards its relay opens (a ``create`` on pods/portforward)."""
    return [(r["verb"], r["resource"], r["name"]) for r in cluster.audit(namespace=namespace)
            if r["user"].startswith("system:serviceaccount:") and r["verb"] in WRITES
            and r["resource"] != "pods/portforward"]


async def test_pod_kill_deletes_the_pods_it_names_and_nothing_else(cluster: ClusterUnderTest, namespace: str) -> None:
    """One delete per victim, each naming its pod (a real cluster: the outcome only; its audit log is in
    its audit backend)."""
    cluster.deploy(namespace, "web", replicas=3)
    names = {p["metadata"]["name"] for p in cluster.wait_ready(namespace, "web", 3)}
    _, evidence, _ = await run_fault(cluster, namespace, {"kind": "k8s.pod_kill", "count": 2, "grace_period": "0s"})
    killed = {p["name"] for p in evidence["pods"]}
    assert len(killed) == 2 and killed <= names
    await cluster_wait_async(cluster, lambda: not killed & {p["metadata"]["name"]
                                                            for p in cluster.pods(namespace, "web")}, 30)
    assert names - killed <= {p["metadata"]["name"] for p in cluster.pods(namespace, "web")}  # the third kept
    if not cluster.real:
        assert sorted(runner_writes(cluster, namespace)) == sorted(("delete", "pods", name) for name in killed)


@fake_timings
async def test_an_eviction_a_new_budget_does_not_allow_yet_is_asked_again_until_it_does(
        cluster: ClusterUnderTest, namespace: str) -> None:
    """A new budget's status is written by the disruption controller seconds after it is made (3 s on a
    real 1.36 cluster); until then each eviction is a 429. ``retry_for`` asks again until it goes through."""
    cluster.deploy(namespace, "web", replicas=2)
    cluster.wait_ready(namespace, "web", 2)
    await asyncio.to_thread(cluster.policy.create_namespaced_pod_disruption_budget, namespace, {
        "metadata": {"name": "web", "annotations": {PDB_SYNC: "5"}},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
    _, evidence, _ = await run_fault(cluster, namespace, {"kind": "k8s.pod_evict", "count": 1, "grace_period": "0s",
                                                          "retry_for": "30s"})
    (victim,) = evidence["pods"]
    assert "refused" not in evidence
    asked = [w for w in runner_writes(cluster, namespace) if w[:2] == ("create", "pods/eviction")]
    assert len(asked) >= 2 and {name for _, _, name in asked} == {victim["name"]}  # refused, asked again, allowed


@fake_timings
async def test_a_replacement_the_scheduler_holds_pending_is_not_capacity_back(cluster: ClusterUnderTest,
                                                                              namespace: str) -> None:
    """A replacement can sit Pending for seconds (2.8-7.6 s seen on a real cluster): it counts when it
    serves, not when it appears."""
    cluster.deploy(namespace, "web", replicas=1, annotations={SCHEDULE_DELAY: "6"})
    cluster.wait_ready(namespace, "web", 1)
    _, _, reverted = await run_fault(cluster, namespace, {"kind": "k8s.pod_kill", "grace_period": "0s"},
                                     hold_s=1.5)
    (replacement,) = reverted["replacements"]
    assert replacement["seen_s"] is not None and replacement["ready_s"] is None  # there, and Pending
    assert reverted["serving_at_revert"] == 0 and reverted["capacity_back"] is False
    (now,) = await asyncio.to_thread(cluster.wait_ready, namespace, "web", 1)
    assert now["metadata"]["uid"] == replacement["uid"]  # the same pod serves once bound
