"""``safety.allowed_targets``: the blast-radius limit, checked once before a run touches anything.

A run may always act on this host's loopback (``127.0.0.0/8``, ``::1``, ``localhost``). Anything
else it would act on — a target URL, an external Toxiproxy, a Kubernetes namespace or label
selector a fault reaches — must be allowed by the experiment's ``safety.allowed_targets``; without
that section every such reach is refused, so a game-day file copied to another cluster cannot hit
it by accident. Reading metrics is not acting, so ``metrics_url`` is not checked, but a credential is sent to it
only where the hosts allow it (``credentials_allowed``).

Pure functions: the loader calls ``syntax_problems`` (located errors), the runner's bring-up and the
dry run call ``refusals`` / ``enforce`` with ``experiment_reach``. Names are compared as written:
nothing is resolved through DNS (a name that resolves to loopback is still a name, and a CIDR
allows IP literals only), so the answer cannot change between the check and the run.

Entry syntax (``hosts``): ``vllm`` or ``*.staging.example.com`` (any port), ``vllm:8000``, an IP
(``10.0.0.7``, ``[fd00::7]:8000``), a CIDR (``10.0.0.0/8``), or a URL ``http://gw:8080/v1`` (scheme,
host, port and a path prefix must all match). ``namespaces``: names or ``*`` patterns. ``selectors``:
Kubernetes label selectors (``app=vllm``, ``tier in (gpu,cpu)``, ``!canary``); a fault's selector is
allowed when it can only select pods one of them selects too (it implies it).
"""

from __future__ import annotations

import fnmatch
import ipaddress
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from chaos.model.context import AllowedTargets, ClusterRef, Reach
from chaos.model.errors import TargetNotAllowed

if TYPE_CHECKING:
    from chaos.model.experiment import Experiment

__all__ = [
    "HostRule",
    "Requirement",
    "credentials_allowed",
    "cluster_reach",
    "enforce",
    "enforce_cluster",
    "format_selector",
    "experiment_reach",
    "host_allowed",
    "implies",
    "is_loopback",
    "namespace_allowed",
    "parse_host_entry",
    "parse_selector",
    "refusals",
    "syntax_problems",
]

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_DEFAULT_PORTS = {"http": 80, "https": 443}
_HOST_NAME = re.compile(r"(\*\.)?[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")
_NAMESPACE = re.compile(r"[a-z0-9*]([-a-z0-9*]*[a-z0-9*])?")
_LABEL_NAME = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (as written in a URL, brackets allowed) is this machine's loopback."""
    host = host.strip("[]").lower().rstrip(".")
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---- hosts ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostRule:
    """One parsed ``hosts`` entry."""

    text: str
    host: str | None = None  # a name or a ``*.suffix`` pattern, lower case; None for a network
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None
    port: int | None = None  # None: any port
    scheme: str | None = None  # a URL entry: scheme and path prefix must match too
    path: str = ""

    def allows(self, scheme: str, host: str, port: int, path: str) -> bool:
        if self.scheme is not None and scheme != self.scheme:
            return False
        if self.port is not None and port != self.port:
            return False
        if self.network is not None:
            try:
                if ipaddress.ip_address(host) not in self.network:
                    return False
            except ValueError:
                return False  # a name is never inside a CIDR: nothing is resolved
        elif self.host is not None and not fnmatch.fnmatchcase(host, self.host):
            return False
        if self.path:
            prefix = self.path.rstrip("/")
            if path != prefix and not path.startswith(prefix + "/"):
                return False
        return True


def parse_host_entry(text: str) -> HostRule:
    """A ``hosts`` entry as a rule; ``ValueError`` saying what is allowed when it is none of them."""
    raw = text.strip()
    if not raw:
        raise ValueError("an empty host entry; give a name, IP, CIDR, host:port or URL")
    if "://" in raw:
        return _url_entry(raw, text)
    if "/" in raw:  # a CIDR
        try:
            return HostRule(text, network=ipaddress.ip_network(raw, strict=False))
        except ValueError:
            raise ValueError(f"{text!r} is not a CIDR such as 10.0.0.0/8") from None
    return _host_port_entry(raw, text)


def _url_entry(raw: str, text: str) -> HostRule:
    """An http(s) URL entry: its host, its port (the scheme's by default), its scheme and path."""
    parts = urlsplit(raw)
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"expected an http(s) URL such as http://vllm:8000/v1, found {text!r}")
    try:
        url_port = parts.port or _DEFAULT_PORTS[parts.scheme]
    except ValueError:
        raise ValueError(f"{text!r}: the port is not a number from 0 to 65535") from None
    rule = _name_or_ip(parts.hostname, text)
    return HostRule(text, rule.host, rule.network, url_port, parts.scheme, parts.path)


def _host_port_entry(raw: str, text: str) -> HostRule:
    """A name or IP entry, with a port or without: ``host``, ``host:port``, ``[v6]`` or ``[v6]:port``."""
    host: str = raw
    port: int | None = None
    bracketed = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?", raw)
    if bracketed:
        host, port = bracketed.group(1), int(bracketed.group(2)) if bracketed.group(2) else None
    elif raw.count(":") == 1:
        host, _, digits = raw.partition(":")
        if not digits.isdigit():
            raise ValueError(f"{text!r}: expected host:port with a numeric port")
        port = int(digits)
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"{text!r}: the port must lie between 1 and 65535")
    rule = _name_or_ip(host, text)
    return HostRule(text, rule.host, rule.network, port)


def _name_or_ip(host: str, text: str) -> HostRule:
    try:
        address = ipaddress.ip_address(host.strip("[]"))
        return HostRule(text, network=ipaddress.ip_network(address))
    except ValueError:
        pass
    if not _HOST_NAME.fullmatch(host):
        raise ValueError(f"{text!r}: not a host name, IP, CIDR, host:port or URL (a '*' may only start a name: "
                         "*.example.com)")
    return HostRule(text, host=host.lower().rstrip("."))


def host_allowed(url: str, rules: Sequence[HostRule]) -> bool:
    """Whether ``url`` is loopback or one of ``rules`` allows it."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    host = (parts.hostname or "").lower().rstrip(".")
    if is_loopback(host):
        return True
    try:
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)
    except ValueError:
        return False
    return any(rule.allows(parts.scheme, host, port, parts.path) for rule in rules)


def credentials_allowed(url: str, allowed: AllowedTargets | None) -> bool:
    """Whether a credential may be sent to ``url``: loopback, or a host ``safety.allowed_targets.hosts`` allows."""
    return host_allowed(url, [parse_host_entry(h) for h in (allowed or AllowedTargets()).hosts])


# ---- label selectors -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """One requirement of a label selector, normalised: ``in`` (``=``/``==``), ``notin`` (``!=``), ``exists``,
    ``absent``."""

    key: str
    op: str
    values: frozenset[str] = frozenset()


def parse_selector(text: str) -> tuple[Requirement, ...]:
    """A Kubernetes label selector (equality- and set-based) → its requirements; ``ValueError`` when malformed."""
    if not text.strip():
        raise ValueError("an empty selector selects every pod; leave `selectors` out to allow any pod in the "
                         "namespaces")
    out: list[Requirement] = []
    for part in _split_top(text):
        out.append(_requirement(part.strip(), text))
    return tuple(out)


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _label_key(name: str, text: str) -> str:
    name = name.strip()
    if not _LABEL_NAME.fullmatch(name) or len(name.rsplit("/", 1)[-1]) > 63:
        raise ValueError(f"selector {text!r}: {name!r} is not a label key (such as app or app.kubernetes.io/name)")
    return name


def _label_value(v: str, text: str) -> str:
    v = v.strip()
    if not _LABEL_VALUE.fullmatch(v) or len(v) > 63:
        raise ValueError(f"selector {text!r}: {v!r} is not a label value")
    return v


def _requirement(part: str, text: str) -> Requirement:
    if not part:
        raise ValueError(f"selector {text!r}: an empty requirement (a stray comma?)")
    if part.startswith("!"):
        return Requirement(_label_key(part[1:], text), "absent")
    match = re.fullmatch(r"(\S+)\s+(in|notin)\s*\((.*)\)", part)
    if match:
        values = frozenset(_label_value(v, text) for v in match.group(3).split(","))
        return Requirement(_label_key(match.group(1), text), "in" if match.group(2) == "in" else "notin", values)
    for op, norm in (("!=", "notin"), ("==", "in"), ("=", "in")):
        if op in part:
            name, _, v = part.partition(op)
            return Requirement(_label_key(name, text), norm, frozenset({_label_value(v, text)}))
    if re.search(r"[\s()=!]", part):
        raise ValueError(f"selector {text!r}: cannot read {part!r}; expected key=value, key!=value, key in (a,b), "
                         "key notin (a), key or !key")
    return Requirement(_label_key(part, text), "exists")


def _one_implies(s: Requirement, a: Requirement) -> bool:
    """Whether every label set satisfying ``s`` satisfies ``a`` (same key)."""
    if a.op == "in":
        return s.op == "in" and s.values <= a.values
    if a.op == "exists":
        return s.op in ("in", "exists")
    if a.op == "notin":
        return ((s.op == "in" and not s.values & a.values) or (s.op == "notin" and a.values <= s.values)
                or s.op == "absent")
    return s.op == "absent"  # a.op == "absent"


def implies(selector: Sequence[Requirement], allowed: Sequence[Requirement]) -> bool:
    """Whether ``selector`` can only select pods ``allowed`` selects too (sound: never says yes wrongly)."""
    return all(any(s.key == a.key and _one_implies(s, a) for s in selector) for a in allowed)


# ---- the check -------------------------------------------------------------------------------------


def syntax_problems(allowed: AllowedTargets) -> list[tuple[tuple[str | int, ...], str]]:
    """Every malformed entry as ``(key path under allowed_targets, message)``, for the loader."""
    out: list[tuple[tuple[str | int, ...], str]] = []
    for i, entry in enumerate(allowed.hosts):
        try:
            parse_host_entry(entry)
        except ValueError as exc:
            out.append((("hosts", i), str(exc)))
    for i, entry in enumerate(allowed.namespaces):
        if not _NAMESPACE.fullmatch(entry) or len(entry) > 63:
            out.append((("namespaces", i),
                        f"{entry!r} is not a namespace name (lower-case letters, digits and '-'; '*' as a wildcard)"))
    for i, entry in enumerate(allowed.selectors):
        try:
            parse_selector(entry)
        except ValueError as exc:
            out.append((("selectors", i), str(exc)))
    return out


def refusals(reaches: Iterable[Reach], allowed: AllowedTargets | None) -> list[str]:
    """What the allow-list refuses among ``reaches``, one sentence each saying what would allow it."""
    allow = allowed or AllowedTargets()
    rules = [parse_host_entry(h) for h in allow.hosts]
    selectors = [parse_selector(s) for s in allow.selectors]
    absent = "" if allowed is not None else " (the experiment has no safety.allowed_targets: only loopback is allowed)"
    out: list[str] = []
    for reach in reaches:
        if reach.url is not None and not host_allowed(reach.url, rules):
            host = urlsplit(reach.url if "://" in reach.url else f"http://{reach.url}").hostname or reach.url
            out.append(f"{reach.what} {reach.url} is not on this host's loopback and not allowed by "
                       f"safety.allowed_targets.hosts{absent}; add {host!r} (or a URL, host:port or CIDR that covers "
                       "it) if this run may act on it")
        if reach.namespace is not None:
            if not namespace_allowed(reach.namespace, allow):
                out.append(f"{reach.what} acts in Kubernetes namespace {reach.namespace!r}, which "
                           f"safety.allowed_targets.namespaces does not list{absent}; cluster targets and faults are "
                           "refused unless their namespace is allowed")
            elif selectors and not reach.namespace_only:
                own = parse_selector(reach.selector) if reach.selector else ()
                if not any(implies(own, a) for a in selectors):
                    what = (f"selector {reach.selector!r}" if reach.selector
                            else "no selector (every pod of the namespace)")
                    out.append(f"{reach.what} uses {what}, which is not within any of safety.allowed_targets.selectors "
                               f"({', '.join(allow.selectors)}); narrow it so that it implies one of them")
    return out


def namespace_allowed(namespace: str, allowed: AllowedTargets) -> bool:
    """Whether one of ``allowed.namespaces`` (names or ``*`` patterns) covers ``namespace``. Pure."""
    return any(fnmatch.fnmatchcase(namespace, pattern) for pattern in allowed.namespaces)


def experiment_reach(experiment: Experiment, target_url: str | None = None,
                     environ: Mapping[str, str] = os.environ) -> list[Reach]:
    """Everything ``experiment`` would act on: the target, an external Toxiproxy, what its faults reach."""
    out: list[Reach] = []
    spec = experiment.target
    url = target_url or spec.url
    if url:
        out.append(Reach("target", url=url))
    # a Kubernetes target that names its namespace is a cluster reach like a cluster fault; where its
    # namespace or pods come from the kubeconfig or a Service, ``enforce_cluster`` checks them once resolved
    kube = spec.kubernetes
    if kube is not None and kube.namespace:
        # a Service's selector is known only once its one read resolves it (``chaos.k8s.gate``): until then
        # the namespace alone is checked, before the first API call
        pending = bool(kube.service) and not kube.selector
        out.append(Reach(f"target ({spec.kind})", namespace=kube.namespace,
                         selector=format_selector(kube.selector) or None,
                         namespace_only=pending))
    proxy = experiment.proxy
    if proxy.enabled and proxy.server in ("auto", "external"):
        proxy_url = proxy.url or environ.get("TOXIPROXY_URL")
        if proxy_url:
            out.append(Reach("Toxiproxy API", url=proxy_url))
    for hop in experiment.path:  # a gateway the user runs: acted on like a remote target, before anything starts
        if hop.kind == "url" and hop.url:
            out.append(Reach(f"path hop {hop.name} (url)", url=hop.url))
    for _, fault in experiment.faults():
        out.extend(fault.reach(experiment))
    return out


def format_selector(labels: Iterable[tuple[str, str]] | Mapping[str, str]) -> str:
    """matchLabels as a selector string: ``app=x,tier=y`` (sorted)."""
    pairs = labels.items() if isinstance(labels, Mapping) else labels
    return ",".join(f"{k}={v}" for k, v in sorted(pairs))


def cluster_reach(experiment: Experiment, cluster: ClusterRef) -> list[Reach]:
    """What a Kubernetes run acts on once its target is resolved: the target's pods and each cluster fault's."""
    out = [Reach(f"target ({experiment.target.kind})", namespace=cluster.namespace,
                 selector=format_selector(cluster.selector) or None)]
    for _, fault in experiment.faults():
        out.extend(fault.cluster_reach(cluster))
    return out


def enforce_cluster(experiment: Experiment, cluster: ClusterRef) -> list[Reach]:
    """``enforce`` for the namespace and pods a Kubernetes target resolved to (before any load or fault)."""
    reaches = cluster_reach(experiment, cluster)
    refused = refusals(reaches, experiment.safety.allowed_targets)
    if refused:
        raise TargetNotAllowed("refused before any load or fault:\n  " + "\n  ".join(refused))
    return reaches


def enforce(experiment: Experiment, target_url: str | None = None,
            environ: Mapping[str, str] = os.environ) -> list[Reach]:
    """Raise ``TargetNotAllowed`` listing every refusal; return what was checked (for the journal)."""
    reaches = experiment_reach(experiment, target_url, environ)
    refused = refusals(reaches, experiment.safety.allowed_targets)
    if refused:
        raise TargetNotAllowed("refused before anything started:\n  " + "\n  ".join(refused))
    return reaches
