"""The Kubernetes manifests for staging game-days: valid objects, valid experiments, least privilege.

Offline only: kubernetes-validate ships the API schemas in its wheel, so nothing here reaches a
network or a cluster.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

try:
    import kubernetes_validate
except ImportError as exc:  # a collection error that says what to do, not a bare ModuleNotFoundError
    raise ImportError(
        "tests/test_manifests.py needs kubernetes-validate (offline Kubernetes schema validation); it is in the"
        " dev extra: pip install -e '.[dev]'  (or: pip install kubernetes-validate)"
    ) from exc

import faults  # registers the fault kinds the embedded experiments use
import sla  # registers the SLA kinds
from chaos.experiment import Experiment, parse_experiment
from chaos.model.errors import ExperimentInvalid

if getattr(faults, "__file__", None) is None or getattr(sla, "__file__", None) is None:
    # tests/faults and tests/sla have no __init__.py: with tests/ first on sys.path (the bare `pytest`
    # script and an editable install) they import as empty namespace packages and no kind registers
    raise ImportError(
        "the real faults/sla packages are shadowed by tests/faults and tests/sla; run `python -m pytest`"
        " (puts the repository root first) or set pythonpath = ['.'] in [tool.pytest.ini_options]"
    )

pytestmark = pytest.mark.timeout(60)

MANIFESTS = Path(__file__).resolve().parents[1] / "manifests"
# Oldest version we promise (native-sidecar beta, TZ= in schedule rejected) and the current stable one.
KUBE_VERSIONS = ("1.29", "1.33")
NOT_KUBERNETES_API = {"Kustomization"}  # kustomize's own file: no API schema, checked separately
GPU_JOB = "streamchaos-gpu-throttle"


def _load() -> list[tuple[str, int, dict[str, Any]]]:
    found = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text(encoding="utf-8"))):
            if doc is not None:
                found.append((path.name, i, doc))
    return found


DOCS = _load()
OBJECTS = [(f, i, d) for f, i, d in DOCS if d["kind"] not in NOT_KUBERNETES_API]


def _id(item: tuple[str, int, dict[str, Any]]) -> str:
    return f"{item[0]}#{item[1]}:{item[2]['kind']}/{item[2]['metadata']['name']}"


def _one(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for _, _, d in OBJECTS if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


WORKLOAD_KINDS = ("CronJob", "Job", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Pod")


def _pod_template(doc: dict[str, Any]) -> dict[str, Any]:
    """The pod (metadata and spec) a workload runs."""
    if doc["kind"] == "Pod":
        return doc
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]
    return doc["spec"]["template"]


WORKLOADS = [(f, i, d) for f, i, d in OBJECTS if d["kind"] in WORKLOAD_KINDS]
POD_KILL_JOB = "streamchaos-pod-kill"
# The pods that run an experiment: (kind, name, ConfigMap, key, --out).
RUNNERS = (
    ("CronJob", "streamchaos-gameday", "streamchaos-experiments", "gameday.yaml", "/runs/gameday"),
    ("Job", GPU_JOB, "streamchaos-gpu-experiment", "gpu-throttle.yaml", "/runs/gpu"),
    ("Job", POD_KILL_JOB, "streamchaos-pod-kill", "pod-kill.yaml", "/runs/pod-kill"),
    ("Job", "streamchaos-sharded-gameday", "streamchaos-sharded-experiment", "sharded-gameday.yaml", "/runs/sharded"),
)


def _experiments() -> dict[str, tuple[str, str]]:
    """Every experiment embedded in a ConfigMap: {configmap/key: (text, pseudo filename)}."""
    out = {}
    for name, _, doc in OBJECTS:
        if doc["kind"] == "ConfigMap":
            for key, text in doc.get("data", {}).items():
                if key.endswith((".yaml", ".yml")):
                    out[f"{doc['metadata']['name']}/{key}"] = (text, f"manifests/{name}:{key}")
    return out


def _parse(key: str) -> Experiment:
    text, filename = _experiments()[key]
    try:
        return parse_experiment(text, filename=filename)
    except ExperimentInvalid as exc:
        pytest.fail(f"{key} is not a valid experiment:\n" + "\n".join(str(p) for p in exc.problems))


# -- every object is a valid Kubernetes object --------------------------------------------------------------


def test_the_manifests_are_there() -> None:
    names = {p.name for p in MANIFESTS.glob("*.yaml")}
    assert {"rbac.yaml", "toxiproxy.yaml", "gameday-configmap.yaml", "cronjob.yaml", "gpu-throttle-job.yaml",
            "load-shards.yaml", "demo-stack.yaml", "pod-kill-job.yaml"} <= names
    assert (MANIFESTS / "README.md").is_file()


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("item", OBJECTS, ids=_id)
def test_object_validates_strictly(item: tuple[str, int, dict[str, Any]], version: str) -> None:
    name, index, doc = item
    try:
        used = kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path) or "(top level)"
        pytest.fail(f"{name} document {index} ({doc['kind']}) is invalid for Kubernetes {version} at {where}: "
                    f"{exc.message}")
    assert used.startswith(version), f"validated against schema {used}, not {version}"


def test_strict_validation_does_catch_a_typo() -> None:
    """Guards the test above: a validator that silently passed everything would prove nothing."""
    cronjob = copy.deepcopy(_one("CronJob", "streamchaos-gameday"))
    cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(cronjob, KUBE_VERSIONS[0], strict=True)


def test_kustomization_lists_the_game_day_but_not_the_privileged_job() -> None:
    (kustomization,) = [d for _, _, d in DOCS if d["kind"] == "Kustomization"]
    resources = kustomization["resources"]
    assert set(resources) == {"rbac.yaml", "toxiproxy.yaml", "gameday-configmap.yaml", "cronjob.yaml"}
    assert all((MANIFESTS / r).is_file() for r in resources)
    assert "gpu-throttle-job.yaml" not in resources  # opt-in, applied by hand
    assert "load-shards.yaml" not in resources  # opt-in too: it needs its Secret first


def test_everything_is_namespace_scoped_and_unpinned() -> None:
    for name, _, doc in OBJECTS:
        assert not doc["kind"].startswith("Cluster"), f"{name}: {doc['kind']} is cluster-wide"
        assert doc["kind"] not in ("Namespace", "PersistentVolume", "StorageClass"), f"{name}: {doc['kind']}"
        assert "namespace" not in doc["metadata"], (f"{name}: {doc['kind']} pins a namespace; "
                                                    "kubectl -n / kustomize sets it")


# -- the experiments in the ConfigMaps ------------------------------------------------------------------------


def test_every_embedded_experiment_parses() -> None:
    assert set(_experiments()) == {"streamchaos-experiments/gameday.yaml",
                                   "streamchaos-gpu-experiment/gpu-throttle.yaml",
                                   "streamchaos-sharded-experiment/sharded-gameday.yaml",
                                   "streamchaos-pod-kill/pod-kill.yaml"}
    for key in _experiments():
        _parse(key)


def test_game_day_experiment() -> None:
    e = _parse("streamchaos-experiments/gameday.yaml")
    assert e.target.kind == "openai" and e.target.url == "http://vllm:8000/v1"
    assert e.proxy.enabled and e.proxy.server == "external" and e.proxy.url == "http://vllm-toxic:8474"
    assert e.load.concurrency == 16
    assert [p.name for p in e.phases] == ["baseline", "disconnect-storm", "network-jitter", "recovery"]
    assert [f.kind for f in e.phase("disconnect-storm").faults] == ["client.disconnect"]
    assert [f.kind for f in e.phase("network-jitter").faults] == ["network.latency"]
    assert not e.phase("baseline").faults and not e.phase("recovery").faults
    assert {"ttft", "itl", "early_close", "kv_cleanup", "errors", "recovery"} <= {s.kind for s in e.sla}
    assert e.safety.allow_gpu_clock_changes is False
    # it must end well before the Job's hard stop
    cronjob = _one("CronJob", "streamchaos-gameday")
    assert e.safety.max_duration < cronjob["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"]
    assert e.duration + e.safety.drain_timeout + e.safety.cleanup_window <= e.safety.max_duration


def test_only_the_gpu_job_may_change_gpu_clocks() -> None:
    for key in _experiments():
        e = _parse(key)
        uses_nvml = any(f.kind.startswith("gpu.") for p in e.phases for f in p.faults)
        assert e.safety.allow_gpu_clock_changes is (key == "streamchaos-gpu-experiment/gpu-throttle.yaml"), key
        assert uses_nvml is e.safety.allow_gpu_clock_changes, key
    e = _parse("streamchaos-gpu-experiment/gpu-throttle.yaml")
    (fault,) = e.phase("throttle").faults
    assert fault.kind == "gpu.throttle" and fault.params["backend"] == "nvml"
    job = _one("Job", GPU_JOB)
    assert e.safety.max_duration < job["spec"]["activeDeadlineSeconds"]


def test_the_pods_run_the_experiments_their_configmaps_hold() -> None:
    for kind, name, configmap, key, out in RUNNERS:
        pod = _pod_template(_one(kind, name))["spec"]
        (container,) = pod["containers"]
        command = " ".join(container.get("command", []) + container.get("args", []))
        assert f"streamchaos run /experiments/{key} --out {out}" in command or (
            container["command"] == ["streamchaos"]
            and container["args"] == ["run", f"/experiments/{key}", "--out", out]
        ), f"{name}: {command}"
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts["/experiments"]["readOnly"] is True
        assert volumes[mounts["/experiments"]["name"]]["configMap"]["name"] == configmap
        assert key in _one("ConfigMap", configmap)["data"]
        assert "emptyDir" in volumes[mounts["/runs"]["name"]]  # writable, since the root filesystem is not
        assert pod["restartPolicy"] == "Never"
    gpu = " ".join(_pod_template(_one("Job", GPU_JOB))["spec"]["containers"][0]["args"])
    assert "streamchaos rollback /runs/gpu" in gpu and "exit $rc" in gpu  # unconditional, keeps the run's exit code


def test_every_embedded_experiment_is_allowed_exactly_the_services_it_names() -> None:
    """Without safety.allowed_targets a remote target is refused; with it, only what the file names."""
    from chaos.model.allowlist import experiment_reach, refusals

    for key in _experiments():
        e = _parse(key)
        assert e.safety.allowed_targets is not None, key
        assert refusals(experiment_reach(e, environ={}), e.safety.allowed_targets) == [], key
        assert refusals(experiment_reach(e, "http://vllm-prod:8000/v1", environ={}), e.safety.allowed_targets), key


# -- scale-out load ---------------------------------------------------------------------------------------------


def test_the_sharded_game_day_wiring() -> None:
    """Counts, names, ports and the token that must agree between the experiment, the two Jobs and the Service."""
    e = _parse("streamchaos-sharded-experiment/sharded-gameday.yaml")
    assert e.load.shards == 4 and e.load.shard_launch == "external" and e.load.workers == 1
    coordinator, shards = _one("Job", "streamchaos-sharded-gameday"), _one("Job", "streamchaos-load-shards")
    spec = shards["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == e.load.shards
    assert spec["backoffLimit"] == 0 and coordinator["spec"]["backoffLimit"] == 0
    (shard,) = _pod_template(shards)["spec"]["containers"]
    args = shard["args"]
    assert shard["command"] == ["streamchaos"] and args[0] == "shard" and "--index" not in args  # JOB_COMPLETION_INDEX
    assert int(args[args.index("--count") + 1]) == e.load.shards
    assert float(args[args.index("--connect-timeout") + 1]) >= e.load.shard_connect_timeout

    service = _one("Service", "streamchaos-coordinator")
    host, port = args[args.index("--coordinator") + 1].split(":")
    (service_port,) = service["spec"]["ports"]
    assert host == service["metadata"]["name"] \
        and int(port) == service_port["port"] == int(e.load.shard_listen.split(":")[1])
    pod = _pod_template(coordinator)
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (runner,) = pod["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in runner["ports"]}[service_port["targetPort"]] == service_port["port"]
    assert e.load.shard_listen.startswith("0.0.0.0:")  # reachable from the shard pods

    def token(container: dict[str, Any]) -> dict[str, Any]:
        (env,) = [v for v in container["env"] if v["name"] == "STREAMCHAOS_SHARD_TOKEN"]
        return dict(env["valueFrom"]["secretKeyRef"])

    assert token(runner) == token(shard) == {"name": "streamchaos-shard-token", "key": "token"}
    # created by hand, never shipped
    assert "streamchaos-shard-token" not in {d["metadata"]["name"] for _, _, d in OBJECTS}

    policy = _one("NetworkPolicy", "streamchaos-coordinator")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (rule,) = policy["spec"]["ingress"]
    shard_labels = _pod_template(shards)["metadata"]["labels"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": shard_labels["app.kubernetes.io/name"]}}}]
    assert [p["port"] for p in rule["ports"]] == [service_port["port"]]
    assert shard_labels["app.kubernetes.io/name"] != "streamchaos"  # shards are not admitted to the Toxiproxy API

    assert e.safety.max_duration < coordinator["spec"]["activeDeadlineSeconds"] <= spec["activeDeadlineSeconds"]
    needed = 1 + e.duration + e.safety.drain_timeout + e.safety.cleanup_window + e.load.shard_connect_timeout
    assert needed <= e.safety.max_duration


# -- the scheduled game-day ------------------------------------------------------------------------------------


def test_cronjob_schedule_and_job_bounds() -> None:
    cronjob = _one("CronJob", "streamchaos-gameday")
    spec = cronjob["spec"]
    assert len(spec["schedule"].split()) == 5 and "TZ" not in spec["schedule"]
    assert spec["timeZone"] == "Etc/UTC"
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["startingDeadlineSeconds"] > 0
    assert spec["successfulJobsHistoryLimit"] >= 1 and spec["failedJobsHistoryLimit"] >= 1
    job = spec["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0 and job["activeDeadlineSeconds"] > 0 and job["ttlSecondsAfterFinished"] > 0
    (container,) = job["template"]["spec"]["containers"]
    assert container["image"] == "streamchaos:latest"
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    assert container["resources"]["limits"]["memory"]


def test_the_wiring_between_objects_holds() -> None:
    """Names and labels that must agree across files: a typo here fails only in the cluster."""
    pod = _pod_template(_one("CronJob", "streamchaos-gameday"))
    assert pod["spec"]["serviceAccountName"] == "streamchaos" \
        == _one("ServiceAccount", "streamchaos")["metadata"]["name"]

    deployment = _one("Deployment", "toxiproxy")
    toxi_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["replicas"] == 1  # toxics live in one process
    assert deployment["spec"]["selector"]["matchLabels"].items() <= toxi_labels.items()
    (toxi,) = deployment["spec"]["template"]["spec"]["containers"]
    assert toxi["image"] == "ghcr.io/shopify/toxiproxy:2.12.0" and toxi["args"] == ["-host=0.0.0.0"]
    container_ports = {p["name"]: p["containerPort"] for p in toxi["ports"]}

    service = _one("Service", "vllm-toxic")
    assert service["spec"]["selector"].items() <= toxi_labels.items()
    ports = {p["port"]: container_ports[p["targetPort"]] for p in service["spec"]["ports"]}
    assert ports[8474] == 8474 and 8000 in ports

    e = _parse("streamchaos-experiments/gameday.yaml")
    api = urlsplit(e.proxy.url)
    assert (api.hostname, api.port) == ("vllm-toxic", 8474)

    policy = _one("NetworkPolicy", "toxiproxy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= toxi_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    api_rules = [r for r in policy["spec"]["ingress"] if any(p["port"] == 8474 for p in r["ports"])]
    assert api_rules, "the NetworkPolicy must say who may reach the Toxiproxy API"
    for rule in api_rules:
        assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "streamchaos"}}}]
    assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == "streamchaos"  # the runner is admitted
    gpu_labels = _pod_template(_one("Job", GPU_JOB))["metadata"]["labels"]
    assert gpu_labels["app.kubernetes.io/name"] != "streamchaos"  # the privileged pod is not


def test_the_pod_kill_game_day_targets_the_demo_stack() -> None:
    """experiments/pod-kill.yaml and its in-cluster copy target the demo Deployment, through a Service
    port that exists, with a budget that a delete ignores and an eviction would honour."""
    from chaos.experiment import load_experiment

    shipped = load_experiment(MANIFESTS.parent / "experiments" / "pod-kill.yaml")
    embedded = _parse("streamchaos-pod-kill/pod-kill.yaml")
    assert embedded.target.kubernetes.namespace is None and shipped.target.kubernetes.namespace == "streamchaos-demo"
    for e in (shipped, embedded):
        assert (e.target.kind, e.target.kubernetes.service, e.target.kubernetes.port) \
            == ("kubernetes", "streamchaos-demo", "http")
        assert [f.kind for f in e.phase("kill").faults] == ["k8s.pod_kill"] \
            and e.phase("kill").faults[0].params["grace_period"] == 0
    # the in-cluster copy is the shipped experiment but for the namespace
    assert [(p.name, p.duration, p.faults) for p in embedded.phases] \
        == [(p.name, p.duration, p.faults) for p in shipped.phases]
    assert embedded.sla == shipped.sla and embedded.load == shipped.load
    assert _parse("streamchaos-pod-kill/pod-kill.yaml").safety.max_duration \
        < _one("Job", POD_KILL_JOB)["spec"]["activeDeadlineSeconds"]

    deployment, service, budget = (_one(kind, "streamchaos-demo")
                                   for kind in ("Deployment", "Service", "PodDisruptionBudget"))
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items() \
        and budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert port["name"] == "http" and port["targetPort"] in {p["name"] for p in container["ports"]}
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert deployment["spec"]["replicas"] == 3 and budget["spec"]["maxUnavailable"] == 1


# -- least privilege -------------------------------------------------------------------------------------------


_PACKAGES = ("chaos", "faults", "sla")
_KUBERNETES_CLIENTS = ("import kubernetes", "from kubernetes", "kubectl", "import kr8s", "from kr8s", "lightkube")
# The rooms whose Kubernetes API calls are declared as rules (chaos.k8s.rbac.target_rules, Fault.rbac_rules),
# from which `streamchaos manifests rbac` generates every Role. A caller elsewhere would be undeclared.
DECLARED_CALLERS = ("chaos/k8s/", "chaos/targets/kubernetes", "faults/k8s.py")  # the Kubernetes target and its dry run


def test_only_modules_whose_calls_are_declared_use_a_kubernetes_client() -> None:
    root = MANIFESTS.parent
    callers = sorted(
        str(path.relative_to(root))
        for package in _PACKAGES
        for path in (root / package).rglob("*.py")
        if any(client in path.read_text(encoding="utf-8") for client in _KUBERNETES_CLIENTS)
    )
    assert callers and all(c.startswith(DECLARED_CALLERS) for c in callers), callers


def _runner_experiments() -> dict[str, tuple[str, Experiment]]:
    """The ServiceAccount each experiment-running pod uses ("default" when none) and its experiment,
    by workload name."""
    out = {}
    for kind, name, configmap, key, _ in RUNNERS:
        spec = _pod_template(_one(kind, name))["spec"]
        out[name] = (spec.get("serviceAccountName", "default"), _parse(f"{configmap}/{key}"))
    return out


def _rules(role: dict[str, Any]) -> list[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    return [(g, r, tuple(rule["verbs"]), tuple(rule.get("resourceNames") or ())) for rule in role.get("rules") or []
            for g in rule["apiGroups"] for r in rule["resources"]]


def test_each_role_is_what_the_generator_makes_for_the_experiment_its_account_runs() -> None:
    """RBAC grants exactly what the shipped code calls for the experiment that runs with it: each Role in
    these files equals `streamchaos manifests rbac` for that experiment, rule for rule, and no Role is
    left over. (tests/k8s run every fault with exactly these generated rules against an API server that
    enforces them, so they are also enough.)"""
    from chaos.k8s.manifests import rbac_documents

    roles = {d["metadata"]["name"]: d for _, _, d in OBJECTS if d["kind"] == "Role"}
    bindings = {d["metadata"]["name"]: d for _, _, d in OBJECTS if d["kind"] == "RoleBinding"}
    accounts = {d["metadata"]["name"] for _, _, d in OBJECTS if d["kind"] == "ServiceAccount"}
    expected_roles = set()
    for workload, (account, experiment) in _runner_experiments().items():
        generated = {d["kind"]: d for d in rbac_documents(experiment, name=account, in_cluster=True)}
        if "Role" not in generated:
            assert account not in roles, (f"{workload}: its experiment calls no Kubernetes API, "
                                          f"yet Role {account} grants {roles[account]}")
            continue
        assert account in accounts, f"{workload} runs as {account}, which these files do not create"
        assert _rules(roles[account]) == _rules(generated["Role"]), (f"{workload}: Role {account} differs from "
                                                                     "the generated one")
        binding = bindings[account]
        assert binding["roleRef"] == generated["RoleBinding"]["roleRef"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
        expected_roles.add(account)
    assert set(roles) == expected_roles, f"Roles no experiment needs: {set(roles) - expected_roles}"
    assert set(bindings) == expected_roles
    kinds = {d["kind"] for _, _, d in OBJECTS}
    assert not {"ClusterRole", "ClusterRoleBinding"} & kinds, "nothing here is cluster-wide"
    for _, _, doc in OBJECTS:
        for rule in doc.get("rules") or []:
            assert set(rule) <= {"apiGroups", "resources", "resourceNames", "verbs"}, f"unexpected rule keys: {rule}"
            for field in ("apiGroups", "resources", "verbs"):
                assert all("*" not in value for value in rule[field]), f"wildcard in {field}: {rule}"
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule
            assert not {"secrets", "pods/exec"} & set(rule["resources"]), rule


def test_the_pod_kill_role_grants_a_delete_and_the_game_day_account_nothing() -> None:
    """Guards the comparison above against a generator that returned nothing for everyone."""
    roles = {d["metadata"]["name"]: d for _, _, d in OBJECTS if d["kind"] == "Role"}
    assert ("", "pods", ("delete", "list", "watch"), ()) in _rules(roles["streamchaos-pod-kill"])
    assert "streamchaos" not in roles


def test_service_account_tokens_are_mounted_only_where_needed() -> None:
    from chaos.k8s.manifests import experiment_rules

    for _, _, doc in OBJECTS:
        if doc["kind"] == "ServiceAccount":
            assert doc["automountServiceAccountToken"] is False, doc["metadata"]["name"]
    runners = _runner_experiments()
    for name, _, doc in WORKLOADS:
        spec = _pod_template(doc)["spec"]
        workload = doc["metadata"]["name"]
        # a token only in a pod whose experiment calls the Kubernetes API
        wants_token = workload in runners and bool(experiment_rules(runners[workload][1], in_cluster=True))
        assert spec.get("automountServiceAccountToken") is wants_token, f"{name}: {doc['kind']}/{workload}"
        if workload not in runners or workload == GPU_JOB:
            assert "serviceAccountName" not in spec, f"{name}: only the game-day runners use a streamchaos account"
    assert runners[POD_KILL_JOB][0] == "streamchaos-pod-kill" and runners["streamchaos-gameday"][0] == "streamchaos"


def _privileges(doc: dict[str, Any]) -> list[str]:
    """Everything in a workload's pod that asks for more than the Pod Security 'restricted' profile allows."""
    spec = _pod_template(doc)["spec"]
    found = [f"spec.{k}" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    found += [f"volume {v['name']}: hostPath" for v in spec.get("volumes", []) if "hostPath" in v]
    pod_sc = spec.get("securityContext", {})
    for container in spec.get("initContainers", []) + spec["containers"]:
        sc = {**pod_sc, **container.get("securityContext", {})}
        where = container["name"]
        if sc.get("privileged"):
            found.append(f"{where}: privileged")
        if sc.get("runAsUser") == 0 or sc.get("runAsNonRoot") is not True:
            found.append(f"{where}: may run as root")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{where}: allowPrivilegeEscalation")
        caps = sc.get("capabilities", {})
        if caps.get("drop") != ["ALL"]:
            found.append(f"{where}: does not drop ALL capabilities")
        found += [f"{where}: adds {cap}" for cap in caps.get("add", [])]
        if sc.get("readOnlyRootFilesystem") is not True:
            found.append(f"{where}: writable root filesystem")
        if sc.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
            found.append(f"{where}: no seccomp profile")
        found += [f"{where}: hostPort" for p in container.get("ports", []) if "hostPort" in p]
    return found


@pytest.mark.parametrize("item", WORKLOADS, ids=_id)
def test_only_the_gpu_job_is_privileged(item: tuple[str, int, dict[str, Any]]) -> None:
    name, _, doc = item
    found = _privileges(doc)
    if doc["metadata"]["name"] == GPU_JOB:
        # root plus CAP_SYS_ADMIN for NVML clock locks, and nothing else
        assert sorted(found) == sorted([
            "gpu-throttle: may run as root", "gpu-throttle: allowPrivilegeEscalation", "gpu-throttle: adds SYS_ADMIN",
        ])
        # the API server refuses allowPrivilegeEscalation: false together with SYS_ADMIN
        assert _pod_template(doc)["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is True
    else:
        assert found == [], f"{name}: {doc['kind']}/{doc['metadata']['name']} asks for {found}"


def test_the_game_day_pod_is_restricted() -> None:
    pod = _pod_template(_one("CronJob", "streamchaos-gameday"))["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = pod["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}


def test_the_gpu_job_is_pinned_to_one_node() -> None:
    spec = _pod_template(_one("Job", GPU_JOB))["spec"]
    assert "kubernetes.io/hostname" in spec.get("nodeSelector", {}) or spec.get("nodeName")
    job = _one("Job", GPU_JOB)["spec"]
    assert job["backoffLimit"] == 0  # a retry would lock the clocks again
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "nvidia.com/gpu" not in str(spec["containers"][0]["resources"])  # would allocate another GPU than vLLM's
