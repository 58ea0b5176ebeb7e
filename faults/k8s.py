"""Kubernetes faults: delete or evict a Kubernetes target's pods, scale its Deployment.

- ``k8s.pod_kill``: delete ``count`` (or ``fraction``) of the serving pods, chosen by the run's seed,
  ``at`` after the phase start, with ``grace_period`` (default: each pod's own; ``0s``: at once). A
  delete ignores PodDisruptionBudgets, as a node failure does.
- ``k8s.pod_evict``: the same through the Eviction API, as ``kubectl drain`` does: a budget that allows
  no disruption refuses it (429); ``retry_for`` keeps asking, ``on_refused: record`` notes the refusal
  instead of failing the run.
- ``k8s.scale``: set a Deployment's replicas for the phase; revert restores the count it had, only
  while the Deployment is the same object (``metadata.uid``) and its replicas are still what the run
  set (an HPA or a person who changed them since is left alone). It outlives the runner, so a
  watchdog rolls it back if the runner dies.

Evidence: the uids deleted or evicted and when the delete was requested (``requested_at_ns``, the
runner's monotonic clock), and at revert when each victim began terminating and was gone, which pods
replaced them and when each became Ready (from a watch of the pods). A deleted pod cannot be undone:
its controller replaces it, and ``streamchaos rollback`` has nothing to do for it.

Each kind declares the RBAC rules it calls (``rbac_rules``); ``streamchaos manifests rbac`` assembles
them. The ``kubernetes`` client is imported only when a fault acts (extra ``k8s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Self

from chaos.k8s.labels import selector_problems
from chaos.k8s.rbac import Rule  # plain data, nothing of the kubernetes client
from chaos.model.context import ClusterRef, FaultAccount, Reach, RunContext, Scene
from chaos.model.errors import ChaosError, FaultError, FaultUnsupported
from chaos.model.params import Param, Schema
from faults.base import Fault, Injection, register

__all__ = ["PodEvict", "PodKill", "Scale"]

REVERT_WAIT_S = 10.0  # a scheduled delete still running at revert (the runner allows a revert 20s)
FOLLOW_POLL_S = 0.5  # k8s.scale: how often the deployment's ready replicas are read while in force
EVICT_RETRY_S = 1.0


_SELECT = (
    Param("selector", "mapping", None,
          doc="pod labels (matchLabels) in the target's namespace; default: the target's pods"),
    Param("count", "int", None, min=1, doc="how many pods (default 1)"),
    Param("fraction", "fraction", None, doc="or this share of the serving pods, rounded up"),
    Param("grace_period", "duration", None,
          doc="termination grace period, whole seconds; default: each pod's own; 0s: at once"),
    Param("at", "duration", 0.0, doc="delay after the phase start"),
)


def _needs_cluster(kind: str, experiment: Any) -> list[tuple[str, str]]:
    target = experiment.target
    if target.kind != "kubernetes" or target.kubernetes is None:
        return [("", f"{kind} acts on the pods of a Kubernetes target: set target.kind: kubernetes and "
                     "target.kubernetes {namespace, service or selector}")]
    return []


def _cluster(kind: str, ctx: RunContext) -> ClusterRef:
    from chaos.k8s.client import require_client

    require_client(kind)
    if ctx.target.cluster is None:
        raise FaultUnsupported(f"{kind} needs a Kubernetes target (target.kind: kubernetes with target.kubernetes), "
                               f"not target {ctx.target.kind} at {ctx.target.base_url}")
    return ctx.target.cluster


@dataclass(frozen=True, kw_only=True)
class _PodFault(Fault):
    """What pod_kill and pod_evict share: which pods, how many, when, how gracefully."""

    action: ClassVar[str] = "delete"
    selector: tuple[tuple[str, str], ...] | None
    count: int | None
    fraction: float | None
    grace_period: float | None
    at: float

    @classmethod
    def from_params(cls, name: str, params: Mapping[str, Any]) -> Self:
        values = dict(params)
        if isinstance(values.get("selector"), Mapping):  # frozen and hashable: sorted pairs, checked in problems()
            values["selector"] = tuple(sorted(values["selector"].items(), key=lambda kv: str(kv[0])))
        return super().from_params(name, values)

    def problems(self, experiment: Any) -> list[tuple[str, str]]:
        found = _needs_cluster(self.kind, experiment)
        if self.count is not None and self.fraction is not None:
            found.append(("", "give count or fraction, not both"))
        if self.fraction is not None and self.fraction <= 0:
            found.append(("fraction", f"must be above 0, found {self.fraction:g}"))
        if self.grace_period is not None and (self.grace_period < 0 or self.grace_period != int(self.grace_period)):
            found.append(("grace_period", f"the API takes whole seconds, found {self.grace_period:g}s"))
        if self.selector is not None and not self.selector:
            found.append(("selector", "an empty selector would match every pod of the namespace; "
                                      "name at least one label"))
        # what the API server would refuse at run time (a 422 after the baseline), said at validation
        found += [(f"selector.{key}", why) for key, why in selector_problems(self.selector or ())]
        return found

    def labels(self, ctx_labels: dict[str, str]) -> dict[str, str]:
        return dict(self.selector) if self.selector else ctx_labels

    def cluster_reach(self, cluster: ClusterRef) -> tuple[Reach, ...]:
        from chaos.model.allowlist import format_selector

        return (Reach(f"fault {self.name} ({self.kind})", namespace=cluster.namespace,
                      selector=format_selector(self.labels(cluster.labels)) or None),)

    def activate(self, ctx: RunContext) -> Injection:
        _cluster(self.kind, ctx)
        return _Disruption(self, ctx)

    def describe(self, scene: Scene) -> FaultAccount:
        cluster = scene.target.cluster
        where = f" {self.labels(cluster.labels)} in namespace {cluster.namespace}" if cluster is not None else ""
        how_many = f"{self.fraction:.0%} of" if self.fraction is not None else f"{self.count or 1} of"
        grace = "each pod's own grace period" if self.grace_period is None else f"grace {self.grace_period:g}s"
        if self.action == "delete":
            calls = "API calls: list and watch pods, then delete pods/NAME (uid precondition) for each"
        else:
            calls = ("API calls: list and watch pods, then create pods/NAME/eviction for each "
                     f"(a PodDisruptionBudget may refuse it: 429, retried for {getattr(self, 'retry_for', 0.0):g}s, "
                     "then on_refused: "
                     f"{getattr(self, 'on_refused', 'fail')}); "
                     "list poddisruptionbudgets to name the one that refused")
        verb = "deletes" if self.action == "delete" else "evicts"
        return FaultAccount(
            changes=f"{verb} {how_many} the Ready pods{where} at +{self.at:g}s, {grace}. {calls}",
            undo="nothing to undo: the pod's controller (a Deployment's ReplicaSet) replaces it, not streamchaos; "
                 "`streamchaos rollback` has nothing to do for it (a bare pod stays gone)")

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        return {"skipped": "a deleted or evicted pod cannot be undone; its controller replaces it"}


@register
@dataclass(frozen=True, kw_only=True)
class PodKill(_PodFault):
    """Delete pods of the target (budgets do not apply: a node failure does not ask)."""

    kind = "k8s.pod_kill"
    summary = ("delete count or fraction of the target's ready pods at a set time; "
               "evidence: uids removed, replacements Ready")
    schema = Schema(params=_SELECT, at_most_one_of=(("count", "fraction"),))
    action = "delete"
    rbac_rules = (
        Rule("", "pods", ("list", "watch"), "choose the victims among the Ready pods and follow their replacements"),
        Rule("", "pods", ("delete",), "delete the chosen pods"),
    )


@register
@dataclass(frozen=True, kw_only=True)
class PodEvict(_PodFault):
    """Evict pods of the target through the Eviction API, which honours PodDisruptionBudgets."""

    kind = "k8s.pod_evict"
    summary = "evict count or fraction of the target's ready pods (Eviction API, honours PodDisruptionBudgets)"
    schema = Schema(params=(
        *_SELECT,
        Param("retry_for", "duration", 0.0,
              doc="while a disruption budget refuses (429), ask again every second for this long"),
        Param("on_refused", "choice", "fail", choices=("fail", "record"),
              doc="a refusal that outlasts retry_for fails the run (fail) or is recorded in the evidence (record)"),
    ), at_most_one_of=(("count", "fraction"),))
    action = "evict"
    rbac_rules = (
        Rule("", "pods", ("list", "watch"), "choose the victims among the Ready pods and follow their replacements"),
        Rule("", "pods/eviction", ("create",), "evict the chosen pods (policy/v1 Eviction, as kubectl drain does)"),
        Rule("policy", "poddisruptionbudgets", ("list",), "name the disruption budget that refused an eviction"),
    )

    retry_for: float
    on_refused: str


class _Disruption(Injection):
    """One phase's pod deletions or evictions, and the watch that sees what followed."""

    def __init__(self, fault: _PodFault, ctx: RunContext) -> None:
        super().__init__(fault, ctx)
        self.spec = fault
        self.cluster: ClusterRef = _cluster(fault.kind, ctx)
        self.namespace: str = self.cluster.namespace
        self.selector = fault.labels(self.cluster.labels)
        self.api: Any = None
        self.watch: Any = None
        self._task: asyncio.Task[dict[str, Any]] | None = None
        self._t0 = 0
        self._acted_ns: int | None = None
        self._victims: list[dict[str, Any]] = []
        self._before = 0
        self._reverted = False

    def plan(self) -> dict[str, Any]:
        spec = self.spec
        return {"action": spec.action, "namespace": self.namespace, "selector": self.selector, "count": spec.count,
                "fraction": spec.fraction, "grace_period_s": spec.grace_period, "at_s": spec.at,
                "api_server": self.cluster.server,
                "note": f"{'a deleted' if spec.action == 'delete' else 'an evicted'} pod cannot be undone; "
                        "its controller replaces it"}

    async def inject(self) -> dict[str, Any]:
        from chaos.k8s.client import KubeApi
        from chaos.k8s.watch import PodWatch

        self._t0 = time.monotonic_ns()
        self._victims, self._acted_ns, self._reverted = [], None, False
        self.api = await KubeApi.connect(self.cluster.kubeconfig, self.cluster.context, error=FaultError)
        self.watch = PodWatch(self.api, self.namespace, self.selector)
        await self.watch.start()
        if self.spec.at > 0:
            self._task = asyncio.create_task(self._later(), name=f"{self.name}-{self.spec.action}")
            return {"scheduled": True, "at_s": self.spec.at, "namespace": self.namespace, "selector": self.selector,
                    "serving": len(self.watch.serving())}
        return await self._disrupt()

    def scheduled(self) -> asyncio.Future[Any] | None:
        return self._task

    async def _later(self) -> dict[str, Any]:
        await asyncio.sleep(self.spec.at)
        return await self._disrupt()

    async def _disrupt(self) -> dict[str, Any]:
        from chaos.k8s.pods import choose

        candidates = self.watch.serving()
        self._before = len(candidates)
        if not candidates:
            raise FaultError(f"{self.kind}: no Ready pod matches {self.selector} in namespace {self.namespace} "
                             f"({self.watch.describe()}), so there is nothing to {self.spec.action}")
        chosen = choose(candidates, count=self.spec.count, fraction=self.spec.fraction, rng=self.ctx.rng(self.name))
        grace = None if self.spec.grace_period is None else int(self.spec.grace_period)
        refused: list[dict[str, Any]] = []
        for pod in chosen:
            meta = pod["metadata"]
            requested = time.monotonic_ns()
            if self.spec.action == "delete":
                await self.api.delete_pod(self.namespace, meta["name"], meta["uid"], grace)
            else:
                why = await self._evict(pod, grace)
                if why is not None:
                    refused.append({"name": meta["name"], "uid": meta["uid"], "refused": why})
                    continue
            self._acted_ns = self._acted_ns or requested
            self._victims.append({"name": meta["name"], "uid": meta["uid"],
                                  "node": (pod.get("spec") or {}).get("nodeName"), "requested_at_ns": requested,
                                  "requested_after_s": round((requested - self._t0) / 1e9, 3)})
        evidence: dict[str, Any] = {"action": self.spec.action, "namespace": self.namespace, "selector": self.selector,
                                    "serving_before": self._before, "grace_period_s": grace,
                                    "pods": list(self._victims)}
        if refused:
            evidence["refused"] = refused
        return evidence

    async def _evict(self, pod: Mapping[str, Any], grace: int | None) -> str | None:
        """Evict one pod; None when done, the refusal when recorded (``on_refused: record``)."""
        from chaos.k8s.errors import Call, budget_refusal, refusal
        from chaos.k8s.pods import selects

        assert isinstance(self.spec, PodEvict)
        meta = pod["metadata"]
        call = Call("create", "pods/eviction", self.namespace, meta["name"])
        deadline = time.monotonic() + self.spec.retry_for
        while True:
            status, body = await self.api.evict_pod(self.namespace, meta["name"], meta["uid"], grace)
            if status < 300:
                return None
            if status != 429:
                raise refusal(status, body, call, server=self.api.server, error=FaultError)
            if time.monotonic() < deadline:
                await asyncio.sleep(EVICT_RETRY_S)
                continue
            try:
                budgets = [b for b in await self.api.list_budgets(self.namespace)
                           if selects((b.get("spec") or {}).get("selector"), meta.get("labels") or {})]
            except ChaosError:
                budgets = []  # the refusal still says what it can
            error = budget_refusal(body, call, budgets, retried_s=self.spec.retry_for)
            if self.spec.on_refused == "record":
                return str(error)
            raise error

    async def revert(self) -> dict[str, Any]:
        if self.api is None or self._reverted:
            return {"skipped": "not injected" if self.api is None else "already reverted"}
        self._reverted = True
        evidence: dict[str, Any] = {}
        try:
            if self._task is not None:
                if not self._task.done() and self._acted_ns is None and not self._victims:
                    self._task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._task
                    return {"cancelled": True, "why": f"the phase ended before {self.spec.action} at {self.spec.at:g}s"}
                try:
                    async with asyncio.timeout(REVERT_WAIT_S):
                        evidence.update(await asyncio.shield(self._task))
                except Exception as exc:  # noqa: BLE001 - the action's failure, not the revert's: the runner reported it
                    # when it happened (``scheduled``); nothing to undo
                    evidence["error"] = f"{type(exc).__name__}: {exc}"
            evidence.update(self.followed())
            return evidence
        finally:
            await self._close()

    def followed(self) -> dict[str, Any]:
        """What the watch saw after the first request: each victim terminating and gone, the pods that
        replaced them and when each became Ready (``*_s``: seconds after that first request)."""
        if self._acted_ns is None:
            return {"pods": list(self._victims)}
        origin = self._acted_ns
        victims = {v["uid"] for v in self._victims}
        history = self.watch.history
        replaced = [h.as_evidence(origin) for h in history.values()
                    if h.uid not in victims and h.first_seen_ns > origin]
        serving = len(self.watch.serving())
        pods = []
        for victim in self._victims:
            seen = history[victim["uid"]].as_evidence(origin) if victim["uid"] in history else {}
            pods.append({**victim, "terminating_s": seen.get("terminating_s"), "gone_s": seen.get("gone_s")})
        return {
            "times_from": "the first request", "pods": pods,
            "replacements": sorted(replaced, key=lambda r: r["seen_s"] or 0),
            "serving_at_revert": serving, "serving_before": self._before, "capacity_back": serving >= self._before,
        }

    async def _close(self) -> None:
        if self.watch is not None:
            await self.watch.stop()
        if self.api is not None:
            await self.api.close()


@register
@dataclass(frozen=True, kw_only=True)
class Scale(Fault):
    """Set a Deployment's replicas while the phase lasts; restore them if they are still ours."""

    kind = "k8s.scale"
    summary = ("set a Deployment's replicas for the phase; restored on revert only while uid and replicas are "
               "still the run's")
    schema = Schema(params=(
        Param("deployment", "str", required=True, doc="the Deployment, in the target's namespace"),
        Param("replicas", "int", required=True, min=0, doc="its replicas while the fault is in force"),
    ))
    rbac_rules = (
        Rule("apps", "deployments", ("get",),
             "read the deployment's uid, replicas and readiness, before and at revert"),
        Rule("apps", "deployments/scale", ("update",),
             "set the replicas and restore them (compare-and-set on resourceVersion)"),
    )

    deployment: str
    replicas: int

    def rbac(self) -> tuple[Rule, ...]:
        """Only on the Deployment it names (``resourceNames``): a Role that lets it scale one lets it scale no other."""
        return tuple(replace(rule, names=(self.deployment,)) for rule in self.rbac_rules)

    def problems(self, experiment: Any) -> list[tuple[str, str]]:
        return _needs_cluster(self.kind, experiment)

    def cluster_reach(self, cluster: ClusterRef) -> tuple[Reach, ...]:
        # what it scales is the pods of the Deployment's template: their labels must be allowed, whatever
        # the target's pods are (``chaos.k8s.gate`` reads the Deployment before anything starts)
        templates = dict(cluster.templates)
        what = f"fault {self.name} ({self.kind}, deployment {self.deployment})"
        if self.deployment not in templates:
            return (Reach(what + ", whose pod template was not read", namespace=cluster.namespace),)
        return (Reach(f"{what}, pod template", namespace=cluster.namespace,
                      selector=templates[self.deployment] or None),)

    def activate(self, ctx: RunContext) -> Injection:
        _cluster(self.kind, ctx)
        return _Scaled(self, ctx)

    def describe(self, scene: Scene) -> FaultAccount:
        cluster = scene.target.cluster
        where = f" in namespace {cluster.namespace}" if cluster is not None else ""
        return FaultAccount(
            changes=f"sets Deployment {self.deployment}{where} to {self.replicas} replicas. API calls: get deployments/"
                    f"{self.deployment}, update deployments/{self.deployment}/scale "
                    "(compare-and-set on its resourceVersion)",
            undo="restored at the phase's end to the replicas it had, only while it is the same object still at "
                 f"{self.replicas} (an HPA or a person who changed it since is left alone); a watchdog restores it "
                 "if the runner dies, `streamchaos rollback` after a crash")

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        """Restore the replicas in another process, with the configured cluster (never one the journal names)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        from chaos.k8s.client import sync_client
        from chaos.k8s.errors import Call, refusal

        api_client, server, source = sync_client()
        namespace, name = str(undo["namespace"]), str(undo["deployment"])
        if undo.get("api_server") and undo["api_server"] != server:
            raise ChaosError(f"the run scaled deployment {name} through the API server {undo['api_server']}, "
                             f"but the configuration here ({source}) reaches {server}: point STREAMCHAOS_KUBECONFIG "
                             "(or KUBECONFIG) and STREAMCHAOS_KUBE_CONTEXT at the run's cluster; nothing was changed")
        apps = client.AppsV1Api(api_client)
        try:
            for _ in range(3):
                dep = api_client.sanitize_for_serialization(apps.read_namespaced_deployment(name, namespace,
                                                                                            _request_timeout=15))
                why = _not_ours(dep, undo)
                if why is not None:
                    return {"restored": False, "why": why}
                try:
                    apps.replace_namespaced_deployment_scale(name, namespace, client.V1Scale(
                        api_version="autoscaling/v1", kind="Scale",
                        spec=client.V1ScaleSpec(replicas=int(undo["replicas_before"])),
                        metadata=client.V1ObjectMeta(name=name, namespace=namespace,
                                                     resource_version=dep["metadata"]["resourceVersion"])),
                        _request_timeout=15)
                except ApiException as exc:
                    if exc.status == 409:
                        continue  # changed between the read and the write: read and check again
                    raise
                return {"restored": True, "replicas": int(undo["replicas_before"]), "deployment": name,
                        "namespace": namespace}
            return {"restored": False, "why": "the deployment kept changing (409 three times); restore it by hand"}
        except ApiException as exc:
            raise refusal(int(exc.status or 0), exc.body, Call("update", "deployments/scale", namespace, name, "apps"),
                          server=server) from None
        finally:
            api_client.close()


def _not_ours(deployment: Mapping[str, Any], undo: Mapping[str, Any]) -> str | None:
    """Why the live deployment is no longer this run's change (so a restore must leave it alone), or None. Pure."""
    meta, spec = deployment.get("metadata") or {}, deployment.get("spec") or {}
    if undo.get("uid") and meta.get("uid") != undo["uid"]:
        return (f"deployment {meta.get('name')} is another object now (uid {meta.get('uid')}, "
                f"the run scaled {undo['uid']}): left alone")
    current = int(spec.get("replicas", 1))
    if current != int(undo["replicas_set"]):
        return (f"deployment {meta.get('name')} has {current} replicas, not the {undo['replicas_set']} this run set: "
                "someone (an HPA, a person) changed it since; left alone")
    return None


class _Scaled(Injection):
    """One phase's replica change: the count before, the compare-and-set, the restore."""

    outlives_runner = True  # a scaled-down deployment stays so after the runner dies: the watchdog restores it

    def __init__(self, fault: Scale, ctx: RunContext) -> None:
        super().__init__(fault, ctx)
        self.spec = fault
        self.cluster: ClusterRef = _cluster(fault.kind, ctx)
        self.namespace: str = self.cluster.namespace
        self.undo: dict[str, Any] = {}
        self.api: Any = None
        self._follow: asyncio.Task[None] | None = None
        self._settled_after: float | None = None
        self._t0 = 0
        self._reverted = False

    def plan(self) -> dict[str, Any]:
        """Reads the deployment synchronously (one GET), so that the journal holds the replica count to
        restore before anything changes: a runner killed mid-inject still leaves a complete undo."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        from chaos.k8s.client import sync_client
        from chaos.k8s.errors import Call, refusal

        api_client, server, _ = sync_client(self.cluster.kubeconfig, self.cluster.context)
        try:
            dep = api_client.sanitize_for_serialization(client.AppsV1Api(api_client).read_namespaced_deployment(
                self.spec.deployment, self.namespace, _request_timeout=10))
        except ApiException as exc:
            raise refusal(int(exc.status or 0), exc.body,
                          Call("get", "deployments", self.namespace, self.spec.deployment, "apps"),
                          server=server) from None
        finally:
            api_client.close()
        self.undo = {"namespace": self.namespace, "deployment": self.spec.deployment, "uid": dep["metadata"]["uid"],
                     "replicas_before": int((dep.get("spec") or {}).get("replicas", 1)),
                     "replicas_set": self.spec.replicas, "api_server": self.cluster.server}
        return dict(self.undo)

    async def inject(self) -> dict[str, Any]:
        from chaos.k8s.client import KubeApi

        self._t0, self._reverted, self._settled_after = time.monotonic_ns(), False, None
        self.api = await KubeApi.connect(self.cluster.kubeconfig, self.cluster.context, error=FaultError)
        for _ in range(3):
            dep = await self.api.read_deployment(self.namespace, self.spec.deployment)
            before = int((dep.get("spec") or {}).get("replicas", 1))
            # what it is now, if it moved since the plan
            self.undo.update(uid=dep["metadata"]["uid"], replicas_before=before)
            try:
                scale = await self.api.replace_scale(self.namespace, self.spec.deployment, self.spec.replicas,
                                                     dep["metadata"]["resourceVersion"])
                break
            except FaultError as exc:
                if getattr(exc, "http_status", None) != 409:
                    raise
        else:
            raise FaultError(f"k8s.scale: deployment {self.spec.deployment} kept changing while it was scaled "
                             "(409 three times)")
        self._follow = asyncio.create_task(self._settle(), name=f"{self.name}-follow")
        return {"deployment": self.spec.deployment, "namespace": self.namespace, "uid": self.undo["uid"],
                "replicas_before": before, "replicas_set": self.spec.replicas,
                "ready_before": int((dep.get("status") or {}).get("readyReplicas", 0)),
                "resource_version": (scale.get("metadata") or {}).get("resourceVersion"), "undo": dict(self.undo)}

    async def _settle(self) -> None:
        """When the deployment's pods matched the new count (ready == replicas == set)."""
        while True:
            await asyncio.sleep(FOLLOW_POLL_S)
            with contextlib.suppress(ChaosError):
                status = (await self.api.read_deployment(self.namespace, self.spec.deployment)).get("status") or {}
                if (int(status.get("replicas", 0)) == self.spec.replicas
                        and int(status.get("readyReplicas", 0)) == self.spec.replicas):
                    self._settled_after = round((time.monotonic_ns() - self._t0) / 1e9, 3)
                    return

    async def revert(self) -> dict[str, Any]:
        if self.api is None or self._reverted:
            return {"skipped": "not injected" if self.api is None else "already reverted"}
        self._reverted = True
        try:
            if self._follow is not None:
                self._follow.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._follow
            settled = {"settled_after_s": self._settled_after}
            for _ in range(3):
                dep = await self.api.read_deployment(self.namespace, self.spec.deployment)
                why = _not_ours(dep, self.undo)
                if why is not None:
                    return {"restored": False, "why": why, **settled}
                try:
                    await self.api.replace_scale(self.namespace, self.spec.deployment,
                                                 int(self.undo["replicas_before"]), dep["metadata"]["resourceVersion"])
                except FaultError as exc:
                    if getattr(exc, "http_status", None) == 409:
                        continue
                    raise
                return {"restored": True, "replicas": self.undo["replicas_before"], "deployment": self.spec.deployment,
                        "ready_at_revert": int((dep.get("status") or {}).get("readyReplicas", 0)), **settled}
            raise FaultError(f"k8s.scale: deployment {self.spec.deployment} kept changing at revert (409 three times)")
        finally:
            await self.api.close()
