"""RBAC rules as data: what each cluster-touching part of streamchaos calls on the Kubernetes API.

A fault kind declares ``rbac_rules`` (a tuple of ``Rule``), the Kubernetes target declares its own
(``target_rules``), and ``streamchaos manifests rbac EXPERIMENT`` assembles exactly the rules one
experiment uses into a namespaced Role. Each rule says why it is needed, and the Role's YAML keeps
that as a comment. A leaf module: it imports nothing of ours.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Rule", "lever_rules", "merge_rules", "target_rules"]


@dataclass(frozen=True)
class Rule:
    """One grant: ``verbs`` on ``resource`` (``pods``, ``pods/eviction``) of API group ``group``; only on
    the objects ``names`` names when it names any (a Role's ``resourceNames``)."""

    group: str  # "" is the core group
    resource: str
    verbs: tuple[str, ...]
    why: str
    names: tuple[str, ...] = ()  # resourceNames: () for every object of the resource

    def covers(self, group: str, resource: str, verb: str, name: str | None = None) -> bool:
        return (self.group == group and self.resource == resource and verb in self.verbs
                and (not self.names or name in self.names))


def merge_rules(rules: Iterable[Rule]) -> list[Rule]:
    """One rule per (group, resource, names): verbs united and sorted, reasons joined. Pure and ordered.
    A rule limited to some objects stays apart from one that is not, so no limit is lost in the merge."""
    merged: dict[tuple[str, str, tuple[str, ...]], tuple[set[str], list[str]]] = {}
    for rule in rules:
        verbs, whys = merged.setdefault((rule.group, rule.resource, tuple(sorted(set(rule.names)))), (set(), []))
        verbs.update(rule.verbs)
        if rule.why not in whys:
            whys.append(rule.why)
    return [Rule(group, resource, tuple(sorted(verbs)), "; ".join(whys), names)
            for (group, resource, names), (verbs, whys) in sorted(merged.items())]


def target_rules(*, service: str | None, port_forward: bool) -> list[Rule]:
    """What ``target.kind: kubernetes`` calls: list and watch its pods (it never reads one by name), read
    the one Service it names (``get`` by name only, so the grant names it: no other Service is readable),
    port-forward to them."""
    rules = [Rule("", "pods", ("list", "watch"), "find the target's pods and follow their readiness and restarts")]
    if service:
        rules.append(Rule("", "services", ("get",), "read the target Service's selector, port and ClusterIP",
                          names=(service,)))
    if port_forward:
        # A port-forward is a WebSocket upgrade (GET). A 1.30+ API server authorizes it twice: as `get` in
        # its authorization filter, then as `create` in the handler (AuthorizePodWebsocketUpgradeCreatePermission).
        rules.append(Rule("", "pods/portforward", ("create", "get"),
                          "carry the load and the scrapes to the pods from outside the cluster"))
    return rules


def lever_rules(configmap: str) -> list[Rule]:
    """What a run watching the fleet lever's ConfigMap calls (``safety.lever.namespace``): ``get`` on that one
    ConfigMap. Engaging and releasing it (`streamchaos lever on|off --namespace`) is an operator's act, not
    a run's: ``create`` on configmaps and ``update`` on this one, granted to them, not to the run."""
    return [Rule("", "configmaps", ("get",), "read the fleet lever before the run and while it runs",
                 names=(configmap,))]
