"""Following a set of pods as the API server reports them: list, then watch from that resourceVersion.

``PodWatch`` keeps the current pods (by uid) and, per pod, when it was first seen, first served
(Ready and not terminating), began terminating and was gone, each on the runner's monotonic clock
when the event arrived. A watch window the server ends is reopened from the last resourceVersion; a
410 Expired relists (and reports as gone whatever vanished meanwhile). With a sink, every change of
what a pod *is* (phase, readiness, restarts, terminating) becomes a ``Note`` ``k8s_pod``, and every
change of the counts becomes ``MetricSample``s: ``streamchaos_k8s_pods_ready`` (serving),
``streamchaos_k8s_pods`` (not terminating), ``streamchaos_k8s_pods_terminating`` and
``streamchaos_k8s_restarts`` (container restarts summed over the pods that exist).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from chaos.k8s.client import KubeApi
from chaos.k8s.pods import pod_facts, restarts, serving, terminating
from chaos.model.errors import ChaosError
from chaos.model.observations import MetricSample, Note

__all__ = ["PodHistory", "PodWatch"]

Sink = Callable[[MetricSample | Note], None]
RETRY_S = (0.5, 1.0, 2.0, 5.0)  # after a failed watch; the run bounds how long this goes on


@dataclass
class PodHistory:
    """One pod's life as this watch saw it (monotonic ns; None: not yet)."""

    name: str
    uid: str
    first_seen_ns: int
    served_ns: int | None = None  # first time Ready and not terminating
    terminating_ns: int | None = None
    gone_ns: int | None = None

    def as_evidence(self, origin_ns: int) -> dict[str, Any]:
        """Its times in seconds after ``origin_ns`` (a fault's first request), for evidence."""
        def rel(t: int | None) -> float | None:
            return None if t is None else round((t - origin_ns) / 1e9, 3)

        return {"name": self.name, "uid": self.uid, "seen_s": rel(self.first_seen_ns), "ready_s": rel(self.served_ns),
                "terminating_s": rel(self.terminating_ns), "gone_s": rel(self.gone_ns)}


class PodWatch:
    """The pods of ``labels`` in ``namespace``, kept current while started."""

    def __init__(self, api: KubeApi, namespace: str, labels: Mapping[str, str], sink: Sink | None = None) -> None:
        self.api = api
        self.namespace = namespace
        self.labels = dict(labels)
        self.sink = sink
        self.pods: dict[str, dict[str, Any]] = {}
        self.history: dict[str, PodHistory] = {}
        self.resource_version = ""
        self.errors: list[str] = []
        self._facts: dict[str, dict[str, Any]] = {}
        self._counts: tuple[int, int, int, int] | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- life --------------------------------------------------------------------------------------------
    async def start(self) -> None:
        await self._relist()
        self._task = asyncio.create_task(self._follow(), name=f"k8s-watch-{self.namespace}")

    async def stop(self) -> None:
        """End the watch; a cancellation a library swallows is delivered again, so this never hangs."""
        task, self._task = self._task, None
        if task is None:
            return
        for _ in range(20):
            task.cancel()
            await asyncio.wait({task}, timeout=0.5)
            if task.done():
                break
        with contextlib.suppress(asyncio.CancelledError, Exception):
            if task.done():
                task.result()

    # -- what it knows -----------------------------------------------------------------------------------
    def serving(self) -> list[dict[str, Any]]:
        """Pods a Service would route to now, by name."""
        return sorted((p for p in self.pods.values() if serving(p)), key=lambda p: p["metadata"]["name"])

    def counts(self) -> tuple[int, int, int, int]:
        """(serving, not terminating, terminating, restarts summed)."""
        pods = list(self.pods.values())
        return (sum(1 for p in pods if serving(p)), sum(1 for p in pods if not terminating(p)),
                sum(1 for p in pods if terminating(p)), sum(restarts(p) for p in pods))

    def describe(self) -> str:
        """``web-1 (Ready), web-2 (Running, not ready)`` — for error messages."""
        if not self.pods:
            return "no pods"
        return ", ".join(f"{p['metadata']['name']} ({(p.get('status') or {}).get('phase', '?')}"
                         f"{', terminating' if terminating(p) else ', ready' if serving(p) else ', not ready'})"
                         for p in sorted(self.pods.values(), key=lambda p: p["metadata"]["name"]))

    async def wait_for(self, predicate: Callable[[PodWatch], bool], timeout: float) -> bool:
        """Until ``predicate(self)`` holds (True) or ``timeout`` seconds pass (False)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self._changed.clear()  # before the check: a change after it wakes the wait below
            if predicate(self):
                return True
            left = deadline - loop.time()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._changed.wait()

    # -- keeping it current ------------------------------------------------------------------------------
    async def _relist(self) -> None:
        items, self.resource_version = await self.api.list_pods(self.namespace, self.labels)
        listed = {p["metadata"]["uid"]: p for p in items}
        for uid, pod in list(self.pods.items()):
            if uid not in listed:
                self._apply("DELETED", pod)
        for pod in items:
            self._apply("MODIFIED" if pod["metadata"]["uid"] in self.pods else "ADDED", pod)

    async def _follow(self) -> None:
        failures = 0
        while True:
            try:
                async for event in self.api.watch_pods(self.namespace, self.labels, self.resource_version):
                    failures = 0
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:  # our resourceVersion expired: start over from a list
                            await self._relist()
                            break
                        raise ChaosError(f"watch error from the API server: {obj.get('message') or obj}")
                    version = (obj.get("metadata") or {}).get("resourceVersion")
                    if kind != "BOOKMARK":
                        self._apply(str(kind), obj)
                    if version:
                        self.resource_version = str(version)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a watch that fails is retried (and recorded), never fatal
                failures += 1
                message = f"{type(exc).__name__}: {exc}"
                self.errors.append(message)
                self._emit(Note(topic="k8s_watch_error", t=time.monotonic_ns(),
                                data={"error": message, "failures": failures}))
                await asyncio.sleep(RETRY_S[min(failures, len(RETRY_S)) - 1])
                with contextlib.suppress(Exception):  # maybe events were missed: relist
                    await self._relist()

    def _apply(self, kind: str, pod: dict[str, Any]) -> None:
        now = time.monotonic_ns()
        meta = pod.get("metadata") or {}
        uid, name = str(meta.get("uid")), str(meta.get("name"))
        history = self.history.get(uid)
        if history is None:
            history = self.history[uid] = PodHistory(name=name, uid=uid, first_seen_ns=now)
        if kind == "DELETED":
            self.pods.pop(uid, None)
            if history.gone_ns is None:
                history.gone_ns = now
            if history.terminating_ns is None:
                history.terminating_ns = now
        else:
            self.pods[uid] = pod
            if serving(pod) and history.served_ns is None:
                history.served_ns = now
            if terminating(pod) and history.terminating_ns is None:
                history.terminating_ns = now
        facts = pod_facts(pod)
        facts.pop("created", None)
        if kind == "DELETED" or self._facts.get(uid) != facts:
            self._facts[uid] = facts
            self._emit(Note(topic="k8s_pod", t=now, data={"event": kind, "namespace": self.namespace, **facts}))
            if kind == "DELETED":
                self._facts.pop(uid, None)
        self.record_counts(now)
        self._changed.set()

    def record_counts(self, now: int | None = None, *, force: bool = False) -> None:
        """The counts as samples when they changed (or ``force``: e.g. at the end, so a series reaches it)."""
        counts = self.counts()
        if counts != self._counts or force:
            self._counts = counts
            t = time.monotonic_ns() if now is None else now
            for series, value in zip(("streamchaos_k8s_pods_ready", "streamchaos_k8s_pods",
                                      "streamchaos_k8s_pods_terminating",
                                      "streamchaos_k8s_restarts"), counts, strict=True):
                self._emit(MetricSample(name=series, labels={"namespace": self.namespace}, value=float(value), t=t))

    def _emit(self, record: MetricSample | Note) -> None:
        if self.sink is not None:
            self.sink(record)
