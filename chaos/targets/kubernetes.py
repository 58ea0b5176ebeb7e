"""``target.kind: kubernetes``: an inference Service (or labelled pods) in a namespace.

Start: connect to the API server (``chaos.k8s.client``), read the Service (its selector and port)
when one is named, list and watch the pods, wait until at least one serves (``startup_timeout``),
then make the URL the load uses, by ``access``:

- ``service``: the Service's ClusterIP and port (kube-proxy balances; inside the cluster);
- ``endpoints``: a loopback relay to the ready pods' IPs (inside the cluster; balanced here);
- ``port-forward``: a loopback relay whose connections travel through the API server to the ready
  pods (from a laptop or CI runner outside the cluster; what ``kubectl port-forward`` does, but to
  every ready pod in turn instead of one);
- ``auto``: ``service`` in a pod (no kubeconfig, a mounted service-account token), else ``port-forward``.

``target.url`` (or ``--target-url``) overrides the load's URL (an ingress, a gateway); the pods are
still watched and the ``k8s.*`` faults still act on them. The builtin stack's admin API is not used
through a Kubernetes target (its requests would reach one pod of several): the in-process faults
(``server.*``, ``kv.pressure`` by reservation) refuse it, as for any target without an admin API.
While the run observes, the pods' changes are recorded (``chaos.k8s.watch``) and each serving pod's
``/metrics`` is scraped on its own (every
sample labelled ``pod``, one timestamp per round, so a sum over a timestamp is the whole target).

A dry run (``resolved_cluster_target``) resolves the target with read-only calls only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import httpx

from chaos.host.cadence import next_tick
from chaos.host.capped import METRICS_LIMIT, get_capped
from chaos.host.tls import tls_context
from chaos.k8s.client import CONTEXT_ENV, INCLUSTER_TOKEN, KUBECONFIG_ENV, KubeApi, config_source, default_namespace
from chaos.k8s.errors import ServerErrors
from chaos.k8s.relay import DirectDial, ForwardDial, Relay
from chaos.k8s.watch import PodWatch
from chaos.model.context import ClusterRef, TargetInfo
from chaos.model.errors import ChaosError, ExperimentInvalid, SetupFailed, TargetNotAllowed, TargetUnreachable
from chaos.model.observations import MetricSample, Note
from chaos.model.params import Param, Schema
from chaos.model.units import format_duration
from chaos.targets.base import (
    COMMON_SECTION,
    Account,
    RemoteTarget,
    SupportColumn,
    Target,
    TargetStart,
    target_kind,
)
from chaos.targets.scraper import parse_exposition

if TYPE_CHECKING:
    from chaos.k8s.gate import ClusterGate
    from chaos.model.experiment import Experiment, KubernetesSpec, TargetSpec

__all__ = ["KubernetesTarget", "resolve_access", "resolved_cluster_target", "service_port"]

Sink = Callable[[MetricSample | Note], None]


def resolve_access(spec: KubernetesSpec, environ: dict[str, str] | None = None) -> str:
    """``auto`` as ``service`` inside a pod (no kubeconfig to use, a service-account token mounted),
    ``port-forward`` elsewhere; any other value as given."""
    if spec.access != "auto":
        return spec.access
    env = dict(os.environ if environ is None else environ)
    in_pod = bool(env.get("KUBERNETES_SERVICE_HOST")) and INCLUSTER_TOKEN.is_file()
    return "service" if in_pod and config_source(spec.kubeconfig, env) is None else "port-forward"


def service_port(service: dict[str, Any], wanted: int | str | None) -> dict[str, Any]:
    """The Service port ``wanted`` names (its name or number; the only one when None). Pure."""
    ports = (service.get("spec") or {}).get("ports") or []
    name = (service.get("metadata") or {}).get("name")
    if not ports:
        raise SetupFailed(f"Service {name} has no ports")
    if wanted is None:
        if len(ports) > 1:
            raise ExperimentInvalid(f"Service {name} has {len(ports)} ports "
                                    f"({', '.join(str(p.get('name') or p['port']) for p in ports)}): say which one in "
                                    "target.kubernetes.port")
        return dict(ports[0])
    for port in ports:
        if wanted in (port.get("name"), port.get("port")):
            return dict(port)
    raise ExperimentInvalid(f"Service {name} has no port {wanted!r}; its ports: "
                            f"{', '.join(str(p.get('name') or p['port']) for p in ports)}")


@target_kind
class KubernetesTarget(Target):
    """The pods behind a Service (or a label selector), reached as ``access`` says."""

    kind = "kubernetes"
    summary = ("the pods behind a Service (or a label selector) in a cluster, watched and scraped one by one, reached "
               "by ClusterIP, pod IPs or port-forward; neither started nor stopped")
    order = 4
    # the section's own keys are parsed by the loader (chaos.experiment.sections.KUBERNETES)
    section = Schema((*COMMON_SECTION.params, Param(
        "kubernetes", "mapping", None,
        doc="kind kubernetes: {namespace, service or selector, port, access, kubeconfig, context}")))
    support = (SupportColumn("kubernetes", "kubernetes (pods behind a Service)", {
        "client": "yes", "proxy": "yes (proxy.listen reachable)", "cluster": "yes",
    }, rank=5),)

    @classmethod
    def reached_by_url(cls, spec: TargetSpec) -> bool:
        return spec.kubernetes is None  # with a cluster section, a URL only says where the load goes

    @classmethod
    def create(cls, spec: TargetSpec, start: TargetStart) -> Target:
        return cls(spec, start.url, start.gate)

    @classmethod
    def startup_allowance_s(cls, spec: TargetSpec) -> float | None:
        # ``start`` waits up to startup_timeout for a Ready pod, then up to startup_timeout again for it to answer
        return 2 * spec.startup_timeout

    @classmethod
    async def dry_run(cls, exp: Experiment, url: str | None, probe: bool, out: Account) -> tuple[TargetInfo, bool]:
        info = await resolved_cluster_target(exp, probe, out)
        wait = format_duration(exp.target.startup_timeout)
        out.say(f"start-up allowance {format_duration(cls.startup_allowance_s(exp.target) or 0.0)} "
                f"(target.startup_timeout {wait} for a pod to be Ready, then {wait} for it to answer)", 1)
        return info, False

    def __init__(self, spec: TargetSpec, url: str | None, gate: ClusterGate | None = None) -> None:
        assert spec.kubernetes is not None
        self.gate = gate  # the allow-list, applied before the first call and once the target is resolved
        self.spec = spec
        self.kube: KubernetesSpec = spec.kubernetes
        self.url_override = url
        self.access = "url" if url else resolve_access(self.kube)
        self.info = TargetInfo(kind="kubernetes", base_url=url or "", model=spec.model)
        self.api: KubeApi | None = None
        self.watch: PodWatch | None = None
        self.relay: Relay | None = None
        self.labels: dict[str, str] = dict(self.kube.selector)
        self.pod_port: int | str | None = self.kube.port
        self.namespace = self.kube.namespace or ""
        self._pending: list[MetricSample | Note] = []  # what the watch saw before the run started observing
        self._sink: Sink | None = None
        self._dial_errors = 0

    # -- start and stop ----------------------------------------------------------------------------------
    async def start(self) -> TargetInfo:
        kube = self.kube
        self.api = api = await KubeApi.connect(kube.kubeconfig, kube.context, error=SetupFailed)  # configuration only
        self.namespace = namespace = kube.namespace or default_namespace(kube.kubeconfig, kube.context)
        if self.gate is not None:
            self.gate.namespace(namespace)  # before the first API call
        cluster_ip, port_number = None, None
        if kube.service:
            service = await api.read_service(namespace, kube.service)
            selector = (service.get("spec") or {}).get("selector") or {}
            if not selector:
                raise SetupFailed(f"Service {kube.service} in namespace {namespace} has no selector, so its pods "
                                  "cannot be found; give target.kubernetes.selector (and port) instead")
            self.labels = {**selector, **self.labels}
            port = service_port(service, kube.port)
            self.pod_port = port.get("targetPort", port["port"])
            port_number, cluster_ip = int(port["port"]), (service.get("spec") or {}).get("clusterIP")
        templates: tuple[tuple[str, str], ...] = ()
        if self.gate is not None:  # the pods (and any Deployment a k8s.scale names): before any is listed or reached
            templates = await self.gate.resolved(api, namespace, self.labels)
        self.watch = PodWatch(api, namespace, self.labels, self._record)
        await self.watch.start()
        if not await self.watch.wait_for(lambda w: bool(w.serving()), self.spec.startup_timeout):
            raise TargetUnreachable(f"no pod matching {self.labels} in namespace {namespace} became Ready within "
                                    f"{self.spec.startup_timeout:g}s ({self.watch.describe()})")
        base = self.url_override
        if base is None:
            base = await self._access_url(cluster_ip, port_number)
        remote = RemoteTarget(replace(self.spec, url=None),
                              base.rstrip("/") + self.kube.path if not self.url_override else base)
        # No admin API: its requests would go to whichever pod the connection lands on, so in-process
        # faults (server.*, kv.pressure by reservation) would act on one pod of several.
        remote.admin_token = None
        info = await self._first_answer(remote, time.monotonic() + self.spec.startup_timeout)
        cluster = ClusterRef(namespace=namespace, selector=tuple(sorted(self.labels.items())), service=kube.service,
                             kubeconfig=str(config_source(kube.kubeconfig) or "") or None, context=kube.context,
                             server=api.server,
                             templates=templates)
        self.info = replace(info, kind="kubernetes", cluster=cluster)
        self._record(Note(topic="k8s_target", t=time.monotonic_ns(), data={
            "namespace": namespace, "service": kube.service, "selector": self.labels, "port": self.pod_port,
            "access": self.access, "url": self.info.base_url, "api_server": api.server, "config": api.source}))
        return self.info

    async def _first_answer(self, remote: RemoteTarget, deadline: float) -> TargetInfo:
        """``/v1/models`` through the access path, tried until ``deadline``: a pod that just crashed still
        counts as Ready until its probe fails, so one refused connection says little. A 401 or 403 stops
        it at once; a 5xx the API server gives every attempt stops it after a few seconds (``ServerErrors``:
        the tries spaced out, then the status and the server's message named)."""
        assert self.watch is not None
        server_errors = ServerErrors()
        while True:
            seen = self.relay.last_error if self.relay is not None else None
            try:
                return await remote.start()
            except TargetUnreachable:
                why = self.relay.last_error if self.relay is not None else None
                fresh = why if why is not seen else None  # met by this attempt (a relay error is a new object)
                if server_errors.failed(fresh, time.monotonic()) and isinstance(fresh, ChaosError):
                    raise server_errors.given_up(fresh) from None
                lasting = isinstance(why, ChaosError) and getattr(why, "http_status", None) in (401, 403)
                left = deadline - time.monotonic()
                if lasting or left <= 0:
                    if isinstance(why, ChaosError):
                        raise why from None  # what kept the relay from the pods (a 403 on port-forward, ...)
                    raise
                await asyncio.sleep(min(server_errors.pause_s(0.5), left))
                await self.watch.wait_for(lambda w: bool(w.serving()), max(0.0, deadline - time.monotonic()))

    async def _access_url(self, cluster_ip: str | None, port_number: int | None) -> str:
        assert self.api is not None and self.watch is not None
        if self.access == "service":
            if not self.kube.service:
                raise ExperimentInvalid("target.kubernetes.access: service needs target.kubernetes.service")
            if not cluster_ip or cluster_ip == "None":
                raise SetupFailed(f"Service {self.kube.service} is headless (no ClusterIP): use access: endpoints")
            return f"http://{cluster_ip}:{port_number}"
        if self.pod_port is None:
            raise ExperimentInvalid("target.kubernetes.port: the pods' port is needed (a number or a container port "
                                    "name)")
        dial = DirectDial() if self.access == "endpoints" else ForwardDial(self.api, self.namespace)
        self.relay = Relay(self.watch, self.pod_port, dial, self._dial_failed)
        return await self.relay.start()

    def _dial_failed(self, pod: str, exc: BaseException) -> None:
        self._dial_errors += 1
        if self._dial_errors in (1, 10, 100, 1000):
            self._record(Note(topic="k8s_relay_error", t=time.monotonic_ns(),
                              data={"pod": pod, "error": f"{type(exc).__name__}: {exc}",
                                    "failures": self._dial_errors}))

    async def stop(self) -> None:
        if self.relay is not None:
            await self.relay.close()
        if self.watch is not None:
            await self.watch.stop()
        if self.api is not None:
            await self.api.close()

    def watchdog_env(self) -> dict[str, str]:
        """What a rollback in the watchdog needs to reach the same cluster (configuration, not the journal)."""
        env = {}
        if self.info.cluster is not None and self.info.cluster.kubeconfig:
            env[KUBECONFIG_ENV] = self.info.cluster.kubeconfig
        if self.kube.context:
            env[CONTEXT_ENV] = self.kube.context
        return env

    # -- observing -----------------------------------------------------------------------------------------
    def _record(self, record: MetricSample | Note) -> None:
        if self._sink is None:
            self._pending.append(record)
        else:
            self._sink(record)

    @contextlib.asynccontextmanager
    async def observing(self, sink: Sink, interval: float,
                        headers: Mapping[str, str] | None = None) -> AsyncIterator[None]:
        """While entered: the pods' changes and each serving pod's metrics (scraped with ``headers``) go to ``sink``."""
        pending, self._pending, self._sink = self._pending, [], sink
        for record in pending:
            sink(record)
        task = asyncio.create_task(self._scrape_pods(sink, interval, dict(headers or {})), name="k8s-pod-scraper")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            if self.watch is not None:
                self.watch.record_counts(force=True)  # the series reach the end of the run
            self._sink = None

    async def _pod_url(self, pod: dict[str, Any]) -> str | None:
        if self.relay is not None:
            return await self.relay.pod_url(pod)
        port = self.pod_port
        if isinstance(port, str):
            from chaos.k8s.pods import container_port

            port = container_port(pod, port)
        ip = (pod.get("status") or {}).get("podIP")
        if port is None or not ip:
            return None
        return DirectDial().url(pod, port)

    async def _scrape_pods(self, sink: Sink, interval: float, headers: dict[str, str]) -> None:
        """Each serving pod's /metrics every ``interval``, in parallel; samples labelled with the pod."""
        assert self.watch is not None
        failures: dict[str, int] = {}
        async with httpx.AsyncClient(timeout=max(1.0, 4 * interval), trust_env=False, verify=tls_context(),
                                     headers=headers) as client:
            next_t = next_tick(interval, time.monotonic()) - interval  # at once, then on the shared ticks
            while True:
                t = time.monotonic_ns()
                pods = self.watch.serving()
                texts = await asyncio.gather(*(self._scrape_one(client, pod) for pod in pods), return_exceptions=True)
                for pod, text in zip(pods, texts, strict=True):
                    name = pod["metadata"]["name"]
                    if isinstance(text, BaseException) or text is None:
                        failures[name] = failures.get(name, 0) + 1
                        if failures[name] in (1, 10, 100):
                            sink(Note(topic="scrape_error", t=t,
                                      data={"pod": name, "error": repr(text), "failures": failures[name]}))
                        continue
                    for sample in parse_exposition(text, t):
                        sink(replace(sample, labels={**sample.labels, "pod": name}))
                next_t += interval
                now = time.monotonic()
                if next_t < now:
                    next_t += interval * ((now - next_t) // interval + 1)
                await asyncio.sleep(next_t - now)

    async def _scrape_one(self, client: httpx.AsyncClient, pod: dict[str, Any]) -> str | None:
        url = await self._pod_url(pod)
        if url is None:
            return None
        response = await get_capped(client, url + "/metrics", limit=METRICS_LIMIT, deadline=client.timeout.read or 5.0)
        if response.status_code >= 400:
            raise ValueError(f"HTTP {response.status_code}")
        if response.over:
            raise ValueError(response.too_large())
        return response.text


# -- a dry run's account ---------------------------------------------------------------------------------
def _refused(out: Account, exc: TargetNotAllowed) -> None:
    for line in str(exc).splitlines()[1:] or [str(exc)]:
        out.say(f"REFUSED: {line.strip()}", 1)
    out.worst(2)


async def resolved_cluster_target(exp: Experiment, probe: bool, out: Account) -> TargetInfo:
    """A dry run's account of the target, resolved with read-only calls in the order a run makes them,
    stopping where a run would be refused: the namespace against ``safety.allowed_targets`` (before any
    call), ``get`` the Service (its selector and port), ``get`` each Deployment a ``k8s.scale`` names (its
    pod template against the allow-list), then ``list`` the pods; each call recorded in ``out.contacted``.
    Nothing is watched, port-forwarded to, deleted, evicted or scaled. The target as the run would
    resolve it (``probe``: the allow-list let it be read at all)."""
    from chaos.model.allowlist import format_selector

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
