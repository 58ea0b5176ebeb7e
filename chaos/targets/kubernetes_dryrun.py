"""A dry run's account of a ``target.kind: kubernetes`` target: resolved with read-only calls.

In the order a run makes them, and stopping where a run would be refused: the namespace against
``safety.allowed_targets`` (before any call), ``get`` the Service (its selector and port), ``get``
each Deployment a ``k8s.scale`` names (its pod template against the allow-list), then ``list`` the
pods. Nothing is watched, port-forwarded to, deleted, evicted or scaled. Each call is recorded in
the dry run's ``contacted``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from chaos.model.context import ClusterRef, TargetInfo
from chaos.model.errors import ChaosError, TargetNotAllowed

if TYPE_CHECKING:
    from chaos.k8s.client import KubeApi
    from chaos.k8s.gate import ClusterGate
    from chaos.model.experiment import Experiment

__all__ = ["resolved_cluster_target"]


class Account(Protocol):
    """What ``chaos.execution.dryrun.DryRun`` offers: lines, the requests made, the exit code."""

    contacted: list[str]

    def say(self, text: str = "", indent: int = 0) -> None: ...

    def worst(self, code: int) -> None: ...


def _refused(out: Account, exc: TargetNotAllowed) -> None:
    for line in str(exc).splitlines()[1:] or [str(exc)]:
        out.say(f"REFUSED: {line.strip()}", 1)
    out.worst(2)


async def resolved_cluster_target(exp: Experiment, probe: bool, out: Account) -> TargetInfo:
    """The target as the run would resolve it (``probe``: the allow-list let it be read at all)."""
    from chaos.model.allowlist import format_selector
    from chaos.targets.kubernetes import resolve_access

    spec = exp.target
    kube = spec.kubernetes
    assert kube is not None
    what = f"Service {kube.service}" if kube.service else f"the pods {format_selector(kube.selector)}"
    access = "url" if spec.url else resolve_access(kube)
    reached = f"the load goes to {spec.url} (target.url)" if spec.url else f"reached by {access}"
    out.say(f"target: kind kubernetes, {what} in namespace {kube.namespace or '(the kubeconfig context’s)'}; {reached} "
            "(already running; streamchaos neither starts nor stops it)")
    info = TargetInfo(kind="kubernetes", base_url="(resolved when the run starts)", model=spec.model)
    if not probe:
        out.say("not contacted: refused above", 1)
        return info
    from chaos.k8s.client import KubeApi, default_namespace
    from chaos.k8s.gate import ClusterGate

    try:
        api = await KubeApi.connect(kube.kubeconfig, kube.context)
    except ChaosError as exc:
        out.say(f"NOT POSSIBLE HERE: {exc}", 1)
        out.worst(4)
        return info
    try:
        namespace = kube.namespace or default_namespace(kube.kubeconfig, kube.context)
        gate = ClusterGate(exp)
        gate.namespace(namespace)
        labels, templates = await _read_cluster(api, exp, gate, namespace, out)
        cluster = ClusterRef(namespace=namespace, selector=tuple(sorted(labels.items())), service=kube.service,
                             kubeconfig=kube.kubeconfig, context=kube.context, server=api.server, templates=templates)
        return TargetInfo(kind="kubernetes", base_url=spec.url or f"(by {access})", model=spec.model, cluster=cluster)
    except TargetNotAllowed as exc:
        _refused(out, exc)
        return info
    except ChaosError as exc:
        out.say(f"NOT POSSIBLE HERE: {exc}", 1)
        out.worst(4)
        return info
    finally:
        await api.close()


async def _read_cluster(api: KubeApi, exp: Experiment, gate: ClusterGate, namespace: str,
                        out: Account) -> tuple[dict[str, str], tuple[tuple[str, str], ...]]:
    """What the run would read as it resolves the target: the Service (its selector and port), the
    Deployments scaled by its faults (their pod templates), the pods and how many are Ready; each
    read said and recorded as contacted. The pods' labels and the templates."""
    from chaos.k8s.gate import scaled_deployments
    from chaos.k8s.pods import selector_text, serving
    from chaos.targets.kubernetes import service_port

    spec = exp.target
    kube = spec.kubernetes
    assert kube is not None
    labels = dict(kube.selector)
    where = f"in namespace {namespace} ({api.server})"
    if kube.service:
        service = await api.read_service(namespace, kube.service)
        out.contacted.append(f"get services {kube.service} {where}")
        labels = {**((service.get("spec") or {}).get("selector") or {}), **labels}
        port = service_port(service, kube.port)
        out.say(f"Service {kube.service}: selector {selector_text(labels) or '(none)'}, port "
                f"{port.get('name') or port['port']} → pods' {port.get('targetPort', port['port'])}", 1)
    try:
        templates = await gate.resolved(api, namespace, labels)
    finally:
        out.contacted.extend(f"get deployments {name} {where}" for name in scaled_deployments(exp))
    pods, _ = await api.list_pods(namespace, labels)
    out.contacted.append(f"list pods -l {selector_text(labels)} {where}")
    ready = [p["metadata"]["name"] for p in pods if serving(p)]
    out.say(f"pods {selector_text(labels)}: {len(pods)}, {len(ready)} Ready"
            + (f" ({', '.join(sorted(ready))})" if ready else ""), 1)
    if not ready:
        out.say(f"NO POD IS READY: the run would wait startup_timeout ({spec.startup_timeout:g}s) and fail", 1)
        out.worst(4)
    for name, template in templates:
        out.say(f"Deployment {name}: pod template {template or '(no labels)'}", 1)
    return labels, templates
