"""A small Kubernetes API server for the tests: the real wire format, real pods as local processes.

No real API server can run on the CI machines (no image registry, no Go modules), so the cluster
code is tested through the official ``kubernetes`` client against this one. It speaks what that
client and ``kubectl`` expect, as the Kubernetes API reference describes it (404s, 409s on stale
updates, pod replacement and scaling were compared with a real kube-apiserver 1.36), and
``test_apiserver_wire.py`` runs the same checks against a real cluster when one is given:

- objects as a real server returns them: ``metadata.uid``, ``resourceVersion`` (a string, one global
  counter), ``creationTimestamp``, ``generation``, ``ownerReferences`` (``controller: true``),
  ``deletionTimestamp``/``deletionGracePeriodSeconds`` while a pod terminates;
- list and watch (``?watch=true&resourceVersion=RV``: one JSON event per line in a chunked body,
  ``ADDED``/``MODIFIED``/``DELETED``/``BOOKMARK``, an ``ERROR`` event with a 410 ``Expired`` Status for
  a resourceVersion older than the event log, ``timeoutSeconds``), label selectors;
- ``Status`` objects for 401/403/404/409/410/422/429, the 403 message as RBAC writes it;
- create, get, update (409 ``Conflict`` on a stale resourceVersion), merge/strategic/JSON patch, delete;
- the ``pods/eviction`` subresource (201; 429 ``TooManyRequests`` with a ``DisruptionBudget`` cause when
  a PodDisruptionBudget allows no disruption), ``deployments/scale`` (``autoscaling/v1`` Scale),
  ``serviceaccounts/token`` (TokenRequest), ``pods/portforward`` over WebSocket (``v4.channel.k8s.io``),
  authorized as a real 1.30+ server does: ``get`` in the authorization filter, then ``create`` on the upgrade;
- an audit log of every request (user, verb, resource, namespace, name), read by the admin at ``/_fake/audit``;
- RBAC: a token from TokenRequest acts as its ServiceAccount and may do exactly what the Roles bound
  to it in that namespace allow; the admin token (in the kubeconfig this server writes) may do all;
- controllers: a Deployment keeps one ReplicaSet whose pods it replaces as soon as one terminates and
  scales up or down (not-ready and newest pods first); PodDisruptionBudget status; Services get a
  ClusterIP with a kube-proxy-like relay to their ready pods; deleting a Namespace deletes its objects.

The pods are real. The fake's kubelet runs a pod's container ``command`` + ``args`` as a local
process (the image is ignored: ``python`` is this interpreter, ``streamchaos`` its console script),
gives each pod its own loopback address as its pod IP (``127.X.Y.Z``; every process shares this
host's network namespace, so an argument ``0.0.0.0`` -- all of the pod's interfaces -- becomes that
address), expands ``$(VAR)`` and the downward API (``status.podIP``, ``metadata.name``...), probes
``readinessProbe.httpGet``/``tcpSocket`` every ``periodSeconds`` from the node (this process, to
the pod's IP), restarts a container that exits (``restartCount``; a replacement can become Ready
and drop again), and on delete sends SIGTERM to the container's first process, then SIGKILL to all
of them after the grace period. So a deleted pod really cuts its streams, and its replacement
really starts and becomes Ready.

Where a fault or a verdict depends on it, it behaves as a real 1.36 cluster was seen to
(reference/nvml-k8s.md, "How a real cluster behaved"): a delete with ``gracePeriodSeconds: 0``
emits MODIFIED (``deletionTimestamp`` set) then DELETED at once, while the process keeps running,
holding its connections and port, up to the kubelet's minimum grace (2 s); a first process without a
SIGTERM handler is PID 1 of its container, which ignores the signal, so it lives out the whole grace
(the fake reads its handlers from ``/proc/PID/status``); a crashed container restarts at once, then
after CrashLoopBackOff waits of 10 s, 20 s... up to 300 s; a malformed label or field selector is a
400 ``BadRequest``; a new pod is Pending
until the scheduler binds it; a PodDisruptionBudget's status is written by its controller after a
delay (until then, and while it allows none, an eviction is a 429), a pod that is Running but not
Ready is evicted as ``unhealthyPodEvictionPolicy: IfHealthyBudget`` says; a deleted namespace stays
Terminating a while. Each timing has an annotation to set it per object (``SCHEDULE_DELAY``,
``CRASH_BACKOFF``, ``CRASH_BACKOFF_MAX``, ``PDB_SYNC``, ``NAMESPACE_FINALIZE`` below; their defaults
are the real cluster's), and ``PORTFORWARD_STATUS`` on a pod makes every port-forward to it a 500, as
a node without an address made them.

Run: ``python tests/k8s/fake_apiserver.py --dir DIR`` prints ``READY <port>`` once it listens and
writes ``DIR/kubeconfig`` (admin). It stops its pods on SIGTERM/SIGINT, and they die with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import ctypes
import fcntl
import hashlib
import itertools
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import WSMsgType, web

# --- resources -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


KINDS = [
    Kind("", "v1", "namespaces", "Namespace", namespaced=False),
    Kind("", "v1", "pods", "Pod"),
    Kind("", "v1", "services", "Service"),
    Kind("", "v1", "serviceaccounts", "ServiceAccount"),
    Kind("", "v1", "configmaps", "ConfigMap"),
    Kind("apps", "v1", "deployments", "Deployment"),
    Kind("apps", "v1", "replicasets", "ReplicaSet"),
    Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget"),
    Kind("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    Kind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
]
BY_PATH = {(k.group, k.version, k.plural): k for k in KINDS}
SUBRESOURCES = {("pods", "eviction"), ("pods", "portforward"), ("deployments", "scale"), ("serviceaccounts", "token"),
                ("pods", "status"), ("deployments", "status")}
EVENT_LOG = 4000  # watch events kept; an older resourceVersion gets 410 Expired
# the kubelet's minimum grace: a delete with gracePeriodSeconds 0 still gets it (logged gracePeriod=2)
MIN_GRACE_S = 2.0
# Timings a real cluster has, each overridable per pod (or budget, or namespace) by an annotation:
SCHEDULE_DELAY = "fake.streamchaos.dev/schedule-delay-s"  # a new pod is Pending this long before the scheduler binds it
# CrashLoopBackOff's first wait, after the restart at once the first crash gets (doubling up to the most)
CRASH_BACKOFF = "fake.streamchaos.dev/crash-backoff-s"
# the most (kubelet crashLoopBackOff.maxContainerRestartPeriod)
CRASH_BACKOFF_MAX = "fake.streamchaos.dev/crash-backoff-max-s"
PDB_SYNC = "fake.streamchaos.dev/pdb-sync-s"  # a new PodDisruptionBudget's status is first written this long after
NAMESPACE_FINALIZE = "fake.streamchaos.dev/finalize-s"  # a deleted namespace stays Terminating at least this long
# A pod whose port-forwards the API server answers with this HTTP status (500: a real 1.36 cluster did for
# every attempt while the pod's node had no address), after both authorization checks pass
PORTFORWARD_STATUS = "fake.streamchaos.dev/portforward-status"
DEFAULTS = {SCHEDULE_DELAY: 0.2, CRASH_BACKOFF: 10.0, CRASH_BACKOFF_MAX: 300.0, PDB_SYNC: 1.0, NAMESPACE_FINALIZE: 1.0}
POD_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what the ReplicaSet controller's suffixes are made of


def timing(obj: dict[str, Any], key: str) -> float:
    """One of the timings above for ``obj``: its annotation, else the default."""
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
    try:
        return float(value) if value is not None else DEFAULTS[key]
    except ValueError:
        return DEFAULTS[key]


def now_rfc3339(offset_s: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=offset_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    """A Status response."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details is not None:
            body["details"] = self.details
        return body


def not_found(kind: Kind, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{kind.plural}{"." + kind.group if kind.group else ""} "{name}" not found',
                    {"name": name, "group": kind.group, "kind": kind.plural})


def invalid(kind: Kind, name: str, field_path: str, message: str) -> ApiError:
    return ApiError(422, "Invalid", f'{kind.kind} "{name}" is invalid: {field_path}: {message}',
                    {"name": name, "group": kind.group, "kind": kind.kind,
                     "causes": [{"reason": "FieldValueInvalid", "message": message, "field": field_path}]})


def check_configmap(kind: Kind, name: str, body: dict[str, Any]) -> None:
    """What a real API server refuses in a ConfigMap: a value that is not a string (400: the body cannot be
    decoded) and a key that is not ``[-._a-zA-Z0-9]+`` (422)."""
    for field_name in ("data", "binaryData"):
        values = body.get(field_name) or {}
        if not isinstance(values, dict):
            raise ApiError(400, "BadRequest", f"json: cannot unmarshal into Go struct field ConfigMap.{field_name}")
        for key, value in values.items():
            if not isinstance(value, str):
                raise ApiError(400, "BadRequest", f"json: cannot unmarshal {type(value).__name__} into Go struct "
                               f"field ConfigMap.{field_name} of type string")
            if not re.fullmatch(r"[-._a-zA-Z0-9]+", key) or len(key) > 253:
                raise invalid(kind, name, f"{field_name}[{key}]", f'Invalid value: "{key}": a valid config key must '
                              "consist of alphanumeric characters, '-', '_' or '.'")


# --- label selectors -----------------------------------------------------------------------------------

_TOKEN = r"[^\s,=!()<>]+"  # what the API server's selector lexer reads as one identifier
_SET_EXPR = re.compile(rf"^\s*({_TOKEN})\s+(in|notin)\s*\(([^()]*)\)\s*$")
_COMPARE = re.compile(rf"^\s*({_TOKEN})\s*(==|=|!=|<|>)\s*({_TOKEN})?\s*$")
_EXISTS = re.compile(rf"^\s*(!?)\s*({_TOKEN})\s*$")
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_NAME})?$")
# the fields a field selector may name (anything else: 400 "field label not supported"), as dotted paths
FIELDS = {"metadata.name", "metadata.namespace"}
POD_FIELDS = FIELDS | {"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
                       "status.phase", "status.podIP", "status.nominatedNodeName"}


def bad_selector(text: str, why: str) -> ApiError:
    """A selector the API server cannot parse: 400 BadRequest (a real 1.36 server; never an empty match)."""
    return ApiError(400, "BadRequest", f"unable to parse requirement: {why} (in the selector {text!r})")


def _split_terms(text: str) -> list[str]:
    """The comma-separated terms of a selector, commas inside ``in (...)`` kept."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return parts


def _requirement(text: str, part: str) -> tuple[str, str, set[str]]:
    """One term of a label selector as (key, operator, values); a malformed one is a 400."""
    if m := _SET_EXPR.match(part):
        key, op, values = m.group(1), m.group(2), [v.strip() for v in m.group(3).split(",")]
    elif m := _COMPARE.match(part):
        key, op, values = m.group(1), m.group(2), [m.group(3) or ""]
        op = {"=": "in", "==": "in", "!=": "notin"}.get(op, op)
        if op in ("<", ">") and not values[0].lstrip("-").isdigit():
            raise bad_selector(text, f"for 'Gt', 'Lt' operators, the value must be an integer: {values[0]!r}")
    elif m := _EXISTS.match(part):
        key, op, values = m.group(2), "!exists" if m.group(1) else "exists", []
    else:
        raise bad_selector(text, f"cannot read {part.strip()!r}: expected KEY, !KEY, KEY=VALUE, KEY!=VALUE or "
                           "KEY in (VALUES)")
    if not _LABEL_KEY.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise bad_selector(text, f"key: Invalid value: {key!r}: a qualified name must consist of alphanumeric "
                           "characters, '-', '_' or '.', and must start and end with an alphanumeric character")
    for value in values:
        if not _LABEL_VALUE.match(value) or len(value) > 63:
            raise bad_selector(text, f"values[0][{key}]: Invalid value: {value!r}: a valid label must be an empty "
                               "string or consist of alphanumeric characters, '-', '_' or '.', and must start and "
                               "end with an alphanumeric character")
    return key, op, set(values)


def parse_selector(text: str | None) -> Callable[[dict[str, str]], bool]:
    """A label selector string (equality and set based) as a predicate on a labels mapping; a malformed
    one is a 400 ``BadRequest`` (``ApiError``), as a real API server answers it."""
    requirements: list[tuple[str, str, set[str]]] = []  # (key, operator, values)
    if text and text.strip():
        requirements = [_requirement(text, part) for part in _split_terms(text)]

    def holds(labels: dict[str, str], key: str, op: str, values: set[str]) -> bool:
        if op in ("<", ">"):
            have = labels.get(key, "")
            if not have.lstrip("-").isdigit():
                return False
            return int(have) < int(next(iter(values))) if op == "<" else int(have) > int(next(iter(values)))
        return {"in": labels.get(key) in values, "notin": labels.get(key) not in values,
                "exists": key in labels, "!exists": key not in labels}[op]

    def matches(labels: dict[str, str]) -> bool:
        return all(holds(labels, key, op, values) for key, op, values in requirements)

    return matches


def field_value(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def parse_field_selector(kind: Kind, text: str | None) -> Callable[[dict[str, Any]], bool]:
    """A field selector (``metadata.name=web-1,status.phase!=Running``) as a predicate on an object. A
    term without an operator, or a field the kind does not index, is a 400 ``BadRequest``."""
    terms: list[tuple[str, bool, str]] = []  # (field, equal, value)
    for part in _split_terms(text or "") if text and text.strip() else []:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*([^,]*?)\s*", part)
        if m is None:
            raise ApiError(400, "BadRequest", f"invalid selector: {part.strip()!r}; can't understand {part.strip()!r}")
        if m.group(1) not in (POD_FIELDS if kind.plural == "pods" else FIELDS):
            raise ApiError(400, "BadRequest", f"field label not supported: {m.group(1)}")
        terms.append((m.group(1), m.group(2) != "!=", m.group(3)))
    return lambda obj: all((field_value(obj, f) == v) is equal for f, equal, v in terms)


def object_filter(kind: Kind, query: Any) -> Callable[[dict[str, Any]], bool]:
    """What a list or watch's ``labelSelector`` and ``fieldSelector`` select, as a predicate on an object;
    both are parsed before anything is answered, so a malformed one is a 400 and never an empty list."""
    labels, fields = parse_selector(query.get("labelSelector")), parse_field_selector(kind, query.get("fieldSelector"))
    return lambda obj: labels((obj.get("metadata") or {}).get("labels") or {}) and fields(obj)


def match_labels(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector object (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist)."""
    if not selector:
        return False  # an empty selector of a PDB or Service selects nothing here
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and labels.get(key) in values) \
                or (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
            return False
    return True


# --- patches -------------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 (strategic merge patches are applied the same way: enough for scalar fields)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def json_patch(target: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 add/replace/remove/test on object paths."""
    doc = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1]
        if op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), op["value"])
            else:
                parent[last] = op["value"]
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif op["op"] == "test" and (parent[int(last)] if isinstance(parent, list)
                                     else parent.get(last)) != op["value"]:
            raise ApiError(422, "Invalid", f"the test operation on {op['path']} failed")
    return doc


# --- the store -----------------------------------------------------------------------------------------


@dataclass(eq=False)
class Watcher:
    kind: Kind
    namespace: str | None
    selector: Callable[[dict[str, Any]], bool]  # on the object: its labels and fields
    queue: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)


class Store:
    """Every object, one resourceVersion counter, the event log that watches replay."""

    def __init__(self) -> None:
        self.rv = 1000
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, ns, name) -> object
        self.log: deque[tuple[int, str, Kind, dict[str, Any]]] = deque(maxlen=EVENT_LOG)
        self.watchers: set[Watcher] = set()
        self.changed = asyncio.Event()
        self.created: dict[str, int] = {}  # uid -> resourceVersion at creation (creationTimestamp has 1s resolution)

    def next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def get(self, kind: Kind, ns: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((kind.plural, ns if kind.namespaced else "", name))

    def must(self, kind: Kind, ns: str, name: str) -> dict[str, Any]:
        obj = self.get(kind, ns, name)
        if obj is None:
            raise not_found(kind, name)
        return obj

    def list(self, kind: Kind, ns: str | None = None) -> list[dict[str, Any]]:
        return [o for (plural, o_ns, _), o in sorted(self.objects.items(), key=lambda kv: kv[0])
                if plural == kind.plural and (ns is None or o_ns == ns)]

    def _emit(self, etype: str, kind: Kind, obj: dict[str, Any]) -> None:
        snapshot = copy.deepcopy(obj)
        self.log.append((int(obj["metadata"]["resourceVersion"]), etype, kind, snapshot))
        ns = obj["metadata"].get("namespace")
        for w in list(self.watchers):
            if w.kind is kind and (w.namespace is None or w.namespace == ns) \
                    and w.selector(obj):
                w.queue.put_nowait({"type": etype, "object": snapshot})
        self.changed.set()

    def create(self, kind: Kind, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = meta["generateName"] + "".join(random.choice(POD_NAME_CHARS) for _ in range(5))
            else:
                raise invalid(kind, "", "metadata.name", "Required value: name or generateName is required")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", meta["name"]) or len(meta["name"]) > 253:
            raise invalid(kind, meta["name"], "metadata.name",
                          f'Invalid value: "{meta["name"]}": a lowercase RFC 1123 subdomain')
        key = (kind.plural, ns if kind.namespaced else "", meta["name"])
        if key in self.objects:
            raise ApiError(409, "AlreadyExists",
                           f'{kind.plural}{"." + kind.group if kind.group else ""} "{meta["name"]}" already exists',
                           {"name": meta["name"], "group": kind.group, "kind": kind.plural})
        if kind.namespaced:
            namespace = self.get(BY_PATH[("", "v1", "namespaces")], "", ns)
            if namespace is None:
                raise ApiError(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})
            if namespace["status"].get("phase") == "Terminating":
                raise ApiError(403, "Forbidden", f'{kind.plural} "{meta["name"]}" is forbidden: unable to create new '
                               f'content in namespace {ns} because it is being terminated')
            meta["namespace"] = ns
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), resourceVersion=self.next_rv())
        self.created[meta["uid"]] = int(meta["resourceVersion"])
        if kind.plural in ("deployments", "replicasets", "poddisruptionbudgets"):
            meta["generation"] = 1
        meta.pop("deletionTimestamp", None)
        if kind.plural != "configmaps":  # a ConfigMap has no status
            obj.setdefault("status", {})
        self.objects[key] = obj
        self._emit("ADDED", kind, obj)
        return obj

    def update(self, kind: Kind, obj: dict[str, Any], *, spec_changed: bool = False) -> dict[str, Any]:
        meta = obj["metadata"]
        if spec_changed and "generation" in meta:
            meta["generation"] += 1
        meta["resourceVersion"] = self.next_rv()
        self._emit("MODIFIED", kind, obj)
        return obj

    def remove(self, kind: Kind, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        key = (kind.plural, meta.get("namespace", "") if kind.namespaced else "", meta["name"])
        if self.objects.get(key) is obj:
            del self.objects[key]
            meta["resourceVersion"] = self.next_rv()
            self._emit("DELETED", kind, obj)


# --- the kubelet: pods as processes ----------------------------------------------------------------------


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


@dataclass
class PodRuntime:
    """The process behind one pod, its readiness, and its termination."""

    ip: str
    log: Path
    process: subprocess.Popen[bytes] | None = None
    ready: bool = False
    probe_ok: int = 0
    probe_failed: int = 0
    next_probe: float = 0.0
    restart_at: float | None = None
    backoff: float = 0.0  # the next CrashLoopBackOff wait (0: no crash yet, the first restarts at once)
    terminating_until: float | None = None
    started_at: float = 0.0
    probing: bool = False


def handles_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a SIGTERM handler (``SigCgt`` of ``/proc/PID/status``, bit 15).

    A container's first process is PID 1 of its PID namespace, and the kernel delivers to it only the
    signals it handles: without a handler (a bare ``python``, ``sh -c`` without ``trap``) the kubelet's
    SIGTERM does nothing and the process runs until the SIGKILL at the end of the grace (seen on a real
    1.36 node). Here the process is an ordinary one that SIGTERM would kill at once, so the kubelet
    sends it only to a process that handles it. True where ``/proc`` cannot tell (the signal is sent)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="ascii", errors="replace")
    except OSError:
        return True
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return True


def _resolve_command(words: list[str]) -> list[str]:
    """A container's command as this host runs it: the image is ignored, the venv stands in for it."""
    if not words:
        raise ValueError("the container has no command (the fake cannot run an image's entrypoint)")
    first, rest = words[0], words[1:]
    if first in ("python", "python3") or first.startswith("python3."):
        return [sys.executable, *rest]
    if first == "streamchaos":
        script = Path(sys.executable).with_name("streamchaos")
        return [str(script), *rest] if script.exists() else [sys.executable, "-m", "chaos.cli", *rest]
    found = shutil.which(first)
    if found is None:
        raise ValueError(f"executable {first!r} not found on this host")
    return [found, *rest]


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``$$`` escapes; an unknown variable stays as written)."""
    return _VAR.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def claim_octet() -> tuple[int, Any]:
    """A second octet (``127.X.*.*``) no other fake on this host uses, and the open lock that holds it.

    Every fake counts its pod IPs and ClusterIPs from the same start, so two fakes with one octet (two
    xdist workers, or a test's own fake beside its worker's) hand out the same addresses: one's readiness
    probe then reaches the other's pod and a crashed pod reads Ready, or a ClusterIP answers for another
    cluster's Service. An exclusive ``flock`` per octet, held for the fake's life, rules that out; the
    kernel drops it when the process dies, so a killed fake frees its octet.
    """
    directory = Path(tempfile.gettempdir()) / "streamchaos-fake-k8s"
    directory.mkdir(exist_ok=True)
    for octet in random.sample(range(100, 251), 151):
        claim = open(directory / f"octet-{octet}.lock", "w")  # held open for the fake's life
        try:
            fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            claim.close()
            continue
        return octet, claim
    raise RuntimeError(f"every loopback octet 100..250 is claimed by another fake ({directory})")


def crash_wait(runtime: PodRuntime, pod: dict[str, Any], now: float) -> float:
    """Seconds before a crashed container starts again, as the kubelet's CrashLoopBackOff times it (seen
    on a real 1.36 node): the first crash restarts at once, then 10 s, 20 s, 40 s... up to 300 s. A
    container that ran 10 minutes starts from the beginning again. ``runtime.backoff`` is the next wait."""
    first, most = timing(pod, CRASH_BACKOFF), timing(pod, CRASH_BACKOFF_MAX)
    if not runtime.backoff or now - runtime.started_at > 600:
        runtime.backoff = min(most, first)
        return 0.0
    wait, runtime.backoff = runtime.backoff, min(most, runtime.backoff * 2)
    return wait


class Kubelet:
    """Runs pods as processes on loopback addresses and reports their status."""

    def __init__(self, store: Store, log_dir: Path) -> None:
        self.store = store
        self.log_dir = log_dir
        self.pods: dict[str, PodRuntime] = {}  # pod uid -> runtime
        self.dying: dict[str, PodRuntime] = {}  # pods gone from the API whose processes are still stopping
        self.octet, self._octet_claim = claim_octet()
        self.ips = itertools.count(2)
        self.session: aiohttp.ClientSession | None = None
        self.tasks: set[asyncio.Future[Any]] = set()

    def new_ip(self) -> str:
        while True:
            n = next(self.ips)
            ip = f"127.{self.octet}.{n // 250}.{n % 250 + 1}"
            with socket.socket() as s:  # a stale process of an earlier fake may hold it
                try:
                    s.bind((ip, 0))
                    return ip
                except OSError:
                    continue

    def pod_env(self, pod: dict[str, Any], container: dict[str, Any], ip: str) -> dict[str, str]:
        field_values = {"status.podIP": ip, "metadata.name": pod["metadata"]["name"], "status.hostIP": "127.0.0.1",
                        "metadata.namespace": pod["metadata"]["namespace"], "spec.nodeName": "fake-node",
                        "metadata.uid": pod["metadata"]["uid"],
                        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default")}
        env: dict[str, str] = {}
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = expand(str(item["value"]), env)
            elif (ref := (item.get("valueFrom") or {}).get("fieldRef")) is not None:
                env[item["name"]] = field_values.get(ref["fieldPath"], "")
        return env

    def start(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        runtime = self.pods.get(uid)
        if runtime is None:
            runtime = self.pods[uid] = PodRuntime(ip=self.new_ip(), log=self.log_dir / f"{pod['metadata']['name']}.log")
        container = pod["spec"]["containers"][0]
        env = self.pod_env(pod, container, runtime.ip)
        words = [expand(w, env) for w in (container.get("command") or []) + (container.get("args") or [])]
        words = [runtime.ip if w == "0.0.0.0" else w for w in words]
        runtime.ready, runtime.probe_ok, runtime.probe_failed = False, 0, 0
        probe = container.get("readinessProbe") or {}
        runtime.next_probe = time.monotonic() + float(probe.get("initialDelaySeconds", 0))
        runtime.started_at = time.monotonic()
        status = pod["status"]
        try:
            command = _resolve_command(words)
        except ValueError as exc:
            status["phase"] = "Pending"
            status["containerStatuses"] = [self._container_status(container, pod, ready=False,
                                                                  waiting=("CreateContainerError", str(exc)))]
            self.store.update(KIND["pods"], pod)
            return
        with open(runtime.log, "ab") as log:
            runtime.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env={**os.environ, **env},
                preexec_fn=_die_with_parent, start_new_session=True,
            )
        status.update(phase="Running", podIP=runtime.ip, podIPs=[{"ip": runtime.ip}], hostIP="127.0.0.1",
                      hostIPs=[{"ip": "127.0.0.1"}], startTime=status.get("startTime") or now_rfc3339())
        status["containerStatuses"] = [self._container_status(container, pod, ready=False)]
        self._conditions(pod, ready=False)
        self.store.update(KIND["pods"], pod)

    def _container_status(self, container: dict[str, Any], pod: dict[str, Any], *, ready: bool,
                          waiting: tuple[str, str] | None = None) -> dict[str, Any]:
        previous = (pod["status"].get("containerStatuses") or [{}])[0]
        state: dict[str, Any] = ({"waiting": {"reason": waiting[0], "message": waiting[1]}} if waiting
                                 else {"running": {"startedAt": now_rfc3339()}})
        out = {"name": container["name"], "image": container.get("image", ""), "imageID": "", "ready": ready,
               "started": waiting is None, "restartCount": previous.get("restartCount", 0), "state": state,
               "containerID": f"fake://{secrets.token_hex(8)}"}
        if previous.get("lastState"):
            out["lastState"] = previous["lastState"]
        return out

    def _conditions(self, pod: dict[str, Any], *, ready: bool) -> None:
        old = {c["type"]: c for c in pod["status"].get("conditions") or []}
        wanted = {"PodScheduled": True, "Initialized": True, "ContainersReady": ready, "Ready": ready}
        conditions = []
        for ctype, value in wanted.items():
            text = "True" if value else "False"
            prev = old.get(ctype)
            if prev and prev["status"] == text:
                conditions.append(prev)
            else:
                conditions.append({"type": ctype, "status": text, "lastProbeTime": None,
                                   "lastTransitionTime": now_rfc3339()})
        pod["status"]["conditions"] = conditions

    def set_ready(self, pod: dict[str, Any], ready: bool) -> None:
        runtime = self.pods.get(pod["metadata"]["uid"])
        if runtime is None or runtime.ready == ready:
            return
        runtime.ready = ready
        statuses = pod["status"].get("containerStatuses") or []
        if statuses:
            statuses[0]["ready"] = ready
        self._conditions(pod, ready=ready)
        self.store.update(KIND["pods"], pod)

    async def probe(self, pod: dict[str, Any], runtime: PodRuntime) -> None:
        try:
            await self._probe(pod, runtime)
        finally:
            runtime.probing = False

    async def _probe(self, pod: dict[str, Any], runtime: PodRuntime) -> None:
        container = pod["spec"]["containers"][0]
        spec = container.get("readinessProbe")
        if spec is None:
            self.set_ready(pod, True)  # no probe: ready once the container runs
            return
        runtime.next_probe = time.monotonic() + float(spec.get("periodSeconds", 10))
        ok = False
        timeout = float(spec.get("timeoutSeconds", 1))
        if "httpGet" in spec:
            port = self.container_port(container, spec["httpGet"]["port"])
            assert self.session is not None
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError):
                async with self.session.get(f"http://{runtime.ip}:{port}{spec['httpGet'].get('path', '/')}",
                                            timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                    ok = 200 <= response.status < 400
        elif "tcpSocket" in spec:
            port = self.container_port(container, spec["tcpSocket"]["port"])
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                _, writer = await asyncio.wait_for(asyncio.open_connection(runtime.ip, port), timeout)
                writer.close()
                ok = True
        else:
            ok = True
        if pod["metadata"]["uid"] not in self.pods \
                or self.store.get(KIND["pods"], pod["metadata"]["namespace"], pod["metadata"]["name"]) is not pod:
            return  # deleted while probing
        if ok:
            runtime.probe_ok, runtime.probe_failed = runtime.probe_ok + 1, 0
            if runtime.probe_ok >= int(spec.get("successThreshold", 1)):
                self.set_ready(pod, True)
        else:
            runtime.probe_ok, runtime.probe_failed = 0, runtime.probe_failed + 1
            if runtime.probe_failed >= int(spec.get("failureThreshold", 3)):
                self.set_ready(pod, False)

    @staticmethod
    def container_port(container: dict[str, Any], port: int | str) -> int:
        if isinstance(port, int):
            return port
        for p in container.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        return int(port) if str(port).isdigit() else 0

    def tick(self, pod: dict[str, Any]) -> None:
        """One kubelet step for a pod: start, probe (in the background), restart, terminate."""
        uid = pod["metadata"]["uid"]
        runtime = self.pods.get(uid)
        if runtime is None:
            self.start(pod)
            return
        now = time.monotonic()
        proc = runtime.process
        if runtime.terminating_until is not None:
            if proc is None or proc.poll() is not None or now >= runtime.terminating_until:
                self.store.remove(KIND["pods"], pod)
                self.kill(uid)
            return
        if proc is not None and proc.poll() is not None:  # crashed: count a restart, start again
            if runtime.restart_at is None:
                statuses = pod["status"].get("containerStatuses") or [{}]
                code = proc.returncode
                statuses[0]["restartCount"] = statuses[0].get("restartCount", 0) + 1
                statuses[0]["lastState"] = {"terminated": {"exitCode": code if code >= 0 else 128 - code,
                                                           "reason": "Error", "finishedAt": now_rfc3339()}}
                statuses[0]["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
                statuses[0]["ready"] = False
                runtime.ready = False
                self._conditions(pod, ready=False)
                self.store.update(KIND["pods"], pod)
                runtime.restart_at = now + crash_wait(runtime, pod, now)
            elif now >= runtime.restart_at:
                runtime.restart_at = None
                self.start(pod)
            return
        if proc is not None and not runtime.probing and now >= runtime.next_probe:
            runtime.probing = True
            self.tasks.add(task := asyncio.ensure_future(self.probe(pod, runtime)))
            task.add_done_callback(self.tasks.discard)

    def terminate(self, pod: dict[str, Any], grace: int) -> None:
        """Stop a pod's container as the kubelet does: SIGTERM to its first process only, SIGKILL to all
        at the end of the grace, which is never under ``MIN_GRACE_S`` for the process. A first process
        without a SIGTERM handler is PID 1 of its container, which the kernel spares the signal: it lives
        out the whole grace (``handles_sigterm``). With grace 0 the API object goes at once (the caller has
        emitted MODIFIED), but the process keeps running, holding its connections and port, until it
        exits or the minimum grace ends."""
        uid = pod["metadata"]["uid"]
        runtime = self.pods.get(uid)
        if runtime is None or runtime.process is None or runtime.process.poll() is not None:
            self.store.remove(KIND["pods"], pod)
            self.kill(uid)
            return
        now = time.monotonic()
        if runtime.terminating_until is None and handles_sigterm(runtime.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(runtime.process.pid, signal.SIGTERM)
        until = now + max(float(grace), MIN_GRACE_S)
        runtime.terminating_until = min(until, runtime.terminating_until or until)
        if grace <= 0:
            self.store.remove(KIND["pods"], pod)
            self.dying[uid] = self.pods.pop(uid)

    def reap(self) -> None:
        """The processes of pods already gone from the API: SIGKILL once they exit or their grace ends."""
        now = time.monotonic()
        for uid, runtime in list(self.dying.items()):
            if runtime.process is None or runtime.process.poll() is not None or now >= (runtime.terminating_until or 0):
                self.pods[uid] = self.dying.pop(uid)
                self.kill(uid)

    def kill(self, uid: str, *, reap: bool = False) -> None:
        """SIGKILL the pod's processes; reaped in a thread (or here, with ``reap``) so the API never waits."""
        runtime = self.pods.pop(uid, None)
        if runtime is not None and runtime.process is not None:
            process = runtime.process
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            if reap:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(5)
            else:
                self.tasks.add(task := asyncio.ensure_future(asyncio.to_thread(process.wait, 30)))
                task.add_done_callback(self.tasks.discard)

    def kill_all(self) -> None:
        self.pods.update(self.dying)
        self.dying.clear()
        for uid in list(self.pods):
            self.kill(uid, reap=True)


KIND = {k.plural: k for k in KINDS}


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def serving(pod: dict[str, Any]) -> bool:
    return pod_ready(pod) and not pod["metadata"].get("deletionTimestamp")


# --- the cluster: controllers, RBAC, handlers ------------------------------------------------------------


class Cluster:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.store = Store()
        self.kubelet = Kubelet(self.store, directory / "pods")
        self.admin_token = secrets.token_urlsafe(24)
        self.tokens: dict[str, tuple[str, str]] = {}  # token -> (namespace, serviceaccount)
        self.proxies: dict[str, list[asyncio.AbstractServer]] = {}  # service uid -> kube-proxy listeners
        self.cluster_ips = itertools.count(1)
        self.rr = itertools.count()
        # the audit log: every authorized-or-not request as (user, verb, resource, namespace, name), read at
        # /_fake/audit
        self.requests: deque[tuple[str, str, str, str, str]] = deque(maxlen=10000)
        self.unscheduled: dict[str, float] = {}  # pod uid -> when the scheduler binds it
        self.pdb_seen: dict[str, float] = {}  # budget uid -> when the disruption controller first saw it
        self.namespace_deleted: dict[str, float] = {}  # namespace uid -> when its deletion was asked

    # -- controllers ------------------------------------------------------------------------------------
    async def controllers(self) -> None:
        while True:
            self.store.changed.clear()
            try:
                self.reconcile_deployments()
                self.schedule()
                for pod in self.store.list(KIND["pods"]):
                    if pod["spec"].get("nodeName"):
                        self.kubelet.tick(pod)
                self.kubelet.reap()
                self.reconcile_pdbs()
                self.reconcile_namespaces()
                await self.reconcile_services()
            except Exception as exc:  # a fake that dies on a bug hangs every test: log and go on
                print(f"fake apiserver: controller error: {exc!r}", file=sys.stderr, flush=True)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.store.changed.wait(), 0.05)

    def schedule(self) -> None:
        """The scheduler: a pod without a node stays Pending for its schedule delay, then is bound."""
        now = time.monotonic()
        for pod in self.store.list(KIND["pods"]):
            if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                continue
            due = self.unscheduled.setdefault(pod["metadata"]["uid"], now + timing(pod, SCHEDULE_DELAY))
            if now < due:
                continue
            del self.unscheduled[pod["metadata"]["uid"]]
            pod["spec"]["nodeName"] = "fake-node"
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                                            "lastTransitionTime": now_rfc3339()}]
            self.store.update(KIND["pods"], pod)

    def reconcile_deployments(self) -> None:
        for dep in self.store.list(KIND["deployments"]):
            if dep["metadata"].get("deletionTimestamp"):
                continue
            ns, name = dep["metadata"]["namespace"], dep["metadata"]["name"]
            template = dep["spec"]["template"]
            digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()
            template_hash = "".join(POD_NAME_CHARS[int(digest[i:i + 2], 16) % len(POD_NAME_CHARS)]
                                    for i in range(0, 20, 2))
            rs_name = f"{name}-{template_hash}"
            rs = self.store.get(KIND["replicasets"], ns, rs_name)
            replicas = int(dep["spec"].get("replicas", 1))
            if rs is None:
                labels = {**(template["metadata"].get("labels") or {}), "pod-template-hash": template_hash}
                rs = self.store.create(KIND["replicasets"], ns, {
                    "metadata": {"name": rs_name, "labels": labels,
                                 "ownerReferences": [self.owner(KIND["deployments"], dep)]},
                    "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                             "template": {"metadata": {"labels": labels,
                                                       **({"annotations": template["metadata"]["annotations"]}
                                                          if template["metadata"].get("annotations") else {})},
                                          "spec": template["spec"]}},
                })
            elif rs["spec"]["replicas"] != replicas:
                rs["spec"]["replicas"] = replicas
                self.store.update(KIND["replicasets"], rs, spec_changed=True)
            pods = [p for p in self.store.list(KIND["pods"], ns) if self.owned_by(p, rs)]
            active = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
            for _ in range(replicas - len(active)):
                self.store.create(KIND["pods"], ns, {
                    "metadata": {"name": f"{rs_name}-{''.join(random.choice(POD_NAME_CHARS) for _ in range(5))}",
                                 "generateName": f"{rs_name}-",
                                 "labels": dict(rs["spec"]["template"]["metadata"]["labels"]),
                                 "ownerReferences": [self.owner(KIND["replicasets"], rs)],
                                 **({"annotations": dict(rs["spec"]["template"]["metadata"]["annotations"])}
                                    if rs["spec"]["template"]["metadata"].get("annotations") else {})},
                    "spec": copy.deepcopy(rs["spec"]["template"]["spec"]),  # no nodeName: the scheduler binds it
                    "status": {"phase": "Pending", "qosClass": "BestEffort"},
                })
            if len(active) > replicas:  # not-ready first, then the newest (as the ReplicaSet controller ranks them)
                ranked = sorted(active, key=lambda p: (pod_ready(p), -self.store.created.get(p["metadata"]["uid"], 0)))
                for pod in ranked[: len(active) - replicas]:
                    self.delete_pod(pod, None)
                active = [p for p in active if not p["metadata"].get("deletionTimestamp")]
            # the controllers count active pods only (FilterActivePods): a terminating pod, which may live out
            # its grace, is no longer one of the replicas
            ready = sum(1 for p in active if serving(p))
            status = {"observedGeneration": dep["metadata"]["generation"], "replicas": len(active),
                      "updatedReplicas": len(active), "readyReplicas": ready, "availableReplicas": ready,
                      "unavailableReplicas": max(0, replicas - ready)}
            status = {k: v for k, v in status.items() if v or k in ("observedGeneration", "replicas")}
            if dep.get("status") != status:
                dep["status"] = status
                self.store.update(KIND["deployments"], dep)
            rs_status = {"replicas": len(active), "readyReplicas": ready, "availableReplicas": ready,
                         "fullyLabeledReplicas": len(active), "observedGeneration": rs["metadata"]["generation"]}
            if rs.get("status") != rs_status:
                rs["status"] = rs_status
                self.store.update(KIND["replicasets"], rs)

    @staticmethod
    def owner(kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": kind.api_version, "kind": kind.kind, "name": obj["metadata"]["name"],
                "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}

    @staticmethod
    def owned_by(obj: dict[str, Any], owner: dict[str, Any]) -> bool:
        return any(r.get("uid") == owner["metadata"]["uid"] for r in obj["metadata"].get("ownerReferences") or [])

    def pdb_status(self, pdb: dict[str, Any]) -> dict[str, Any]:
        ns = pdb["metadata"]["namespace"]
        pods = [p for p in self.store.list(KIND["pods"], ns)
                if match_labels(pdb["spec"].get("selector"), p["metadata"].get("labels") or {})]
        expected = len([p for p in pods if not p["metadata"].get("deletionTimestamp")])
        healthy = sum(1 for p in pods if serving(p))

        def amount(value: Any) -> int:
            if isinstance(value, str) and value.endswith("%"):
                return -(-int(value[:-1]) * expected // 100)  # rounded up, as the disruption controller does
            return int(value)

        spec = pdb["spec"]
        if "minAvailable" in spec:
            desired = amount(spec["minAvailable"])
        elif "maxUnavailable" in spec:
            desired = max(0, expected - amount(spec["maxUnavailable"]))
        else:
            desired = expected
        return {"observedGeneration": pdb["metadata"]["generation"], "currentHealthy": healthy,
                "desiredHealthy": desired, "expectedPods": expected,
                "disruptionsAllowed": max(0, healthy - desired)}

    def reconcile_pdbs(self) -> None:
        """The disruption controller: a budget's status is written only once it has been seen for its
        sync delay (a new budget allows no disruption until then), and kept up to date after."""
        now = time.monotonic()
        for pdb in self.store.list(KIND["poddisruptionbudgets"]):
            seen = self.pdb_seen.setdefault(pdb["metadata"]["uid"], now)
            if now < seen + timing(pdb, PDB_SYNC):
                continue
            status = self.pdb_status(pdb)
            if {k: v for k, v in pdb["status"].items() if k != "conditions"} != status:
                pdb["status"] = {**status, "conditions": [{"type": "DisruptionAllowed", "reason": "SufficientPods"
                                 if status["disruptionsAllowed"] else "InsufficientPods",
                                 "status": "True" if status["disruptionsAllowed"] else "False",
                                 "lastTransitionTime": now_rfc3339(), "message": "",
                                 "observedGeneration": pdb["metadata"]["generation"]}]}
                self.store.update(KIND["poddisruptionbudgets"], pdb)

    def reconcile_namespaces(self) -> None:
        for ns in self.store.list(KIND["namespaces"]):
            if ns["status"].get("phase") != "Terminating":
                continue
            name = ns["metadata"]["name"]
            asked = self.namespace_deleted.setdefault(ns["metadata"]["uid"], time.monotonic())
            left = [(k, o) for k in KINDS if k.namespaced for o in self.store.list(k, name)]
            for kind, obj in left:
                if kind.plural == "pods":
                    if not obj["metadata"].get("deletionTimestamp"):
                        self.delete_pod(obj, None)
                else:
                    self.store.remove(kind, obj)
            # the namespace controller's finalizer: the namespace goes only after its pods, and not at once
            if not any(k.plural == "pods" for k, _ in left) \
                    and time.monotonic() >= asked + timing(ns, NAMESPACE_FINALIZE):
                self.store.remove(KIND["namespaces"], ns)

    async def reconcile_services(self) -> None:
        for svc in self.store.list(KIND["services"]):
            uid = svc["metadata"]["uid"]
            if uid in self.proxies or svc["spec"].get("clusterIP") == "None":
                continue
            self.proxies[uid] = []
            ip = svc["spec"].get("clusterIP") or f"127.{self.kubelet.octet}.255.{next(self.cluster_ips)}"
            svc["spec"]["clusterIP"], svc["spec"]["clusterIPs"] = ip, [ip]
            for port in svc["spec"].get("ports") or []:
                server = await asyncio.start_server(
                    lambda r, w, s=svc, p=port: self.kube_proxy(r, w, s, p), ip, int(port["port"]))
                self.proxies[uid].append(server)
            self.store.update(KIND["services"], svc)
        live = {s["metadata"]["uid"] for s in self.store.list(KIND["services"])}
        for uid in [u for u in self.proxies if u not in live]:
            for server in self.proxies.pop(uid):
                server.close()

    async def kube_proxy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, svc: dict[str, Any],
                         port: dict[str, Any]) -> None:
        """A Service's ClusterIP: each connection to a ready pod, round robin (what kube-proxy does)."""
        ns = svc["metadata"]["namespace"]
        pods = [p for p in self.store.list(KIND["pods"], ns)
                if serving(p) and match_labels({"matchLabels": svc["spec"].get("selector") or {}},
                                               p["metadata"].get("labels") or {})]
        if not pods:
            writer.close()
            return
        pod = pods[next(self.rr) % len(pods)]
        target = self.kubelet.container_port(pod["spec"]["containers"][0], port.get("targetPort", port["port"]))
        try:
            up_reader, up_writer = await asyncio.open_connection(pod["status"]["podIP"], target)
        except OSError:
            writer.close()
            return
        await pipe_both(reader, writer, up_reader, up_writer)

    # -- pods --------------------------------------------------------------------------------------------
    def delete_pod(self, pod: dict[str, Any], grace: int | None) -> None:
        if grace is None:
            grace = int(pod["spec"].get("terminationGracePeriodSeconds", 30))
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):  # already terminating: a shorter grace period wins
            if grace < meta.get("deletionGracePeriodSeconds", grace + 1):
                meta["deletionGracePeriodSeconds"] = grace
                self.store.update(KIND["pods"], pod)
                self.kubelet.terminate(pod, grace)
            return
        # the watch sees MODIFIED (deletionTimestamp set) first, even with grace 0; then DELETED
        meta["deletionTimestamp"] = now_rfc3339(grace)
        meta["deletionGracePeriodSeconds"] = grace
        self.store.update(KIND["pods"], pod)
        self.kubelet.terminate(pod, grace)

    # -- RBAC ------------------------------------------------------------------------------------------
    def user(self, request: web.Request) -> str:
        header = request.headers.get("Authorization", "")
        token = header[7:] if header.startswith("Bearer ") else ""
        if token and secrets.compare_digest(token, self.admin_token):
            return "admin"
        if token in self.tokens:
            ns, sa = self.tokens[token]
            return f"system:serviceaccount:{ns}:{sa}"
        raise ApiError(401, "Unauthorized", "Unauthorized")

    def authorize(self, user: str, verb: str, kind: Kind, sub: str | None, ns: str, name: str | None) -> None:
        resource = kind.plural + (f"/{sub}" if sub else "")
        self.requests.append((user, verb, resource, ns, name or ""))
        if user == "admin":
            return
        _, _, sa_ns, sa = user.split(":", 3)
        if kind.namespaced:
            for binding in self.store.list(KIND["rolebindings"], ns):
                if not any(s.get("kind") == "ServiceAccount" and s.get("name") == sa and s.get("namespace", ns) == sa_ns
                           for s in binding.get("subjects") or []):
                    continue
                ref = binding["roleRef"]
                role = self.store.get(KIND["roles"], ns, ref["name"]) if ref.get("kind") == "Role" else None
                for rule in (role or {}).get("rules") or []:
                    if kind.group in rule.get("apiGroups", []) and resource in rule.get("resources", []) \
                            and verb in rule.get("verbs", []) \
                            and (not rule.get("resourceNames") or name in rule["resourceNames"]):
                        return
        what = f'{kind.plural}{"." + kind.group if kind.group else ""}'
        subject = f'{what} "{name}"' if name else what
        where = f' in the namespace "{ns}"' if kind.namespaced else " at the cluster scope"
        raise ApiError(403, "Forbidden",
                       f'{subject} is forbidden: User "{user}" cannot {verb} resource "{resource}" '
                       f'in API group "{kind.group}"{where}',
                       {"name": name or "", "group": kind.group, "kind": kind.plural})

    # -- HTTP --------------------------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self.dispatch(request)
        except ApiError as exc:
            return web.json_response(exc.status(), status=exc.code)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return web.json_response(ApiError(400, "BadRequest", f"the request could not be read: {exc!r}").status(),
                                     status=400)

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/")
        # the test's view of the audit log (admin only), as a real cluster's audit backend keeps it
        if path == "/_fake/audit":
            if self.user(request) != "admin":
                raise ApiError(403, "Forbidden", "the audit log is for the admin")
            return web.json_response([dict(zip(("user", "verb", "resource", "namespace", "name"), r, strict=True))
                                      for r in self.requests])
        if path in ("/version", "/api", "/apis", "/healthz", "/readyz", "/livez"):
            self.user(request)
            return web.json_response({"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake"} if path == "/version"
                                     else {"kind": "APIVersions", "versions": ["v1"]} if path == "/api"
                                     else {"status": "ok"})
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 3:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns = ""
        if rest[0] == "namespaces" and len(rest) >= 3:
            ns, rest = rest[1], rest[2:]
        elif rest[0] == "namespaces" and len(rest) in (1, 2) and group == "":
            pass  # the namespaces collection or one namespace
        kind = BY_PATH.get((group, version, rest[0]))
        if kind is None or (kind.namespaced and not ns and not (request.method == "GET" and len(rest) == 1)):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub and (kind.plural, sub) not in SUBRESOURCES:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        user = self.user(request)
        query = request.query
        method = request.method
        if name is None:
            verb = {"GET": "watch" if query.get("watch") in ("true", "1") else "list", "POST": "create",
                    "DELETE": "deletecollection"}.get(method)
        elif sub == "portforward":
            # a WebSocket upgrade is a GET: the authorization filter checks `get`; the handler then `create`
            verb = "get"
        else:
            verb = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete", "POST": "create"}.get(method)
        if verb is None:
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on this resource")
        self.authorize(user, verb, kind, sub, ns, name)
        body = await request.json() if method in ("POST", "PUT", "PATCH") and request.can_read_body else None
        if name is None:
            if verb == "create":
                return self.respond(self.create(kind, ns, body), 201)
            if verb in ("list", "watch"):
                namespace = ns or None
                if verb == "watch":
                    return await self.watch(request, kind, namespace)
                if query.get("sendInitialEvents") is not None:
                    raise ApiError(422, "Invalid", "sendInitialEvents is not supported by this server")
                matches = object_filter(kind, query)
                items = [o for o in self.store.list(kind, namespace) if matches(o)]
                return self.respond({"kind": f"{kind.kind}List", "apiVersion": kind.api_version,
                                     "metadata": {"resourceVersion": str(self.store.rv)}, "items": items})
            raise ApiError(405, "MethodNotAllowed", "deletecollection is not supported by this server")
        if sub == "portforward":
            # 1.30+: the upgrade is authorized again as `create` (AuthorizePodWebsocketUpgradeCreatePermission)
            self.authorize(user, "create", kind, sub, ns, name)
            return await self.portforward(request, ns, name)
        if sub == "eviction":
            return self.evict(ns, name, body or {})
        if sub == "token":
            self.store.must(kind, ns, name)
            token = f"sa-{secrets.token_urlsafe(24)}"
            self.tokens[token] = (ns, name)
            return self.respond({"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
                                 "metadata": {"name": name, "namespace": ns, "creationTimestamp": None},
                                 "spec": {**(body or {}).get("spec", {}),
                                          "audiences": ["https://kubernetes.default.svc"]},
                                 "status": {"token": token, "expirationTimestamp": now_rfc3339(3600)}}, 201)
        if sub == "scale":
            return self.scale(request, ns, name, verb, body)
        obj = self.store.must(kind, ns, name)
        if verb == "get":
            return self.respond(obj)
        if verb == "delete":
            return self.delete(kind, obj, query, body or {})
        if verb in ("update", "patch"):
            return self.respond(self.write(request, kind, obj, verb, body, status_only=sub == "status"))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")

    @staticmethod
    def respond(obj: dict[str, Any], code: int = 200) -> web.Response:
        return web.json_response(obj, status=code)

    def create(self, kind: Kind, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        body = copy.deepcopy(body)
        name = (body.get("metadata") or {}).get("name", "")
        if kind.plural == "namespaces":
            body["status"] = {"phase": "Active"}
        if kind.plural == "deployments":
            spec = body.get("spec") or {}
            if not spec.get("selector") or not spec.get("template"):
                raise invalid(kind, name, "spec.selector" if not spec.get("selector") else "spec.template",
                              "Required value")
            if not match_labels(spec["selector"], (spec["template"].get("metadata") or {}).get("labels") or {}):
                raise invalid(kind, name, "spec.template.metadata.labels",
                              "Invalid value: `selector` does not match template `labels`")
            spec.setdefault("replicas", 1)
        if kind.plural == "poddisruptionbudgets" and "minAvailable" in body.get("spec", {}) \
                and "maxUnavailable" in body.get("spec", {}):
            raise invalid(kind, name, "spec", "Invalid value: minAvailable and maxUnavailable cannot be both set")
        if kind.plural == "pods":
            body.setdefault("status", {"phase": "Pending"})
        if kind.plural == "configmaps":
            check_configmap(kind, name, body)
        return self.store.create(kind, ns, body)

    def delete(self, kind: Kind, obj: dict[str, Any], query: Any, body: dict[str, Any]) -> web.Response:
        grace = query.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
        preconditions = body.get("preconditions") or {}
        if preconditions.get("uid") and preconditions["uid"] != obj["metadata"]["uid"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {kind.plural} '
                           f'"{obj["metadata"]["name"]}": '
                           f'Precondition failed: UID in precondition: {preconditions["uid"]}, '
                           f'UID in object meta: {obj["metadata"]["uid"]}')
        if kind.plural == "pods":
            self.delete_pod(obj, None if grace is None else int(grace))
            return self.respond(obj)
        if kind.plural == "namespaces":
            obj["status"]["phase"] = "Terminating"
            obj["metadata"]["deletionTimestamp"] = now_rfc3339()
            self.store.update(kind, obj)
            return self.respond(obj)
        self.store.remove(kind, obj)
        if kind.plural in ("deployments", "replicasets"):  # background garbage collection of what it owns
            for child_kind in (KIND["replicasets"], KIND["pods"]):
                for child in self.store.list(child_kind, obj["metadata"]["namespace"]):
                    if self.owned_by(child, obj):
                        self.delete(child_kind, child, {}, {})
        return self.respond({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                             "details": {"name": obj["metadata"]["name"], "group": kind.group, "kind": kind.plural,
                                         "uid": obj["metadata"]["uid"]}})

    def write(self, request: web.Request, kind: Kind, obj: dict[str, Any], verb: str, body: Any,
              status_only: bool = False) -> dict[str, Any]:
        if verb == "update":
            sent_rv = (body.get("metadata") or {}).get("resourceVersion")
            if sent_rv and sent_rv != obj["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", 'Operation cannot be fulfilled on '
                               f'{kind.plural}{"." + kind.group if kind.group else ""} '
                               f'"{obj["metadata"]["name"]}": the object has been modified; '
                               'please apply your changes to the latest version and try again',
                               {"name": obj["metadata"]["name"], "group": kind.group, "kind": kind.plural})
            new = copy.deepcopy(body)
        else:
            ctype = request.content_type
            if ctype == "application/json-patch+json":
                new = json_patch(obj, body)
            elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                new = merge_patch(obj, body)
            else:
                raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                               f"accepted media types include: application/json-patch+json, "
                               f"application/merge-patch+json, application/strategic-merge-patch+json (got {ctype})")
        meta = obj["metadata"]
        before = json.dumps(obj.get("spec"), sort_keys=True)
        if kind.plural == "configmaps":  # no spec: the body is the object (a PUT without data empties it)
            check_configmap(kind, meta["name"], new)
            for key in ("data", "binaryData", "immutable"):
                if key in new:
                    obj[key] = new[key]
                elif verb == "update":
                    obj.pop(key, None)
            for key in ("labels", "annotations"):
                if key in (new.get("metadata") or {}):
                    meta[key] = new["metadata"][key]
                elif verb == "update":
                    meta.pop(key, None)
            return self.store.update(kind, obj)
        if status_only:
            obj["status"] = new.get("status", {})
        else:
            obj["spec"] = new.get("spec", obj.get("spec"))
            for key in ("labels", "annotations"):
                if key in (new.get("metadata") or {}):
                    meta[key] = new["metadata"][key]
            for key in ("rules", "subjects", "roleRef", "data"):
                if key in new:
                    obj[key] = new[key]
        if kind.plural == "deployments" and int(obj["spec"].get("replicas", 1)) < 0:
            obj["spec"] = json.loads(before)
            raise invalid(kind, meta["name"], "spec.replicas", "Invalid value: must be greater than or equal to 0")
        return self.store.update(kind, obj, spec_changed=json.dumps(obj.get("spec"), sort_keys=True) != before)

    def scale(self, request: web.Request, ns: str, name: str, verb: str, body: Any) -> web.Response:
        dep = self.store.must(KIND["deployments"], ns, name)

        def as_scale() -> dict[str, Any]:
            meta = dep["metadata"]
            selector = ",".join(f"{k}={v}"
                                for k, v in sorted((dep["spec"]["selector"].get("matchLabels") or {}).items()))
            return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                    "metadata": {"name": name, "namespace": ns, "uid": meta["uid"],
                                 "resourceVersion": meta["resourceVersion"],
                                 "creationTimestamp": meta["creationTimestamp"]},
                    "spec": {"replicas": int(dep["spec"].get("replicas", 1))},
                    "status": {"replicas": int(dep.get("status", {}).get("replicas", 0)), "selector": selector}}

        if verb == "get":
            return self.respond(as_scale())
        if verb == "update":
            sent_rv = (body.get("metadata") or {}).get("resourceVersion")
            if sent_rv and sent_rv != dep["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on deployments.apps "{name}": '
                               "the object has been modified; "
                               "please apply your changes to the latest version and try again",
                               {"name": name, "group": "apps", "kind": "deployments"})
            wanted = (body.get("spec") or {}).get("replicas", 0)
        else:
            current = as_scale()
            patched = json_patch(current, body) if request.content_type == "application/json-patch+json" \
                else merge_patch(current, body)
            wanted = patched["spec"].get("replicas", 0)
        if not isinstance(wanted, int) or wanted < 0:
            raise invalid(KIND["deployments"], name, "spec.replicas",
                          f"Invalid value: {wanted}: must be greater than or equal to 0")
        if wanted != dep["spec"].get("replicas"):
            dep["spec"]["replicas"] = wanted
            self.store.update(KIND["deployments"], dep, spec_changed=True)
        return self.respond(as_scale())

    def evict(self, ns: str, name: str, body: dict[str, Any]) -> web.Response:
        pod = self.store.must(KIND["pods"], ns, name)
        if body.get("kind") not in (None, "Eviction"):
            raise ApiError(400, "BadRequest", f"expected an Eviction, got {body.get('kind')}")
        options = body.get("deleteOptions") or {}
        if not pod["metadata"].get("deletionTimestamp"):
            budgets = [pdb for pdb in self.store.list(KIND["poddisruptionbudgets"], ns)
                       if match_labels(pdb["spec"].get("selector"), pod["metadata"].get("labels") or {})]
            if len(budgets) > 1:
                raise ApiError(500, "InternalError", "This pod has more than one PodDisruptionBudget, "
                               "which the eviction subresource does not support.")
            running = pod["status"].get("phase") == "Running"
            if budgets and running:  # a Pending or finished pod is evicted whatever the budget says
                self.check_budget(budgets[0], healthy=serving(pod))
        grace = options.get("gracePeriodSeconds")
        self.delete_pod(pod, None if grace is None else int(grace))
        return self.respond({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201},
                            201)

    def check_budget(self, pdb: dict[str, Any], *, healthy: bool) -> None:
        """What the eviction subresource asks of a budget, from the status its controller wrote: none yet
        is a 429; a Ready pod needs a disruption allowed (and takes one); a Running pod that is not Ready
        follows unhealthyPodEvictionPolicy (default IfHealthyBudget: only while the budget is healthy)."""
        name, status = pdb["metadata"]["name"], pdb.get("status") or {}

        def refuse(message: str) -> ApiError:
            return ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                            {"causes": [{"reason": "DisruptionBudget", "message": message}]})

        if int(status.get("observedGeneration", 0)) < int(pdb["metadata"].get("generation", 1)):
            raise refuse(f"The disruption budget {name} is still being processed by the server.")
        needs = (f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} healthy pods "
                 f"and has {status.get('currentHealthy', 0)} currently")
        if not healthy:
            policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy", "IfHealthyBudget")
            if policy == "AlwaysAllow" or int(status.get("currentHealthy", 0)) >= int(status.get("desiredHealthy", 0)):
                return
            raise refuse(needs)
        if int(status.get("disruptionsAllowed", 0)) <= 0:
            raise refuse(needs)
        status["disruptionsAllowed"] = int(status["disruptionsAllowed"]) - 1  # the eviction takes it (DisruptedPods)
        self.store.update(KIND["poddisruptionbudgets"], pdb)

    async def watch(self, request: web.Request, kind: Kind, ns: str | None) -> web.StreamResponse:
        query = request.query
        if query.get("sendInitialEvents") is not None:
            raise ApiError(422, "Invalid", "sendInitialEvents is not supported by this server")
        matches = object_filter(kind, query)
        timeout = float(query.get("timeoutSeconds", 1800))
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        since = query.get("resourceVersion", "")
        watcher = Watcher(kind, ns, matches)
        initial: list[dict[str, Any]] = []
        expired = False
        if since in ("", "0"):
            initial = [{"type": "ADDED", "object": copy.deepcopy(o)} for o in self.store.list(kind, ns)
                       if matches(o)]
        else:
            rv = int(since)
            oldest = self.store.log[0][0] if self.store.log else self.store.rv
            if rv < oldest - 1 and rv < self.store.rv:
                expired = True
            else:
                initial = [{"type": etype, "object": obj} for erv, etype, k, obj in self.store.log
                           if erv > rv and k is kind and (ns is None or obj["metadata"].get("namespace") == ns)
                           and matches(obj)]
        self.store.watchers.add(watcher)
        response = web.StreamResponse(status=200,
                                      headers={"Content-Type": "application/json", "Cache-Control": "no-cache"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            if expired:
                status = ApiError(410, "Expired",
                                  f"too old resource version: {since} ({self.store.log[0][0]})").status()
                await response.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
                return response
            for event in initial:
                await response.write(json.dumps(event).encode() + b"\n")
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), min(left, 1.0))
                except asyncio.TimeoutError:
                    if bookmarks:
                        await response.write(json.dumps({"type": "BOOKMARK", "object": {
                            "kind": kind.kind, "apiVersion": kind.api_version,
                            "metadata": {"resourceVersion": str(self.store.rv)}}}).encode() + b"\n")
                    continue
                if event is None:
                    break
                await response.write(json.dumps(event).encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.store.watchers.discard(watcher)
        with contextlib.suppress(Exception):
            await response.write_eof()
        return response

    async def portforward(self, request: web.Request, ns: str, name: str) -> web.StreamResponse:
        """``pods/portforward`` over WebSocket (v4.channel.k8s.io): one connection per requested port."""
        pod = self.store.must(KIND["pods"], ns, name)
        failing = ((pod["metadata"].get("annotations") or {}).get(PORTFORWARD_STATUS) or "").strip()
        if failing:  # the upgrade reaches the handler, which cannot reach the pod's node
            raise ApiError(int(failing), "InternalError", "Internal error occurred: no preferred addresses found; "
                           "known addresses: []", {"causes": [{"message": "no preferred addresses found; "
                                                               "known addresses: []"}]})
        if pod["status"].get("phase") != "Running" or not pod["status"].get("podIP"):
            raise ApiError(400, "BadRequest", f"pod {name} is not running (phase {pod['status'].get('phase')})")
        ports = [int(port) for value in request.query.getall("ports", []) for port in value.split(",")]
        if len(ports) != 1:
            raise ApiError(400, "BadRequest", "this server forwards exactly one port per connection")
        ws = web.WebSocketResponse(protocols=("v4.channel.k8s.io", "v5.channel.k8s.io", "channel.k8s.io"))
        if not ws.can_prepare(request).ok:
            raise ApiError(400, "BadRequest", "pods/portforward needs a WebSocket upgrade (SPDY is not spoken here)")
        await ws.prepare(request)
        port = ports[0]
        header = bytes([port & 0xFF, port >> 8])
        await ws.send_bytes(b"\x00" + header)
        await ws.send_bytes(b"\x01" + header)
        try:
            reader, writer = await asyncio.open_connection(pod["status"]["podIP"], port)
        except OSError as exc:
            await ws.send_bytes(b"\x01" + f"error forwarding port {port} to pod {name}: {exc}".encode())
            await ws.close()
            return ws

        async def pod_to_ws() -> None:
            while data := await reader.read(65536):
                await ws.send_bytes(b"\x00" + data)

        async def ws_to_pod() -> None:
            async for msg in ws:
                if msg.type == WSMsgType.BINARY and msg.data[:1] == b"\x00" and len(msg.data) > 1:
                    writer.write(msg.data[1:])
                    await writer.drain()
                elif msg.type in (WSMsgType.CLOSE, WSMsgType.ERROR):
                    break

        tasks = [asyncio.ensure_future(pod_to_ws()), asyncio.ensure_future(ws_to_pod())]
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        writer.close()
        with contextlib.suppress(Exception):
            await ws.close()
        return ws


async def pipe_both(r1: asyncio.StreamReader, w1: asyncio.StreamWriter,
                    r2: asyncio.StreamReader, w2: asyncio.StreamWriter) -> None:
    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        with contextlib.suppress(Exception):
            w.close()

    await asyncio.gather(pipe(r1, w2), pipe(r2, w1))


def kubeconfig(server: str, token: str, name: str = "fake") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Config", "current-context": name,
            "clusters": [{"name": name, "cluster": {"server": server}}],
            "users": [{"name": f"{name}-user", "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-user"}}]}


@contextlib.asynccontextmanager
async def serving_cluster(directory: Path, host: str = "127.0.0.1",
                          port: int = 0) -> AsyncIterator[tuple[Cluster, int]]:
    cluster = Cluster(directory)
    (directory / "pods").mkdir(parents=True, exist_ok=True)
    cluster.kubelet.session = aiohttp.ClientSession()
    app = web.Application(client_max_size=4 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", cluster.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    controllers = asyncio.ensure_future(cluster.controllers())
    try:
        yield cluster, bound
    finally:
        controllers.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await controllers
        cluster.kubelet.kill_all()
        for servers in cluster.proxies.values():
            for server in servers:
                server.close()
        for watcher in list(cluster.store.watchers):
            watcher.queue.put_nowait(None)
        await cluster.kubelet.session.close()
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="kubeconfig and pod logs go here")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with serving_cluster(args.dir, port=args.port) as (cluster, port):
            config = kubeconfig(f"http://127.0.0.1:{port}", cluster.admin_token)
            path = args.dir / "kubeconfig"
            path.write_text(json.dumps(config, indent=1), encoding="utf-8")
            path.chmod(0o600)
            print(f"READY {port}", flush=True)
            await stop.wait()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
