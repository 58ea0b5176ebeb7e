"""The RBAC one experiment needs, and nothing more: ``streamchaos manifests rbac EXPERIMENT``.

The rules are the union of what its target calls (``chaos.k8s.rbac.target_rules``: a kind
kubernetes target follows its pods, reads the one Service it names, port-forwards from outside the
cluster) and what each of its faults declares (``Fault.rbac()``: a ``k8s.scale`` only on its
Deployment), merged per resource. The output is a ServiceAccount (``automountServiceAccountToken: false``), and only
when there is something to grant,
a Role (namespaced, no wildcards, a comment per rule saying why) and a RoleBinding. The token is
then mounted only in the pod that runs this experiment (``automountServiceAccountToken: true`` in
that pod's spec), never by default.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from chaos.k8s.rbac import Rule, lever_rules, merge_rules, target_rules

if TYPE_CHECKING:
    from chaos.model.experiment import Experiment

__all__ = ["experiment_rules", "rbac_documents", "render_rbac"]

LABELS = {"app.kubernetes.io/name": "streamchaos", "app.kubernetes.io/part-of": "streamchaos"}


def experiment_rules(experiment: Experiment, *, in_cluster: bool = True) -> list[Rule]:
    """What running ``experiment`` calls on the Kubernetes API. ``in_cluster``: where ``access: auto``
    will resolve (a pod uses the Service; from outside, a port-forward). Pure."""
    rules: list[Rule] = []
    kube = experiment.target.kubernetes
    if experiment.target.kind == "kubernetes" and kube is not None:
        access = kube.access if kube.access != "auto" else ("service" if in_cluster else "port-forward")
        if experiment.target.url:
            access = "url"
        rules += target_rules(service=kube.service, port_forward=access == "port-forward")
    for _, fault in experiment.faults():
        rules += fault.rbac()
    if experiment.safety.lever.namespace:  # the lever's ConfigMap (in the Role's namespace: docs/lever.md)
        rules += lever_rules(experiment.safety.lever.configmap)
    return merge_rules(rules)


def rbac_documents(experiment: Experiment, *, name: str = "streamchaos", namespace: str | None = None,
                   in_cluster: bool = True) -> list[dict[str, Any]]:
    """ServiceAccount, and (when anything is needed) Role and RoleBinding, as API objects. Pure."""
    kube = experiment.target.kubernetes
    namespace = namespace or (kube.namespace if kube is not None else None)
    meta: dict[str, Any] = {"name": name, "labels": dict(LABELS)}
    if namespace:
        meta["namespace"] = namespace
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta),
               "automountServiceAccountToken": False}
    rules = experiment_rules(experiment, in_cluster=in_cluster)
    if not rules:
        return [account]
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": dict(meta),
            "rules": [{"apiGroups": [r.group], "resources": [r.resource],
                       **({"resourceNames": list(r.names)} if r.names else {}),
                       "verbs": list(r.verbs)} for r in rules]}
    subject: dict[str, Any] = {"kind": "ServiceAccount", "name": name}
    if namespace:
        subject["namespace"] = namespace
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": dict(meta),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": [subject]}
    return [account, role, binding]


def _flow(value: Any) -> str:
    return json.dumps(value)  # JSON is YAML: flow style, quoted the way kubectl's docs write it


def _document(doc: dict[str, Any], rules: list[Rule]) -> list[str]:
    lines = [f"apiVersion: {doc['apiVersion']}", f"kind: {doc['kind']}", "metadata:",
             f"  name: {doc['metadata']['name']}"]
    if "namespace" in doc["metadata"]:
        lines.append(f"  namespace: {doc['metadata']['namespace']}")
    lines.append("  labels:")
    lines += [f"    {k}: {v}" for k, v in doc["metadata"]["labels"].items()]
    if doc["kind"] == "ServiceAccount":
        lines.append("automountServiceAccountToken: false   # mounted only in the pod that runs the experiment")
    elif doc["kind"] == "Role":
        lines.append("rules:")
        for rule, body in zip(rules, doc["rules"], strict=True):
            lines += [f"  # {rule.why}", f"  - apiGroups: {_flow(body['apiGroups'])}",
                      f"    resources: {_flow(body['resources'])}"]
            if "resourceNames" in body:
                lines.append(f"    resourceNames: {_flow(body['resourceNames'])}")
            lines.append(f"    verbs: {_flow(body['verbs'])}")
    else:
        lines += ["roleRef:", "  apiGroup: rbac.authorization.k8s.io", "  kind: Role",
                  f"  name: {doc['roleRef']['name']}", "subjects:"]
        for subject in doc["subjects"]:
            lines.append(f"  - kind: ServiceAccount\n    name: {subject['name']}"
                         + (f"\n    namespace: {subject['namespace']}" if "namespace" in subject else ""))
    return lines


def render_rbac(experiment: Experiment, *, name: str = "streamchaos", namespace: str | None = None,
                in_cluster: bool = True) -> str:
    """The documents as commented YAML (``kubectl apply -f -`` reads it)."""
    docs = rbac_documents(experiment, name=name, namespace=namespace, in_cluster=in_cluster)
    rules = experiment_rules(experiment, in_cluster=in_cluster)
    kinds = sorted({f.kind for _, f in experiment.faults() if f.rbac_rules})
    where = docs[0]["metadata"].get("namespace")
    header = [
        f"# RBAC for the streamchaos experiment {experiment.name!r}"
        + (f" ({experiment.source})" if experiment.source else ""),
        "# generated by `streamchaos manifests rbac`: exactly what its target"
        + (f" (kind {experiment.target.kind})" if experiment.target.kind == "kubernetes" else "")
        + (f" and its faults ({', '.join(kinds)}) call" if kinds else " calls") + " on the Kubernetes API.",
        f"# Namespace: {where}" if where else
        "# No namespace named: apply with kubectl apply -n NAMESPACE (the target's namespace).",
        "# Run the experiment in a pod with serviceAccountName: " + name + " and automountServiceAccountToken: true"
        if rules else "# Nothing to grant: this experiment calls no Kubernetes API; no pod needs the account's token.",
    ]
    body = "\n---\n".join("\n".join(_document(doc, rules)) for doc in docs)
    return "\n".join(header) + "\n" + body + "\n"
