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
from clusters import ClusterUnderTest, fake_only
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
