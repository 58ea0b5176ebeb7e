"""``target.kubernetes`` validated with located errors; how access and ports resolve; the RBAC an
experiment needs, generated from its target and fault kinds, valid and least-privilege. No cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from chaos.experiment import parse_experiment
from chaos.k8s.client import config_source, default_namespace
from chaos.k8s.manifests import experiment_rules, rbac_documents, render_rbac
from chaos.k8s.rbac import Rule, merge_rules
from chaos.model.errors import ExperimentInvalid
from chaos.targets.kubernetes import resolve_access, service_port
from faults.base import REGISTRY

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]


def experiment(target: str, faults: str = "") -> Any:
    text = (f"name: x\ntarget:\n{target}\nphases:\n  - name: p\n    duration: 2s\n"
            + (f"    faults:\n{faults}" if faults else ""))
    return parse_experiment(text, "x.yaml")


def problems(target: str, faults: str = "") -> list[str]:
    with pytest.raises(ExperimentInvalid) as bad:
        experiment(target, faults)
    return [str(p) for p in bad.value.problems]


def test_names_are_checked_as_the_api_server_would_with_their_line() -> None:
    found = problems("  kind: kubernetes\n  kubernetes:\n    namespace: Demo_1\n    service: 9web\n"
                     "    selector: {app: 'a b', 'bad key!': x}\n    port: 70000\n    access: portforward\n")
    assert found == [
        "x.yaml:5:16: target.kubernetes.namespace: expected a namespace name (lowercase letters, digits and '-', "
        "at most 63), found 'Demo_1'",
        "x.yaml:6:14: target.kubernetes.service: expected a Service name (lowercase letters, digits and '-', "
        "starting with a letter, at most 63), found '9web'",
        "x.yaml:7:21: target.kubernetes.selector.app: expected a label value (letters, digits, '-', '_', '.', "
        "at most 63; quote numbers and booleans), found 'a b'",
        "x.yaml:7:28: target.kubernetes.selector.bad key!: expected a label key such as app or "
        "app.kubernetes.io/name, found 'bad key!'",
        "x.yaml:8:11: target.kubernetes.port: expected a port number (1-65535) or a port name such as http, "
        "found 70000",
        "x.yaml:9:13: target.kubernetes.access: expected one of auto, service, endpoints, port-forward, "
        "found 'portforward' (did you mean 'port-forward'?)",
    ]


def test_a_fault_selector_is_checked_at_validation_not_by_the_api_server_mid_run() -> None:
    """A selector the API server would refuse (a 422 on the pod list, after the baseline ran) is
    refused by `validate` with its line, as the target's own selector is."""
    target = "  kind: kubernetes\n  kubernetes: {namespace: demo, service: web}\n"
    fault = "      - kind: k8s.pod_kill\n        selector: {app.kubernetes.io/name: 'a b', 'x/y/z': web, tier: 3}\n"
    assert problems(target, fault) == [
        "x.yaml:11:44: phases[0].faults[0].selector.app.kubernetes.io/name: expected a label value "
        "(letters, digits, '-', '_', '.', at most 63; quote numbers and booleans), found 'a b'",
        "x.yaml:11:60: phases[0].faults[0].selector.x/y/z: expected a label key such as app or "
        "app.kubernetes.io/name, found 'x/y/z'",
        "x.yaml:11:71: phases[0].faults[0].selector.tier: expected a label value (letters, digits, '-', '_', '.', "
        "at most 63; quote numbers and booleans), found 3",
    ]
    ok = experiment(target, "      - kind: k8s.pod_kill\n        selector: {app.kubernetes.io/name: web, tier: '3'}\n")
    assert ok.phases[0].faults[0].selector == (("app.kubernetes.io/name", "web"), ("tier", "3"))


def test_the_pods_must_be_findable() -> None:
    assert problems("  kind: kubernetes\n  kubernetes: {namespace: demo}\n") == [
        "x.yaml:4:15: target.kubernetes: give service (its selector and port find the pods) or selector "
        "(pod labels, with port)"]
    assert problems("  kind: kubernetes\n  kubernetes: {selector: {app: web}}\n") == [
        "x.yaml:4:15: target.kubernetes: with a selector and no service, give port: the container port "
        "(number or name) the pods serve on"]
    assert problems("  kind: kubernetes\n") == [
        "x.yaml:3:3: target: kind kubernetes needs a kubernetes section {namespace, service or selector} "
        "(or a url to reach it by)"]
    assert problems("  kind: builtin\n  kubernetes: {service: web}\n") == [
        "x.yaml:4:3: target.kubernetes: target.kubernetes describes the pods of a kind: kubernetes target; "
        "this target is kind 'builtin'"]
    assert problems("  kind: kubernetes\n"
                    "  kubernetes: {service: web, kubeconfig: /nonexistent/kubeconfig}\n")[0].endswith(
        "target.kubernetes.kubeconfig: no kubeconfig file at '/nonexistent/kubeconfig'")
    ok = experiment("  kind: kubernetes\n"
                    "  kubernetes: {selector: {app.kubernetes.io/name: web, tier: '1'}, port: 8000}\n")
    assert ok.target.kubernetes.selector == (("app.kubernetes.io/name", "web"), ("tier", "1")) \
        and ok.target.kubernetes.namespace is None


def test_access_auto_means_the_service_only_inside_a_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kube = experiment("  kind: kubernetes\n  kubernetes: {service: web}\n").target.kubernetes
    monkeypatch.setattr("chaos.targets.kubernetes.INCLUSTER_TOKEN", tmp_path / "token")
    (tmp_path / "token").write_text("t")
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOME": str(tmp_path)}
    assert resolve_access(kube, in_pod) == "service"
    config = tmp_path / "config"
    config.write_text("{}")
    # a kubeconfig: an outside user
    assert resolve_access(kube, {**in_pod, "KUBECONFIG": str(config)}) == "port-forward"
    assert resolve_access(kube, {"HOME": str(tmp_path)}) == "port-forward"


def test_the_kubeconfig_is_found_where_kubectl_looks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    first, second = tmp_path / "a", tmp_path / "b"
    second.write_text("x")
    assert config_source(None, {"KUBECONFIG": f"{first}:{second}"}) == second  # the first file that exists
    assert config_source(None, {"STREAMCHAOS_KUBECONFIG": str(first)}) is None  # missing: not used
    assert config_source("~/given", {}) == tmp_path / "given"
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "a",
        "clusters": [{"name": "c", "cluster": {"server": "https://x"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "a", "context": {"cluster": "c", "user": "u", "namespace": "staging"}},
                     {"name": "b", "context": {"cluster": "c", "user": "u"}}]}))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("STREAMCHAOS_KUBECONFIG", raising=False)
    assert default_namespace(None, None) == "staging" and default_namespace(None, "b") == "default"


def test_service_ports_resolve_by_name_or_number() -> None:
    svc = {"metadata": {"name": "web"}, "spec": {"ports": [{"name": "http", "port": 80, "targetPort": "http"},
                                                           {"name": "metrics", "port": 9090, "targetPort": 9090}]}}
    assert service_port(svc, "http")["targetPort"] == "http" and service_port(svc, 9090)["port"] == 9090
    with pytest.raises(ExperimentInvalid, match="has 2 ports \\(http, metrics\\): say which one"):
        service_port(svc, None)
    with pytest.raises(ExperimentInvalid, match="has no port 'grpc'; its ports: http, metrics"):
        service_port(svc, "grpc")


KILL = "      - {kind: k8s.pod_kill}\n"
EVICT = "      - {kind: k8s.pod_evict}\n"
SCALE = "      - {kind: k8s.scale, deployment: web, replicas: 1}\n"
TARGET = "  kind: kubernetes\n  kubernetes: {namespace: demo, service: web}\n"


def grants(rules: list[Rule]) -> set[tuple[str, ...]]:
    return {(r.group, r.resource, v, *r.names) for r in rules for v in r.verbs}


def test_rules_are_exactly_what_the_target_and_faults_call() -> None:
    watch = {("", "pods", "list"), ("", "pods", "watch")}  # never `get`: no pod is read by name
    service = {("", "services", "get", "web")}  # the Service it names, and no other
    forward = {("", "pods/portforward", "create"), ("", "pods/portforward", "get")}
    plain = experiment(TARGET)
    assert grants(experiment_rules(plain)) == watch | service
    assert grants(experiment_rules(plain, in_cluster=False)) == watch | service | forward
    assert grants(experiment_rules(experiment(TARGET, KILL))) == watch | service | {("", "pods", "delete")}
    assert grants(experiment_rules(experiment(TARGET, EVICT))) == watch | service | {
        ("", "pods/eviction", "create"), ("policy", "poddisruptionbudgets", "list")}
    # only the Deployment it names
    assert grants(experiment_rules(experiment(TARGET, SCALE))) == watch | service | {
        ("apps", "deployments", "get", "web"), ("apps", "deployments/scale", "update", "web")}
    selector_only = experiment("  kind: kubernetes\n"
                               "  kubernetes: {selector: {app: web}, port: http, access: endpoints}\n")
    assert grants(experiment_rules(selector_only, in_cluster=False)) == watch  # no Service to read, no port-forward
    assert experiment_rules(parse_experiment("name: x\nphases: [{name: p, duration: 1s}]\n")) == []


def test_only_the_k8s_kinds_call_the_kubernetes_api() -> None:
    for kind, cls in REGISTRY.items():
        assert bool(cls.rbac_rules) is kind.startswith("k8s."), kind
        for rule in cls.rbac_rules:
            assert rule.why and "*" not in rule.resource + "".join(rule.verbs), (kind, rule)
            assert not {"escalate", "bind", "impersonate"} & set(rule.verbs) \
                and rule.resource not in ("secrets", "pods/exec")


def test_a_scale_role_names_its_deployment_and_no_other() -> None:
    exp = experiment(TARGET, SCALE + "      - {kind: k8s.scale, deployment: api, replicas: 0}\n")
    role = rbac_documents(exp)[1]
    named = [r for r in role["rules"] if r["apiGroups"] == ["apps"]]
    assert {(r["resources"][0], tuple(r["resourceNames"])) for r in named} == {
        ("deployments", ("api",)), ("deployments", ("web",)),
        ("deployments/scale", ("api",)), ("deployments/scale", ("web",))}
    rules = experiment_rules(exp)
    assert any(r.covers("apps", "deployments/scale", "update", "web") for r in rules)
    assert not any(r.covers("apps", "deployments/scale", "update", "prod-db") for r in rules)
    assert '    resourceNames: ["web"]\n    verbs: ["update"]' in render_rbac(exp)


def test_the_role_reads_only_the_service_the_target_names() -> None:
    """The target reads its Service by name only (never a list), so the grant names it: a Role that let
    the runner read every Service of the namespace would be wider than what it calls."""
    exp = experiment("  kind: kubernetes\n  kubernetes: {namespace: demo, service: vllm-prod}\n")
    role = rbac_documents(exp)[1]
    (services,) = [r for r in role["rules"] if r["resources"] == ["services"]]
    assert services == {"apiGroups": [""], "resources": ["services"], "resourceNames": ["vllm-prod"], "verbs": ["get"]}
    rules = experiment_rules(exp)
    assert any(r.covers("", "services", "get", "vllm-prod") for r in rules)
    assert not any(r.covers("", "services", "get", "billing") or r.covers("", "services", "list") for r in rules)
    assert '    resources: ["services"]\n    resourceNames: ["vllm-prod"]\n    verbs: ["get"]' in render_rbac(exp)


def test_merged_rules_unite_verbs_and_keep_every_reason() -> None:
    merged = merge_rules([Rule("", "pods", ("list",), "a"), Rule("apps", "deployments", ("get",), "c"),
                          Rule("", "pods", ("delete", "list"), "b")])
    assert merged == [Rule("", "pods", ("delete", "list"), "a; b"), Rule("apps", "deployments", ("get",), "c")]


@pytest.mark.parametrize("version", ["1.29", "1.33"])
def test_the_generated_yaml_is_the_documents_and_validates_strictly(version: str) -> None:
    exp = experiment(TARGET, KILL + EVICT + SCALE)
    text = render_rbac(exp, name="chaos-runner")
    docs = list(yaml.safe_load_all(text))
    assert docs == rbac_documents(exp, name="chaos-runner")
    assert [d["kind"] for d in docs] == ["ServiceAccount", "Role", "RoleBinding"]
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)
        assert doc["metadata"]["namespace"] == "demo"
    assert docs[0]["automountServiceAccountToken"] is False
    for rule in experiment_rules(exp):  # every rule is commented with why it is needed
        assert f"  # {rule.why}\n  - apiGroups: [\"{rule.group}\"]\n    resources: [\"{rule.resource}\"]" in text
    assert docs[2]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "chaos-runner"}
    assert docs[2]["subjects"] == [{"kind": "ServiceAccount", "name": "chaos-runner", "namespace": "demo"}]


def test_an_experiment_that_calls_nothing_gets_an_account_and_no_role() -> None:
    docs = rbac_documents(parse_experiment("name: x\nphases: [{name: p, duration: 1s}]\n"))
    assert [d["kind"] for d in docs] == ["ServiceAccount"] and "namespace" not in docs[0]["metadata"]


def test_the_command(tmp_path: Path) -> None:
    path = tmp_path / "e.yaml"
    path.write_text(f"name: e\ntarget:\n{TARGET}phases:\n  - name: p\n    duration: 2s\n    faults:\n{KILL}",
                    encoding="utf-8")
    cli = [sys.executable, "-m", "chaos.cli", "manifests", "rbac"]
    out = subprocess.run([*cli, str(path), "--outside", "--namespace", "other"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    role = list(yaml.safe_load_all(out.stdout))[1]
    assert role["metadata"]["namespace"] == "other" and {"resources": ["pods/portforward"], "apiGroups": [""],
                                                         "verbs": ["create", "get"]} in role["rules"]
    path.write_text("name: e\ntarget: {kind: kubernetes, kubernetes: {service: Web}}\n"
                    "phases: [{name: p, duration: 1s}]\n")
    bad = subprocess.run([*cli, str(path)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and f"{path}:2:50: target.kubernetes.service: expected a Service name" in bad.stderr
    assert "Traceback" not in bad.stderr
