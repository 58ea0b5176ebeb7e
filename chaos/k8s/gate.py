"""``safety.allowed_targets`` for a Kubernetes target, applied as each part becomes known.

The namespace is checked before the first API call (it comes from the experiment or the kubeconfig,
neither of which needs the server). A Service's selector is known only after the one read that
resolves it, and a ``k8s.scale`` fault's Deployment only after reading it: both are checked right
then, before any pod is listed, watched or connected to. A Deployment is allowed when its pod
template's labels are within an allowed selector (what it scales is those pods).

``ClusterGate`` holds the experiment; the target calls ``namespace`` and ``resolved`` (the reads are
``get`` on ``services`` and ``deployments``, both in the generated Role).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from chaos.model.allowlist import cluster_reach, format_selector, refusals
from chaos.model.context import ClusterRef, Reach
from chaos.model.errors import TargetNotAllowed

if TYPE_CHECKING:
    from chaos.k8s.client import KubeApi
    from chaos.model.experiment import Experiment

__all__ = ["ClusterGate", "scaled_deployments", "template_labels"]


def scaled_deployments(experiment: Experiment) -> list[str]:
    """The Deployments the experiment's ``k8s.scale`` faults name, in order, each once. Pure."""
    names: list[str] = []
    for _, fault in experiment.faults():
        name = getattr(fault, "deployment", None)
        if fault.kind == "k8s.scale" and isinstance(name, str) and name not in names:
            names.append(name)
    return names


def template_labels(deployment: Mapping[str, Any]) -> dict[str, str]:
    """The labels of a Deployment's pod template (what its pods carry). Pure."""
    template = (deployment.get("spec") or {}).get("template") or {}
    return {str(k): str(v) for k, v in ((template.get("metadata") or {}).get("labels") or {}).items()}


class ClusterGate:
    """The allow-list of one Kubernetes run, checked before contact and as soon as the target is resolved."""

    def __init__(self, experiment: Experiment) -> None:
        self.experiment = experiment

    def namespace(self, namespace: str) -> None:
        """Refuse a namespace the allow-list does not cover (before any API call)."""
        reach = Reach(f"target ({self.experiment.target.kind})", namespace=namespace, namespace_only=True)
        self._enforce([reach], "refused before any API call")

    async def resolved(self, api: KubeApi, namespace: str, labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        """Read the Deployments ``k8s.scale`` names and check the whole cluster reach; the templates
        (name, labels as a selector) for the target's ``ClusterRef``."""
        templates = []
        for name in scaled_deployments(self.experiment):
            templates.append((name, format_selector(template_labels(await api.read_deployment(namespace, name)))))
        self.check(ClusterRef(namespace=namespace, selector=tuple(sorted(labels.items())), templates=tuple(templates)))
        return tuple(templates)

    def check(self, cluster: ClusterRef) -> list[Reach]:
        reaches = cluster_reach(self.experiment, cluster)
        self._enforce(reaches, "refused before any pod was listed or connected to")
        return reaches

    def _enforce(self, reaches: list[Reach], when: str) -> None:
        refused = refusals(reaches, self.experiment.safety.allowed_targets)
        if refused:
            raise TargetNotAllowed(f"{when}:\n  " + "\n  ".join(refused))
