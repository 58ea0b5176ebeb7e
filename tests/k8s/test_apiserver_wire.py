"""The API server speaks what the official client expects: objects, Status errors, watch, eviction, scale.

These run against the fake API server, and against a real cluster where ``STREAMCHAOS_TEST_KUBECONFIG``
names one: they are the evidence that the fake behaves like the real thing where streamchaos relies on it.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import pytest
from clusters import MOCK_POD, ClusterUnderTest, fake_only
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.timeout(90)


def status(exc: ApiException) -> dict[str, Any]:
    body = json.loads(exc.body)
    assert body["kind"] == "Status" and body["status"] == "Failure" and body["code"] == exc.status
    return body


def test_objects_carry_identity_and_ownership(cluster: ClusterUnderTest, namespace: str) -> None:
    cluster.deploy(namespace, "web", replicas=2)
    pods = cluster.wait_ready(namespace, "web", 2)
    dep = cluster.admin.sanitize_for_serialization(cluster.apps.read_namespaced_deployment("web", namespace))
    for obj in [dep, *pods]:
        meta = obj["metadata"]
        assert meta["uid"] and isinstance(meta["resourceVersion"], str) and meta["creationTimestamp"]
    for pod in pods:
        (owner,) = pod["metadata"]["ownerReferences"]
        assert owner["kind"] == "ReplicaSet" and owner["controller"] is True
        rs = cluster.apps.read_namespaced_replica_set(owner["name"], namespace)
        assert rs.metadata.uid == owner["uid"]
        assert [(o.kind, o.uid) for o in rs.metadata.owner_references] == [("Deployment", dep["metadata"]["uid"])]
        assert pod["status"]["podIP"] and any(c["type"] == "Ready" and c["status"] == "True"
                                              for c in pod["status"]["conditions"])


def test_errors_are_status_objects(cluster: ClusterUnderTest, namespace: str) -> None:
    with pytest.raises(ApiException) as missing:
        cluster.core.read_namespaced_pod("nope", namespace)
    body = status(missing.value)
    assert missing.value.status == 404 and body["reason"] == "NotFound" and body["details"]["name"] == "nope"

    cluster.deploy(namespace, "web", replicas=1, service=False)
    with pytest.raises(ApiException) as exists:
        cluster.deploy(namespace, "web", replicas=1, service=False)
    assert exists.value.status == 409 and status(exists.value)["reason"] == "AlreadyExists"

    scale = cluster.apps.read_namespaced_deployment_scale("web", namespace)
    assert scale.kind == "Scale" and scale.spec.replicas == 1
    stale = scale.metadata.resource_version
    cluster.apps.patch_namespaced_deployment_scale("web", namespace, {"spec": {"replicas": 2}})
    scale.spec.replicas = 3
    with pytest.raises(ApiException) as conflict:  # a compare-and-set on a stale resourceVersion
        cluster.apps.replace_namespaced_deployment_scale("web", namespace, scale)
    assert conflict.value.status == 409 and status(conflict.value)["reason"] == "Conflict"
    assert stale != cluster.apps.read_namespaced_deployment_scale("web", namespace).metadata.resource_version

    with pytest.raises(ApiException) as negative:
        cluster.apps.patch_namespaced_deployment_scale("web", namespace, {"spec": {"replicas": -1}})
    assert negative.value.status == 422 and status(negative.value)["reason"] == "Invalid"


def test_a_deleted_pod_is_replaced_and_the_watch_says_so(cluster: ClusterUnderTest, namespace: str) -> None:
    cluster.deploy(namespace, "web", replicas=2, grace_s=1)
    pods = cluster.wait_ready(namespace, "web", 2)
    listed = cluster.core.list_namespaced_pod(namespace, label_selector="app=web")
    victim = pods[0]["metadata"]
    events: list[tuple[str, str, str, bool]] = []

    def follow() -> None:
        w = watch.Watch()
        for event in w.stream(cluster.core.list_namespaced_pod, namespace, label_selector="app=web",
                              resource_version=listed.metadata.resource_version, timeout_seconds=20):
            obj = event["raw_object"]
            events.append((event["type"], obj["metadata"]["name"], obj["metadata"]["uid"],
                           bool(obj["metadata"].get("deletionTimestamp"))))
            if event["type"] == "DELETED" and obj["metadata"]["uid"] == victim["uid"]:
                w.stop()

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    time.sleep(0.3)
    cluster.core.delete_namespaced_pod(victim["name"], namespace, grace_period_seconds=1)
    follower.join(30)
    assert ("MODIFIED", victim["name"], victim["uid"], True) in events  # deletionTimestamp first (graceful)
    assert events[-1][:3] == ("DELETED", victim["name"], victim["uid"])
    added = [e for e in events if e[0] == "ADDED"]
    assert added and all(e[2] != victim["uid"] and e[1] != victim["name"] for e in added)  # new name, new uid
    after = cluster.wait_ready(namespace, "web", 2)
    assert victim["uid"] not in {p["metadata"]["uid"] for p in after}


@fake_only  # a real server expires versions at etcd compaction (every 5 minutes by default): not at once
def test_an_expired_resource_version_is_a_410_error_event(cluster: ClusterUnderTest, namespace: str) -> None:
    response = cluster.core.list_namespaced_pod(namespace, watch=True, resource_version="1", timeout_seconds=2,
                                                _preload_content=False)
    first = json.loads(response.readline() or b"{}")
    response.release_conn()
    assert first["type"] == "ERROR" and first["object"]["code"] == 410 \
        and first["object"]["reason"] in ("Expired", "Gone")


def test_eviction_honours_a_disruption_budget(cluster: ClusterUnderTest, namespace: str) -> None:
    cluster.deploy(namespace, "web", replicas=2, budget={"minAvailable": 2})
    pods = cluster.wait_ready(namespace, "web", 2)
    cluster.wait(lambda: (cluster.policy.read_namespaced_pod_disruption_budget("web", namespace)
                          .status.expected_pods or 0) == 2,
                 20, "the budget's status")
    name = pods[0]["metadata"]["name"]
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
    with pytest.raises(ApiException) as refused:
        cluster.core.create_namespaced_pod_eviction(name, namespace, body)
    said = status(refused.value)
    assert refused.value.status == 429 and said["reason"] == "TooManyRequests"
    assert "disruption budget" in said["message"]
    assert any(c["reason"] == "DisruptionBudget" and "web" in c["message"] for c in said["details"]["causes"])

    cluster.policy.patch_namespaced_pod_disruption_budget("web", namespace, {"spec": {"minAvailable": 1}})
    cluster.wait(lambda: (cluster.policy.read_namespaced_pod_disruption_budget("web", namespace)
                          .status.disruptions_allowed or 0) == 1,
                 20, "a disruption to be allowed")
    response = cluster.core.create_namespaced_pod_eviction(name, namespace, body, _preload_content=False)
    assert response.status in (200, 201)
    cluster.wait(lambda: name not in {p["metadata"]["name"] for p in cluster.pods(namespace, "web")}, 30,
                 "the evicted pod to go")


def test_a_service_account_may_do_only_what_its_role_allows(cluster: ClusterUnderTest, namespace: str) -> None:
    from chaos.k8s.rbac import Rule

    cluster.deploy(namespace, "web", replicas=1, service=False)
    config = cluster.runner_kubeconfig(namespace, [Rule("", "pods", ("list",), "test")])
    from clusters import _client

    runner = client.CoreV1Api(_client(config))
    assert runner.list_namespaced_pod(namespace).items is not None
    with pytest.raises(ApiException) as denied:
        runner.delete_namespaced_pod("anything", namespace)
    said = status(denied.value)
    assert denied.value.status == 403 and said["reason"] == "Forbidden"
    assert 'cannot delete resource "pods"' in said["message"] and f'namespace "{namespace}"' in said["message"]


@fake_only
def test_a_pod_is_a_real_process_that_a_delete_ends(cluster: ClusterUnderTest, namespace: str) -> None:
    cluster.deploy(namespace, "web", replicas=1, grace_s=0, service=False)
    (pod,) = cluster.wait_ready(namespace, "web", 1)
    ip = pod["status"]["podIP"]
    assert ip.startswith("127.") and ip != "127.0.0.1"
    socket.create_connection((ip, 8000), timeout=2).close()  # the server answers on the pod IP
    cluster.core.delete_namespaced_pod(pod["metadata"]["name"], namespace, grace_period_seconds=0)

    def refused() -> bool:
        try:
            socket.create_connection((ip, 8000), timeout=0.5).close()
            return False
        except OSError:
            return True

    cluster.wait(refused, 10, "the deleted pod's process to stop listening")


# A first process that exits on SIGTERM; the plain mock has no handler (a bare `python` as PID 1).
HANDLED_POD = ["python", "-c", "import os, signal, sys; signal.signal(signal.SIGTERM, lambda *a: os._exit(0)); "
               "from chaos.load.mock import main; main(sys.argv[1:])", *MOCK_POD[3:]]


def answers(ip: str) -> bool:
    try:
        socket.create_connection((ip, 8000), timeout=0.5).close()
        return True
    except OSError:
        return False


@fake_only  # the pods' IPs: reached here only on the fake
def test_a_first_process_without_a_sigterm_handler_lives_out_its_grace(cluster: ClusterUnderTest,
                                                                       namespace: str) -> None:
    """A real kubelet signals only the container's first process, PID 1 of its namespace, which the
    kernel spares a signal it has no handler for: a grace-0 delete left it answering 2.0 s more (the
    kubelet's minimum grace), then SIGKILL. One that handles SIGTERM goes at once."""
    cluster.deploy(namespace, "plain", replicas=1, grace_s=0, service=False)
    cluster.deploy(namespace, "handled", replicas=1, grace_s=0, service=False, command=HANDLED_POD)
    (plain,), (handled,) = cluster.wait_ready(namespace, "plain", 1), cluster.wait_ready(namespace, "handled", 1)
    for pod in (plain, handled):
        cluster.core.delete_namespaced_pod(pod["metadata"]["name"], namespace, grace_period_seconds=0)
    deleted = time.monotonic()
    time.sleep(0.8)
    assert answers(plain["status"]["podIP"])  # still serving after its pod left the API
    cluster.wait(lambda: not answers(handled["status"]["podIP"]), 1.0, "the handled pod's process to exit")
    cluster.wait(lambda: not answers(plain["status"]["podIP"]), 6, "the plain pod's process to be killed")
    assert time.monotonic() - deleted >= 1.8  # at the end of the kubelet's 2 s minimum grace


# A container that exits 1 s after it starts, every time.
CRASHING = ["python", "-c", "import sys, time; time.sleep(1.0); sys.exit(1)"]


@fake_only  # the fake counts a restart at the crash, a real kubelet at the new start
def test_a_crashed_container_restarts_at_once_then_waits(cluster: ClusterUnderTest, namespace: str) -> None:
    """A real kubelet restarted a crashed container at once, then after ~10 s and ~20 s."""
    cluster.deploy(namespace, "web", replicas=1, command=CRASHING, service=False)

    def restarts() -> int:
        statuses = [(p["status"].get("containerStatuses") or [{}])[0] for p in cluster.pods(namespace, "web")]
        return max((int(s.get("restartCount", 0)) for s in statuses), default=0)

    created = time.monotonic()
    cluster.wait(lambda: restarts() >= 2, 8, "a second crash: the first was restarted at once")
    assert time.monotonic() - created < 8
    time.sleep(2.5)
    assert restarts() == 2  # then the back-off: not restarted at once again
    (pod,) = cluster.pods(namespace, "web")
    assert pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "CrashLoopBackOff"


async def test_a_malformed_selector_is_a_400_and_the_client_says_so(cluster: ClusterUnderTest, namespace: str) -> None:
    """A real API server answers a selector it cannot parse with 400 BadRequest, never an empty list."""
    from chaos.k8s.client import KubeApi
    from chaos.model.errors import SetupFailed

    for selector in ({"label_selector": "app=a b"}, {"field_selector": "status.phase"},
                     {"label_selector": "app in (a b)", "watch": True, "timeout_seconds": 1}):
        with pytest.raises(ApiException) as bad:
            cluster.core.list_namespaced_pod(namespace, **selector)
        assert bad.value.status == 400 and status(bad.value)["reason"] == "BadRequest", selector
    api = await KubeApi.connect(str(cluster.kubeconfig))
    try:
        with pytest.raises(SetupFailed) as refused:
            await api.list_pods(namespace, {"app": "a b"})  # validation keeps these out of experiments
    finally:
        await api.close()
    said = str(refused.value)
    assert said.startswith(f"the API server rejected list pods in namespace {namespace} as a bad request (400 ")
    assert "a b" in said


def test_the_generated_role_reads_only_the_service_its_experiment_names(cluster: ClusterUnderTest,
                                                                        namespace: str) -> None:
    from clusters import _client, kube_experiment

    from chaos.k8s.manifests import experiment_rules

    for name in ("web", "billing"):
        cluster.core.create_namespaced_service(namespace, {
            "metadata": {"name": name}, "spec": {"selector": {"app": name}, "ports": [{"port": 8000}]}})
    config = cluster.runner_kubeconfig(namespace, experiment_rules(kube_experiment(namespace), in_cluster=False))
    runner = client.CoreV1Api(_client(config))
    assert runner.read_namespaced_service("web", namespace).spec.selector == {"app": "web"}
    for refused in (lambda: runner.read_namespaced_service("billing", namespace),
                    lambda: runner.list_namespaced_service(namespace)):
        with pytest.raises(ApiException) as denied:
            refused()
        assert denied.value.status == 403 and status(denied.value)["reason"] == "Forbidden"
