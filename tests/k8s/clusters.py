"""The cluster the Kubernetes tests run against: the fake API server, or a real cluster.

``STREAMCHAOS_TEST_KUBECONFIG=/path/to/kubeconfig`` runs the same tests against a real cluster
(kind, k3s): every test works in its own namespace (``streamchaos-test-...``, deleted afterwards),
its pods run ``STREAMCHAOS_TEST_IMAGE`` (default ``streamchaos:latest``, built from the Dockerfile and
loaded into the cluster: ``kind load docker-image streamchaos:latest``), and the runner acts as a
ServiceAccount granted exactly the Role ``streamchaos manifests rbac`` generates, through a token from
the TokenRequest API. Without it, the fake API server (``fake_apiserver.py``) is started once per
session, and the same calls set up the same objects there.

Everything here goes through the official client, so nothing differs between the two but the
server: the fake's pods are local processes, a real cluster's are containers.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaos.host.children import first_line, spawn
from chaos.k8s.rbac import Rule

HERE = Path(__file__).resolve().parent
REAL_KUBECONFIG = os.environ.get("STREAMCHAOS_TEST_KUBECONFIG", "").strip()
IMAGE = os.environ.get("STREAMCHAOS_TEST_IMAGE", "streamchaos:latest")

fake_only = pytest.mark.skipif(bool(REAL_KUBECONFIG), reason="needs the fake's loopback pod addresses or its processes")
# the fake's timings set per object by annotation (schedule delay, budget sync, namespace finalizing)
fake_timings = pytest.mark.skipif(bool(REAL_KUBECONFIG),
                                  reason="sets the fake's scheduler, disruption-controller or finalizer timings")

# A light pod (no torch): the loopback mock speaks OpenAI streaming, /health and /metrics.
MOCK_POD = ["python", "-m", "chaos.load.mock", "--host", "0.0.0.0", "--port", "8000", "--tick", "0.02"]
# The builtin stack as a pod (the tiny model on CPU), as manifests/demo-stack.yaml runs it.
STACK_POD = ["streamchaos", "stack", "serve", "--host", "0.0.0.0", "--port", "8000", "--model", "tiny",
             "--device", "cpu"]


def _client(kubeconfig: Path) -> Any:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration, persist_config=False)
    return client.ApiClient(configuration)


@dataclass
class ClusterUnderTest:
    """One API server for the session; ``admin`` is a sync ``ApiClient`` with every right."""

    kubeconfig: Path
    real: bool
    workdir: Path
    process: subprocess.Popen[bytes] | None = None
    namespaces: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.admin = _client(self.kubeconfig)
        from kubernetes import client

        self.core = client.CoreV1Api(self.admin)
        self.apps = client.AppsV1Api(self.admin)
        self.policy = client.PolicyV1Api(self.admin)
        self.rbac = client.RbacAuthorizationV1Api(self.admin)

    # -- namespaces ------------------------------------------------------------------------------------
    def new_namespace(self, prefix: str = "streamchaos-test") -> str:
        name = f"{prefix}-{secrets.token_hex(3)}"
        self.core.create_namespace({"metadata": {"name": name,
                                                 "labels": {"app.kubernetes.io/part-of": "streamchaos-tests"}}})
        self.namespaces.append(name)
        return name

    def delete_namespace(self, name: str) -> None:
        with contextlib.suppress(Exception):
            self.core.delete_namespace(name)

    # -- workloads ---------------------------------------------------------------------------------------
    def deploy(self, namespace: str, name: str, *, replicas: int = 3, command: Sequence[str] = MOCK_POD,
               grace_s: int = 2, budget: dict[str, Any] | None = None, service: bool = True,
               annotations: dict[str, str] | None = None, probe_path: str = "/health") -> None:
        """A Deployment of ``replicas`` pods running ``command`` on port 8000 (named ``http``), its Service,
        and optionally a PodDisruptionBudget (``{"minAvailable": 3}``). ``annotations`` go on the pod
        template (the fake's timings: ``fake_apiserver.SCHEDULE_DELAY``...; a real cluster ignores them)."""
        labels = {"app": name}
        container = {
            "name": "server", "image": IMAGE, "imagePullPolicy": "IfNotPresent", "command": list(command),
            "ports": [{"name": "http", "containerPort": 8000}],
            "readinessProbe": {"httpGet": {"path": probe_path, "port": "http"}, "periodSeconds": 1,
                               "failureThreshold": 1},
            "env": [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONUNBUFFERED", "value": "1"}],
        }
        self.apps.create_namespaced_deployment(namespace, {
            "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels,
                                               **({"annotations": annotations} if annotations else {})},
                                  "spec": {"containers": [container], "terminationGracePeriodSeconds": grace_s,
                                           "automountServiceAccountToken": False}}},
        })
        if service:
            self.core.create_namespaced_service(namespace, {
                "metadata": {"name": name, "labels": labels},
                "spec": {"selector": labels, "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]},
            })
        if budget is not None:
            self.policy.create_namespaced_pod_disruption_budget(namespace, {
                "metadata": {"name": name}, "spec": {**budget, "selector": {"matchLabels": labels}}})

    def apply(self, namespace: str, documents: list[dict[str, Any]]) -> None:
        """Create manifest objects (Deployment, Service, PodDisruptionBudget) in ``namespace``."""
        creators: dict[str, Callable[[str, dict[str, Any]], Any]] = {
            "Deployment": self.apps.create_namespaced_deployment, "Service": self.core.create_namespaced_service,
            "PodDisruptionBudget": self.policy.create_namespaced_pod_disruption_budget,
        }
        for doc in documents:
            creators[doc["kind"]](namespace, doc)

    def pods(self, namespace: str, app: str) -> list[dict[str, Any]]:
        """The pods labelled ``app=APP`` (or matching ``app`` when it is a whole selector, ``k=v``)."""
        listed = self.core.list_namespaced_pod(namespace, label_selector=app if "=" in app else f"app={app}")
        return [self.admin.sanitize_for_serialization(p) for p in listed.items]

    def ready_pods(self, namespace: str, app: str) -> list[dict[str, Any]]:
        from chaos.k8s.pods import serving

        return [p for p in self.pods(namespace, app) if serving(p)]

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(0.1)

    def wait_ready(self, namespace: str, app: str, count: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        self.wait(lambda: len(self.ready_pods(namespace, app)) == count and len(self.pods(namespace, app)) == count,
                  timeout, f"{count} ready pods of {app} in {namespace}")
        return self.ready_pods(namespace, app)

    def audit(self, user: str | None = None, namespace: str | None = None) -> list[dict[str, str]]:
        """The fake's audit log: every request as {user, verb, resource, namespace, name}, in order (a real
        cluster's is in its audit backend: the tests check it on the fake only)."""
        import urllib.request

        config = yaml.safe_load(self.kubeconfig.read_text(encoding="utf-8"))
        server, token = config["clusters"][0]["cluster"]["server"], config["users"][0]["user"]["token"]
        request = urllib.request.Request(server + "/_fake/audit", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=15) as response:  # noqa: S310 - the fake on loopback
            data = json.loads(response.read())
        return [r for r in data
                if (user is None or r["user"] == user) and (namespace is None or r["namespace"] == namespace)]

    def replicas(self, namespace: str, name: str) -> int:
        return int(self.apps.read_namespaced_deployment_scale(name, namespace).spec.replicas)

    # -- the runner's identity -----------------------------------------------------------------------------
    def runner_kubeconfig(self, namespace: str, rules: Sequence[Rule], name: str = "streamchaos") -> Path:
        """A ServiceAccount with exactly ``rules`` in ``namespace`` (Role + RoleBinding), and a kubeconfig
        that acts as it (a token from the TokenRequest API)."""
        from chaos.k8s.rbac import merge_rules

        self.core.create_namespaced_service_account(namespace, {"metadata": {"name": name},
                                                                "automountServiceAccountToken": False})
        self.rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": [
            {"apiGroups": [r.group], "resources": [r.resource], **({"resourceNames": list(r.names)} if r.names else {}),
             "verbs": list(r.verbs)} for r in merge_rules(rules)]})
        self.rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
        token = self.core.create_namespaced_service_account_token(name, namespace,
                                                                  {"spec": {"expirationSeconds": 3600}}).status.token
        config = yaml.safe_load(self.kubeconfig.read_text(encoding="utf-8"))
        context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
        cluster = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
        runner = {"apiVersion": "v1", "kind": "Config", "current-context": "runner",
                  "clusters": [cluster], "users": [{"name": "runner", "user": {"token": token}}],
                  "contexts": [{"name": "runner",
                                "context": {"cluster": cluster["name"], "user": "runner", "namespace": namespace}}]}
        path = self.workdir / f"runner-{namespace}-{name}.kubeconfig"
        path.write_text(json.dumps(runner), encoding="utf-8")
        path.chmod(0o600)
        return path

    def close(self) -> None:
        for namespace in self.namespaces:
            self.delete_namespace(namespace)
        if self.real:
            return
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()


@contextlib.contextmanager
def open_cluster(workdir: Path) -> Iterator[ClusterUnderTest]:
    """The fake API server in a child process, or the real cluster ``STREAMCHAOS_TEST_KUBECONFIG`` names."""
    if REAL_KUBECONFIG:
        cluster = ClusterUnderTest(Path(REAL_KUBECONFIG), real=True, workdir=workdir)
    else:
        process = spawn([sys.executable, str(HERE / "fake_apiserver.py"), "--dir", str(workdir)],
                        stdout=subprocess.PIPE, stderr=open(workdir / "apiserver.log", "ab"), cwd=HERE.parents[1])
        line = first_line(process, 30.0)
        if not line.startswith("READY"):
            process.kill()
            raise RuntimeError(f"the fake API server did not start: {line!r}; see {workdir / 'apiserver.log'}")
        cluster = ClusterUnderTest(workdir / "kubeconfig", real=False, workdir=workdir, process=process)
    try:
        yield cluster
    finally:
        cluster.close()


async def started_target(cluster: ClusterUnderTest, namespace: str, experiment: Any,
                         rules: Sequence[Rule] | None = None,
                         run_dir: Path | None = None) -> tuple[Any, Any]:
    """The experiment's Kubernetes target started as a runner outside the cluster would (a port-forward
    unless the experiment says otherwise), acting as a ServiceAccount granted ``rules`` (default: what
    ``streamchaos manifests rbac --outside`` generates for it); ``(target, RunContext)``."""
    from dataclasses import replace

    from chaos.k8s.manifests import experiment_rules
    from chaos.model.context import RunContext
    from chaos.targets.kubernetes import KubernetesTarget

    granted = experiment_rules(experiment, in_cluster=False) if rules is None else rules
    kubeconfig = cluster.runner_kubeconfig(namespace, granted, name=f"runner-{secrets.token_hex(3)}")
    kube = replace(experiment.target.kubernetes, kubeconfig=str(kubeconfig), namespace=namespace)
    target = KubernetesTarget(replace(experiment.target, kubernetes=kube), experiment.target.url)
    try:
        await target.start()
    except BaseException:
        await target.stop()  # as the runner's running_target does
        raise
    return target, RunContext(seed=experiment.seed, target=target.info, run_dir=run_dir or cluster.workdir)


def kube_experiment(namespace: str, faults: Sequence[dict[str, Any]] = (), *, access: str = "port-forward",
                    service: str = "web",
                    **target: Any) -> Any:
    """A validated experiment whose target is ``service`` in ``namespace``, with ``faults`` in one phase."""
    from chaos.experiment import experiment_from_dict

    return experiment_from_dict({
        "name": "k8s-test", "seed": 7,
        "target": {"kind": "kubernetes", "startup_timeout": "60s",
                   "kubernetes": {"namespace": namespace, "service": service, "access": access}, **target},
        "phases": [{"name": "fault", "duration": "10s", "faults": list(faults)}],
        "safety": {"allowed_targets": {"namespaces": [namespace]}},
    })
