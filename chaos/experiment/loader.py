"""Validation and assembly: YAML text or plain data → ``Experiment``, or every problem, located.

Each section is checked on its own and falls back to its defaults when wrong, so one pass finds
every mistake; cross-section checks (phase scopes, fault preconditions) then run on that
best-effort experiment. Nothing here starts anything; faults are only constructed.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeGuard

import yaml

from chaos.k8s.labels import key_problem, value_problem
from chaos.model.capacity import BASELINE_CASE, CapacitySpec
from chaos.model.context import HaltSpec, LeverSpec, PromAlert, StopSource
from chaos.model.errors import ChaosError, ExperimentInvalid, Problem
from chaos.model.experiment import (
    PROMPT_CLASSES,
    AllowedTargets,
    Experiment,
    HopSpec,
    HttpSpec,
    KubernetesSpec,
    LoadSpec,
    PhaseSpec,
    PromptSpec,
    ProxySpec,
    SafetySpec,
    SlaEntry,
    TargetSpec,
)
from chaos.model.params import Schema, suggest
from chaos.model.turns import Turns, parse_turns
from chaos.model.units import format_duration
from chaos.model.verdict import UNOBSERVABLE_POLICIES, Unobservable

from . import sections
from .parsing import _Context, _describe, _Found, _mapping, _parse, _positive, _reject
from .workload_section import chat_extras, parse_workload
from .yamlpos import DEFAULT_BUDGET, KeyPath, YamlSyntaxError, load_located, render_path, too_large

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from chaos.hops.gateways.base import Gateway
    from faults.base import Fault

__all__ = ["experiment_from_dict", "load_experiment", "parse_experiment", "read_text_bounded", "validate_file"]

_MIX_TOLERANCE = 1e-6
_SCRAPE_BOUNDS = (0.1, 1.0)
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
_PROXY_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_METRICS_AUTH = re.compile(r"api_key|none|env:[A-Za-z_][A-Za-z0-9_]*|file:.+")
# Kubernetes names (k8s.io/apimachinery validation): a namespace is an RFC 1123 label, a Service an
# RFC 1035 label, a port name an IANA service name; label keys may carry a DNS-subdomain prefix.
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_PORT_NAME = re.compile(r"(?=.{1,15}$)(?=.*[a-z])[a-z0-9]+(-[a-z0-9]+)*")


def load_experiment(path: str | os.PathLike[str]) -> Experiment:
    """Read and validate an experiment file; raise ``ExperimentInvalid`` with every problem."""
    text = read_text_bounded(str(path))
    return parse_experiment(text, str(path))


def parse_experiment(text: str, filename: str = "<string>") -> Experiment:
    """Validate YAML text; ``filename`` names it in problems and anchors relative prompt files."""
    try:
        located = load_located(text)
    except YamlSyntaxError as exc:
        problem = Problem(filename, exc.mark.line, exc.mark.column, render_path(exc.path), exc.message)
        raise ExperimentInvalid([problem]) from None
    ctx = _Context(filename, located.keys, located.values, located.unreadable)
    for path, mark, message in located.problems:
        ctx.found.append(_Found(path, message, mark))
    return replace(_assemble(ctx, located.data), text=text)


def experiment_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> Experiment:
    """Validate already-loaded data (no positions: problems carry key paths only)."""
    experiment = _assemble(_Context(source, {}, {}, set()), data)
    return replace(experiment, text=_yaml_copy(data, source))


def _yaml_copy(data: Mapping[str, Any], source: str) -> str:
    """The dict as YAML, as given (a literal api_key stays, as a file's copy keeps it; a variable stays
    a name), taken now: the caller's dict may change after it was validated."""
    import yaml

    try:
        text: str = yaml.safe_dump(_plain(data), sort_keys=False, allow_unicode=True)
        return text
    except yaml.YAMLError as exc:  # a value YAML cannot write: the run could keep no copy for `verify`
        raise ExperimentInvalid([Problem(source, 0, 0, "",
                                         f"the experiment is not plain data YAML can write: {exc}")]) from None


def _plain(value: object) -> object:
    """``value`` in the types YAML writes (dict, list, str, int, float, bool, None): a mapping type, a
    tuple or a str/int subclass the checks accept is rebuilt, containers fresh so none is written as an alias."""
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value


def validate_file(path: str | os.PathLike[str]) -> list[Problem]:
    """Every problem in one file, in file order; empty when it is valid. A gateway hop's own
    configuration is then put to the gateway's own check (``nginx -t``, ``haproxy -c``) where its
    binary is here: ``streamchaos validate`` says so before a run would start anything."""
    try:
        experiment = load_experiment(path)
    except ExperimentInvalid as exc:
        return list(exc.problems)
    return _gateway_checks(experiment)


def _gateway_checks(experiment: Experiment) -> list[Problem]:
    from chaos.hops.gateways.base import validate_user_config

    gateways = _gateway_kinds()
    problems: list[Problem] = []
    for i, hop in enumerate(experiment.path):
        if hop.config is not None and hop.kind in gateways:
            problems += validate_user_config(gateways[hop.kind](), Path(hop.config), key=f"path[{i}].config")
    return problems


def read_text_bounded(path: str) -> str:
    """The file's text; never more than the YAML budget's size is read (a 10 GB file costs nothing)."""
    limit = DEFAULT_BUDGET.max_bytes
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
            size = os.fstat(f.fileno()).st_size if len(data) > limit else 0
        if len(data) > limit:
            exc = too_large(data, size if size > limit else None, DEFAULT_BUDGET)
            raise ExperimentInvalid([Problem(path, exc.mark.line, exc.mark.column, "", exc.message)])
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ExperimentInvalid([Problem(path, 0, 0, "",
                                         f"not UTF-8 text: {exc.reason} at byte {exc.start}")]) from None
    except OSError as exc:
        raise ExperimentInvalid([Problem(path, 0, 0, "",
                                         f"cannot read the experiment file: {exc.strerror or exc}")]) from None


def _is_url(value: str) -> bool:
    return bool(re.fullmatch(r"https?://[^\s/]+(/\S*)?", value))


def _fields(values: dict[str, Any], cls: type[DataclassInstance], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    names = set(cls.__dataclass_fields__)
    return {k: v for k, v in values.items() if k in names and k not in skip}


# ---------------------------------------------------------------------------------------------
# sections


def _target(ctx: _Context, raw: object) -> TargetSpec:
    path: KeyPath = ("target",)
    if raw is None:
        return TargetSpec()
    data = _mapping(ctx, raw, path, "the target section")
    if data is None:
        return TargetSpec()
    gpus = data.get("gpus")
    if isinstance(gpus, int) and not isinstance(gpus, bool):
        data["gpus"] = str(gpus)  # `gpus: 2` as `docker run --gpus 2`
    from chaos.targets.registry import target_schema

    values = _parse(ctx, data, path, target_schema())
    _other_kinds_keys(ctx, data, values, path)
    _positive(ctx, values, path, "startup_timeout")
    for key in ("url", "metrics_url"):
        url = values.get(key)
        if isinstance(url, str) and not _is_url(url):
            _reject(ctx, values, path, key, f"expected an http(s) URL such as http://127.0.0.1:8000/v1, found {url!r}")
    device = values.get("device")
    if isinstance(device, str) and not _DEVICE.fullmatch(device):
        _reject(ctx, values, path, "device", f"expected auto, cpu, mps, cuda or cuda:N, found {device!r}")
    _container_keys(ctx, values, path)
    _target_cpus(ctx, values, path)
    _target_credentials(ctx, values, path)
    kind = values.get("kind", "builtin")
    kube: KubernetesSpec | None = None
    if isinstance(values.get("kubernetes"), dict):
        if kind != "kubernetes":
            ctx.add(path + ("kubernetes",), f"target.kubernetes describes the pods of a kind: kubernetes target; "
                    f"this target is kind {kind!r}", at="key")
        else:
            kube = _kubernetes(ctx, values["kubernetes"], path + ("kubernetes",))
    elif kind == "kubernetes" and not values.get("url"):
        ctx.add(path,
                "kind kubernetes needs a kubernetes section {namespace, service or selector} (or a url to reach it by)")
    return TargetSpec(**_fields(values, TargetSpec, skip=("kubernetes",)), kubernetes=kube,
                      options=_kind_options(values, kind))


def _other_kinds_keys(ctx: _Context, data: dict[str, Any], values: dict[str, Any], path: KeyPath) -> None:
    """A key only other kinds take (their ``section``), given for this kind: refused, naming who takes it.
    ``kubernetes`` has its own message, where its section is parsed."""
    from chaos.targets.registry import kinds

    kind = values.get("kind", "builtin")
    found = kinds()
    if kind not in found:
        return  # reported by the schema
    for key in data:
        owners = [name for name, cls in found.items() if key in cls.own_keys()]
        if owners and kind not in owners and key != "kubernetes":
            _reject(ctx, values, path, key, f"only a {' or '.join(owners)} target takes {key!r} (target.kind is "
                    f"{kind}); set kind: {owners[0]}, or remove it")


def _kind_options(values: dict[str, Any], kind: str) -> tuple[tuple[str, Any], ...]:
    """The values of the kind's own keys that ``TargetSpec`` has no field for (a plug-in kind's), frozen."""
    from chaos.targets.registry import kinds

    cls = kinds().get(kind)
    if cls is None:
        return ()
    names = set(TargetSpec.__dataclass_fields__)
    return tuple((key, _frozen(values.get(key))) for key in cls.own_keys() if key not in names)


def _frozen(value: object) -> object:
    """``value`` hashable: a list as a tuple, a mapping as its sorted (key, value) pairs."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _target_cpus(ctx: _Context, values: dict[str, Any], path: KeyPath) -> None:
    """``target.cpus``: a CPU list the host has, and only on a vllm target."""
    cpus = values.get("cpus")
    if not isinstance(cpus, str):
        return
    from chaos.host.cpuset import validate_setting

    problem = validate_setting(cpus)
    if problem:
        _reject(ctx, values, path, "cpus", f"{problem}, found {cpus!r}")
    elif cpus != "auto" and values.get("kind", "builtin") != "vllm":
        _reject(ctx, values, path, "cpus", "only a vllm target takes cpus (the builtin stack and containers are placed "
                "by the host); remove it")


def _target_credentials(ctx: _Context, values: dict[str, Any], path: KeyPath) -> None:
    """``api_key_env`` a variable name and not beside ``api_key``; ``metrics_auth`` one of its forms."""
    env = values.get("api_key_env")
    if isinstance(env, str) and not _ENV_NAME.fullmatch(env):
        _reject(ctx, values, path, "api_key_env",
                f"expected the name of an environment variable such as LITELLM_KEY, found {env!r}")
    if isinstance(env, str) and values.get("api_key"):
        _reject(ctx, values, path, "api_key_env",
                "give api_key or api_key_env, not both (prefer api_key_env: no secret in the file)")
    auth = values.get("metrics_auth")
    if isinstance(auth, str) and not _METRICS_AUTH.fullmatch(auth):
        _reject(ctx, values, path, "metrics_auth",
                "expected api_key (the target's key), none, env:NAME (a variable holding "
                f"a bearer token) or file:PATH (a file holding one), found {auth!r}")


def _kubernetes(ctx: _Context, raw: dict[str, Any], path: KeyPath) -> KubernetesSpec | None:
    """``target.kubernetes``: names checked as the API server would, so a typo fails here, not mid-run."""
    n = ctx.count
    values = _parse(ctx, raw, path, sections.KUBERNETES, extra=("port",))
    _kubernetes_names(ctx, values, path)
    selector = _kubernetes_selector(ctx, values.get("selector"), path)
    port = _kubernetes_port(ctx, raw.get("port"), path)
    _kubernetes_pods_found(ctx, raw, path)
    _kubernetes_paths(ctx, values, path)
    if ctx.count > n:
        return None
    return KubernetesSpec(**_fields(values, KubernetesSpec, skip=("selector", "port")),
                          selector=tuple(sorted(selector)),
                          port=port)


def _kubernetes_names(ctx: _Context, values: dict[str, Any], path: KeyPath) -> None:
    """The namespace and the Service: DNS labels, as the API server checks them."""
    namespace = values.get("namespace")
    if isinstance(namespace, str) and not _DNS1123_LABEL.fullmatch(namespace):
        _reject(ctx, values, path, "namespace", f"expected a namespace name (lowercase letters, digits and '-', "
                f"at most 63), found {namespace!r}")
    service = values.get("service")
    if isinstance(service, str) and not _DNS1035_LABEL.fullmatch(service):
        _reject(ctx, values, path, "service", f"expected a Service name (lowercase letters, digits and '-', "
                f"starting with a letter, at most 63), found {service!r}")


def _kubernetes_selector(ctx: _Context, raw_selector: object, path: KeyPath) -> list[tuple[str, str]]:
    """The selector's well-formed labels as pairs; each malformed key or value reported."""
    selector: list[tuple[str, str]] = []
    if not isinstance(raw_selector, dict):
        return selector
    if not raw_selector:
        ctx.add(path + ("selector",), "an empty selector would match every pod of the namespace; "
                "name at least one label")
    for key, value in raw_selector.items():
        if (problem := key_problem(key)) is not None:
            ctx.add(path + ("selector", str(key)), problem, at="key")
        elif (problem := value_problem(value)) is not None:
            ctx.add(path + ("selector", key), problem)
        else:
            selector.append((key, value))
    return selector


def _is_port(port: object) -> TypeGuard[int | str]:
    """A port number (1-65535) or a port name; not a bool."""
    if isinstance(port, bool):
        return False
    if isinstance(port, int):
        return 1 <= port <= 65535
    return isinstance(port, str) and _PORT_NAME.fullmatch(port) is not None


def _kubernetes_port(ctx: _Context, port: object, path: KeyPath) -> int | str | None:
    """The pods' port as given, or None where it is absent or reported as malformed."""
    if port is None:
        return None
    if not _is_port(port):
        ctx.add(path + ("port",), f"expected a port number (1-65535) or a port name such as http, found {port!r}")
        return None
    return port


def _kubernetes_pods_found(ctx: _Context, raw: dict[str, Any], path: KeyPath) -> None:
    """Enough to find the pods: a service, or a selector with a port."""
    if "service" not in raw and "selector" not in raw:
        ctx.add(path, "give service (its selector and port find the pods) or selector (pod labels, with port)")
    elif "service" not in raw and "port" not in raw:
        ctx.add(path,
                "with a selector and no service, give port: the container port (number or name) the pods serve on")


def _kubernetes_paths(ctx: _Context, values: dict[str, Any], path: KeyPath) -> None:
    """The kubeconfig file exists; the API path is absolute."""
    kubeconfig = values.get("kubeconfig")
    if isinstance(kubeconfig, str) and not Path(os.path.expanduser(kubeconfig)).is_file():
        _reject(ctx, values, path, "kubeconfig", f"no kubeconfig file at {kubeconfig!r}")
    api_path = values.get("path")
    if isinstance(api_path, str) and not api_path.startswith("/"):
        _reject(ctx, values, path, "path", f"expected an absolute path such as /v1, found {api_path!r}")


def _container_keys(ctx: _Context, values: dict[str, Any], path: KeyPath) -> None:
    """The docker-only keys, each well-formed; ``env`` made hashable pairs."""
    if values.get("kind", "builtin") != "docker":  # given here, refused by _other_kinds_keys
        values.pop("env", None)
        return
    if values.get("url") is not None:
        _reject(ctx, values, path, "url", "a docker target is reached where its container listens (network, port); "
                "remove url, or use kind: openai for a server you started yourself")
    if values.get("command") and values.get("image") is None:
        _reject(ctx, values, path, "command", "command needs an image; without one the builtin stack runs "
                "(shaped by model, kv_blocks, ..., extra_args)")
    _container_env(ctx, values, path)
    _container_devices(ctx, values, path)


def _container_env(ctx: _Context, values: dict[str, Any], path: KeyPath) -> None:
    """``env`` as hashable pairs; each bad name or value reported."""
    from chaos.docker.containers import parse_env

    env = values.pop("env", None)
    if env is not None:
        pairs, problems = parse_env(env)
        for key, message in problems:
            ctx.add(path + ("env", key), message, at="key" if "variable name" in message else "value")
        values["env"] = pairs


def _container_devices(ctx: _Context, values: dict[str, Any], path: KeyPath) -> None:
    """``volumes`` and ``gpus``: each in the form docker takes."""
    from chaos.docker.containers import parse_gpus, parse_volume

    volumes = values.get("volumes") or ()
    inside: dict[str, int] = {}  # container path → the volume that mounts there first
    for i, volume in enumerate(volumes):
        try:
            at = inside.setdefault(parse_volume(volume)[1], i)
        except ValueError as exc:
            ctx.add(path + ("volumes", i), str(exc))
            values.pop("volumes", None)
            continue
        if at != i:  # docker takes one mount per container path (one host path at two is fine)
            ctx.add(path + ("volumes", i), f"{volumes[at]!r} (volumes[{at}]) mounts at that container path already")
            values.pop("volumes", None)
    gpus = values.get("gpus")
    if gpus is not None:
        try:
            parse_gpus(gpus)
        except ValueError as exc:
            _reject(ctx, values, path, "gpus", str(exc))


def _proxy(ctx: _Context, raw: object, present: bool) -> ProxySpec:
    path: KeyPath = ("proxy",)
    if not present:
        return ProxySpec()
    if raw is None:  # `proxy:` alone turns the proxy on with defaults
        return ProxySpec(enabled=True)
    if isinstance(raw, bool):  # `proxy: true` / `proxy: false`
        return ProxySpec(enabled=raw)
    data = _mapping(ctx, raw, path, "the proxy section (or true/false)")
    if data is None:
        return ProxySpec()
    values = _parse(ctx, data, path, sections.PROXY)
    _proxy_values(ctx, values, path)
    return ProxySpec(**_fields(values, ProxySpec))


def _proxy_values(ctx: _Context, values: dict[str, Any], path: KeyPath) -> None:
    """A Toxiproxy's url, listen and name, each well-formed (``proxy:`` and a toxiproxy hop of ``path:``)."""
    url = values.get("url")
    if isinstance(url, str) and not _is_url(url):
        _reject(ctx, values, path, "url", f"expected an http(s) URL such as http://127.0.0.1:8474, found {url!r}")
    listen = values.get("listen")
    if isinstance(listen, str) and not re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]*):\d{1,5}", listen):
        _reject(ctx, values, path, "listen",
                f"expected host:port such as 127.0.0.1:0 or 0.0.0.0:8000, found {listen!r}")
    name = values.get("name")
    if isinstance(name, str) and not _PROXY_NAME.fullmatch(name):
        _reject(ctx, values, path, "name", f"expected a name of letters, digits, '_', '.' or '-', found {name!r}")


_HOP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")  # it names the hop's log file: no '/', no leading '.'
_DEPRECATION_NOTED: set[tuple[str, int]] = set()  # (file, line) of `proxy:` sections already noted


@dataclass
class _HopDraft:
    path: KeyPath
    kind: str
    name: str | None  # explicit, or None for the default (the kind)
    values: dict[str, Any]  # the hop's keys, parsed; a gateway's options under "options"


def _gateway_kinds() -> dict[str, Any]:
    """The gateway kinds (``chaos.hops.gateways.base``): every module of the package registers its own."""
    from chaos.hops.gateways.base import gateway_kinds

    return gateway_kinds()


def _path(ctx: _Context, raw: object, present: bool) -> list[_HopDraft]:
    """``path:``: a list of hops, load side first, each checked against its kind's keys."""
    path: KeyPath = ("path",)
    if not present or raw is None:
        return []
    gateways = _gateway_kinds()
    known = {k: k for k in (*sections.PATH_KINDS, *gateways)}
    if not isinstance(raw, list):
        ctx.add(path, f"expected a list of hops ({{kind, name?, ...}}, load side first; kinds: "
                f"{', '.join(sorted(known))}), found {_describe(raw)}")
        return []
    drafts: list[_HopDraft] = []
    for i, entry in enumerate(raw):
        hpath = path + (i,)
        data = _mapping(ctx, entry, hpath, "a hop {kind, name?, ...}")
        if data is None:
            continue
        kind = _kind(ctx, data, hpath, known, "hop", "docs/hops.md")
        name = _hop_name(ctx, data, hpath)
        if kind is None:
            continue
        n = ctx.count
        values = _hop_values(ctx, data, hpath, kind, gateways.get(kind))
        if ctx.count == n:
            drafts.append(_HopDraft(hpath, kind, name, values))
    _path_order(ctx, drafts)
    return drafts


def _hop_name(ctx: _Context, data: dict[str, Any], path: KeyPath) -> str | None:
    """An explicit hop name, when it is one a file name can carry (its log is ``hops/<name>.log``)."""
    name = _entry_name(ctx, data, path)
    if name is not None and not _HOP_NAME.fullmatch(name):
        ctx.add(path + ("name",), "expected a hop name of letters, digits, '_', '.' or '-' (not starting with '.' "
                f"or '-', at most 63), found {name!r}")
        return None
    return name


def _hop_values(ctx: _Context, data: dict[str, Any], path: KeyPath, kind: str, gateway: Any) -> dict[str, Any]:
    """The hop's own keys, parsed and checked by its kind."""
    if kind == "stream":
        http = data.get("http")
        if isinstance(http, (int, float)) and not isinstance(http, bool):
            data = {**data, "http": f"{http:g}"}  # YAML reads 1.1 and 2 as numbers: the versions they spell
        return _parse(ctx, data, path, sections.PATH_STREAM)
    if kind == "url":
        values = _parse(ctx, data, path, sections.PATH_URL)
        url = values.get("url")
        if isinstance(url, str) and not _is_url(url):
            _reject(ctx, values, path, "url", f"expected the gateway's http(s) base URL such as "
                    f"http://127.0.0.1:8080/v1, found {url!r}")
        return values
    if kind == "toxiproxy":
        values = _parse(ctx, data, path, sections.PATH_TOXIPROXY)
        _proxy_values(ctx, values, path)
        return values
    return _gateway_values(ctx, data, path, gateway())


def _gateway_values(ctx: _Context, data: dict[str, Any], path: KeyPath, gateway: Gateway) -> dict[str, Any]:
    """A gateway hop: ``config`` (a template file beside the experiment, ``_gateway_config``) or its
    options for the shipped configuration, each one this gateway has."""
    kind, options = gateway.kind, gateway.options
    allowed = [*sections.GATEWAY_KEYS, *options.names()]
    given: dict[str, Any] = {}
    for key, value in data.items():
        if key in sections.GATEWAY_KEYS:
            continue
        if key not in options.names():
            ctx.add(path + (key,), f"{kind} has no option {key!r}{suggest(key, allowed)}; its keys: "
                    f"{', '.join(allowed)}", at="key")
        else:
            given[key] = value
    values: dict[str, Any] = {"options": _parse(ctx, given, path, options)}
    config = data.get("config")
    if config is None:
        return values
    if given:
        ctx.add(path + (next(iter(given)),), f"options ({', '.join(given)}) shape the shipped configuration; "
                f"with config: {config} they would be ignored: set them in that file, or remove config", at="key")
    resolved = _gateway_config(ctx, config, path + ("config",), gateway)
    if resolved is not None:
        values["config"] = resolved
    return values


def _gateway_config(ctx: _Context, config: object, path: KeyPath, gateway: Gateway) -> str | None:
    """A user's configuration: a file (relative to the experiment) that exists and is a template the
    run can fill (it says where to listen: ``{{listen}}`` or ``{{port}}``); its absolute path."""
    from chaos.hops.gateways.base import template_problems

    if not isinstance(config, str) or not config.strip():
        ctx.add(path, f"expected the path of a {gateway.kind} configuration file, found {_describe(config)}")
        return None
    resolved = (ctx.base_dir / os.path.expanduser(config)).resolve()
    try:
        text = _read_small_text(resolved)
    except OSError as exc:
        ctx.add(path, f"{gateway.kind} configuration file {config!r} not found or unreadable (relative to the "
                f"experiment file: {resolved}: {exc.strerror or exc})")
        return None
    for line, column, message in template_problems(text, needs_listen=gateway.listen_in_config):
        where = f"{resolved}:{line}:{column}: " if line else f"{resolved}: "
        ctx.add(path, where + message)
    return str(resolved)


def _read_small_text(path: Path) -> str:
    """A small text file a hop names (its configuration): at most the YAML budget's size, UTF-8."""
    with open(path, "rb") as f:
        data = f.read(DEFAULT_BUDGET.max_bytes + 1)
    if len(data) > DEFAULT_BUDGET.max_bytes:
        raise OSError(f"larger than {DEFAULT_BUDGET.max_bytes} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OSError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _path_order(ctx: _Context, drafts: list[_HopDraft]) -> None:
    """One toxiproxy at most (the network faults act on the one proxy), and a url hop only last: what
    a gateway you run forwards to is its own configuration's business, so no hop after it gets traffic."""
    toxiproxies = [d for d in drafts if d.kind == "toxiproxy"]
    for extra in toxiproxies[1:]:
        ctx.add(extra.path + ("kind",), f"a second toxiproxy hop (the first is {render_path(toxiproxies[0].path)}); "
                "the network faults act on one proxy: keep one")
    for draft in drafts[:-1]:
        if draft.kind == "url":
            ctx.add(draft.path + ("kind",), "a url hop forwards where its own configuration says, so the hops "
                    "after it would get no traffic: make it the last hop (nearest the target)")


def _merge_path(ctx: _Context, drafts: list[_HopDraft], proxy: ProxySpec,
                top: Mapping[str, Any]) -> tuple[tuple[HopSpec, ...], ProxySpec]:
    """The path's hops, named, and the run's Toxiproxy: a toxiproxy hop's settings, or the old
    ``proxy:`` section as a path of one toxiproxy hop (``Experiment.proxy`` set either way, which the
    network faults read)."""
    names = _unique_names(ctx, [(d.path, d.name, d.kind) for d in drafts], "hop")
    hops = tuple(_hop_spec(d, name) for d, name in zip(drafts, names, strict=True))
    if proxy.enabled and top.get("path"):
        carried = next((d for d in drafts if d.kind == "toxiproxy"), None)
        also = (f"path: carries one too ({render_path(carried.path)}): keep that hop and remove proxy:" if carried
                else "write the toxiproxy as a hop of path: where it belongs ({kind: toxiproxy, ...}), and remove "
                     "proxy:")
        ctx.add(("proxy",), f"proxy: (the old form of a path of one toxiproxy hop) beside path: ; {also}", at="key")
        return hops, proxy
    if proxy.enabled:
        return (HopSpec(kind="toxiproxy", name="toxiproxy", proxy=proxy),), proxy
    spec = next((h.proxy for h in hops if h.proxy is not None), None)
    return hops, proxy if spec is None else spec


def _hop_spec(draft: _HopDraft, name: str) -> HopSpec:
    values, kind = draft.values, draft.kind
    if kind == "toxiproxy":
        proxy_name = name if draft.name is not None else ProxySpec().name  # the old default, unnamed
        spec = ProxySpec(enabled=True, server=values.get("server", "auto"), url=values.get("url"),
                         name=proxy_name, listen=values.get("listen", "127.0.0.1:0"))
        return HopSpec(kind=kind, name=name, proxy=spec)
    if kind == "stream":  # what it speaks to its client (http: 2, tls: true) as options, where not the default
        speaks: tuple[tuple[str, Any], ...] = (("http", str(values.get("http", "1.1"))),
                                               ("tls", bool(values.get("tls", False))))
        options = tuple((k, v) for k, v in speaks if v not in ("1.1", False))
        return HopSpec(kind=kind, name=name, tap=bool(values.get("tap", True)), options=options)
    if kind == "url":
        return HopSpec(kind=kind, name=name, url=str(values["url"]).rstrip("/"))
    options = tuple(sorted((k, _frozen(v)) for k, v in values.get("options", {}).items()))
    return HopSpec(kind=kind, name=name, config=values.get("config"), options=options)


def _note_deprecated_proxy(ctx: _Context, experiment: Experiment) -> None:
    """``proxy:`` still works (as a path of one toxiproxy hop); say once per file where it is and what to write."""
    mark = ctx.keys.get(("proxy",))
    where = f"{ctx.file}:{mark.line}" if mark is not None else ctx.file
    if (ctx.file, mark.line if mark else 0) in _DEPRECATION_NOTED:
        return
    _DEPRECATION_NOTED.add((ctx.file, mark.line if mark else 0))
    spec, default = experiment.proxy, ProxySpec()
    if not spec.enabled:
        form = "remove it (it turns nothing on)"
    else:
        keys = [f"{key}: {getattr(spec, key)}" for key in ("server", "url", "listen")
                if getattr(spec, key) != getattr(default, key)]
        named = [f"name: {spec.name}"] if spec.name != default.name else []
        form = "write path: [{" + ", ".join(["kind: toxiproxy", *named, *keys]) + "}] instead"
    print(f"{where}: note: `proxy:` is deprecated: {form}", file=sys.stderr, flush=True)


BASELINE_S = 1.0  # the runner scrapes at least 0.5s of pre-load baseline; keep slack for warm-up


def _prompts(ctx: _Context, raw: object) -> PromptSpec:
    path: KeyPath = ("load", "prompts")
    data = _mapping(ctx, raw, path, "the prompts section")
    if data is None:
        return PromptSpec()
    values = _parse(ctx, data, path, sections.PROMPTS)
    lo, hi = values.get("min_chars"), values.get("max_chars")
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        _reject(ctx, values, path, "min_chars", f"min_chars ({lo}) must not exceed max_chars ({hi})")
        values.pop("max_chars", None)
    source = values.get("source")
    if isinstance(source, str) and source != "synthetic":
        resolved = (ctx.base_dir / source).resolve() if source else None
        if resolved is None or not resolved.is_file():
            _reject(ctx, values, path, "source", f"prompt file {source!r} not found (relative to the experiment "
                    "file); give 'synthetic' or an existing JSONL file")
        else:
            values["source"] = str(resolved)
    mix = PromptSpec().mix
    if values.get("mix") is not None:
        mix = _mix(ctx, values["mix"], path + ("mix",))
    return PromptSpec(**_fields(values, PromptSpec, skip=("mix",)), mix=mix)


def _mix(ctx: _Context, raw: dict[str, Any], path: KeyPath) -> tuple[tuple[str, float], ...]:
    from chaos.model.params import Param

    fraction = Param("mix", "fraction")
    parts: list[tuple[str, float]] = []
    n = ctx.count
    for key, value in raw.items():
        if key not in PROMPT_CLASSES:
            ctx.add(path + (str(key),), f"unknown character class {key!r}{suggest(str(key), PROMPT_CLASSES)}; "
                    f"allowed: {', '.join(PROMPT_CLASSES)}", at="key")
            continue
        try:
            parts.append((key, fraction.parse(value)))
        except ValueError as exc:
            ctx.add(path + (key,), str(exc))
    if ctx.count > n:
        return PromptSpec().mix
    total = sum(f for _, f in parts)
    if abs(total - 1.0) > _MIX_TOLERANCE:
        ctx.add(path, f"the fractions must sum to 1 (100%), found {total:.6g}")
        return PromptSpec().mix
    return tuple(parts)


def _load(ctx: _Context, raw: object, target: TargetSpec) -> LoadSpec:
    path: KeyPath = ("load",)
    if raw is None:
        return LoadSpec()
    data = _mapping(ctx, raw, path, "the load section")
    if data is None:
        return LoadSpec()
    values = _parse(ctx, data, path, sections.LOAD,
                    extra=("connect_backoff", "workload", "tools", "tool_choice", "http"))
    backoff = _connect_backoff(ctx, data.get("connect_backoff"), path + ("connect_backoff",))
    http = _http(ctx, data.get("http"), path + ("http",))
    _positive(ctx, values, path, "rate", "burstiness", "request_timeout", "lag_threshold")
    max_tokens = values.get("max_tokens")
    if target.kind == "builtin" and isinstance(max_tokens, tuple) and max_tokens[1] >= target.max_model_len:
        _reject(ctx, values, path, "max_tokens", f"up to {max_tokens[1]} tokens cannot fit the builtin target's "
                f"max_model_len {target.max_model_len}; lower max_tokens or raise target.max_model_len")
    if values.get("concurrency") is not None and values.get("rate") is not None:
        values.pop("rate")  # reported by the schema's at-most-one-of group
    _shards(ctx, values, path)
    prompts = PromptSpec()
    if values.get("prompts") is not None:
        prompts = _prompts(ctx, values["prompts"])
    headers = _headers(ctx, values["headers"], path + ("headers",)) if values.get("headers") is not None else ()
    workload = parse_workload(ctx, data.get("workload"), path + ("workload",), target, values, data, prompts)
    tools, tool_choice, reasoning = chat_extras(ctx, data, path, str(values.get("endpoint", "completions")))
    return LoadSpec(**_fields(values, LoadSpec, skip=("prompts", "headers", "connect_backoff", "workload", "tools",
                                                      "tool_choice", "reasoning", "http")),
                    prompts=prompts, headers=headers, connect_backoff=backoff, workload=workload, tools=tools,
                    tool_choice=tool_choice, reasoning=reasoning, http=http)


def _http(ctx: _Context, raw: object, path: KeyPath) -> HttpSpec:
    """``load.http``: ``{version, streams_per_connection, window}``; a bare version (``http: 2``) too.
    YAML reads ``1.1`` and ``2`` as numbers: they are taken as the versions they spell."""
    if raw is None:
        return HttpSpec()
    if not isinstance(raw, dict):
        raw = {"version": raw}
    data = _mapping(ctx, raw, path, "a mapping {version: 1.1 | 2 | auto, streams_per_connection, window, keep_alive}")
    if data is None:
        return HttpSpec()
    version = data.get("version")
    if isinstance(version, (int, float)) and not isinstance(version, bool):
        data = {**data, "version": f"{version:g}"}  # 2 -> "2", 1.1 -> "1.1", 2.0 -> "2"
    if isinstance(data.get("keep_alive"), bool):  # YAML 1.1 reads on/off (and yes/no) as booleans
        data = {**data, "keep_alive": "on" if data["keep_alive"] else "off"}
    values = _parse(ctx, data, path, sections.HTTP)
    if values.get("window") is not None:
        values["window"] = int(values["window"])  # a size parses to float bytes
    return HttpSpec(**_fields(values, HttpSpec))


def _connect_backoff(ctx: _Context, raw: object, path: KeyPath) -> tuple[float, float, float] | None:
    """``load.connect_backoff``: ``off`` (YAML's false too) or ``{initial, max, multiplier}``; not given
    (or null): the default, the OpenAI SDK's (``chaos.load.backoff``)."""
    default: tuple[float, float, float] = LoadSpec().connect_backoff or (0.5, 8.0, 2.0)
    if raw is None:
        return default
    if raw is False or raw == "off":
        return None
    data = _mapping(ctx, raw, path, "off or a mapping {initial, max, multiplier}")
    if data is None:
        return default
    values = _parse(ctx, data, path, sections.CONNECT_BACKOFF)
    _positive(ctx, values, path, "initial", "max")
    initial, most = float(values.get("initial", default[0])), float(values.get("max", default[1]))
    if most < initial:
        ctx.add(path + ("max",),
                f"must be at least initial ({format_duration(initial)}), found {format_duration(most)}")
        return default
    return initial, most, float(values.get("multiplier", default[2]))


def _headers(ctx: _Context, raw: dict[str, Any], path: KeyPath) -> tuple[tuple[str, str | None], ...]:
    """``load.headers``: name → a string (or null: not sent), each checked where it stands."""
    from chaos.load.sdk_headers import check_header

    out: list[tuple[str, str | None]] = []
    seen: set[str] = set()
    for name, value in raw.items():
        if not isinstance(name, str):
            ctx.add(path, f"header names must be strings, found {name!r}")
            continue
        if value is not None and not isinstance(value, str):
            ctx.add(path + (name,),
                    f"expected the header's value as a string (quote it), or null to not send it; found {value!r}")
            continue
        problem = check_header(name, value)
        if problem is not None:
            ctx.add(path + (name,), problem, at="key" if problem.startswith(repr(name)) else "value")
            continue
        if name.lower() in seen:
            ctx.add(path + (name,), f"header {name} is given twice (names are case-insensitive)", at="key")
            continue
        seen.add(name.lower())
        out.append((name, value))
    return tuple(out)


def _shards(ctx: _Context, values: dict[str, Any], path: KeyPath) -> None:
    """``load.shards`` and its companions: one generator per shard, a port external shards can be told."""
    _positive(ctx, values, path, "shard_connect_timeout")
    shards = values.get("shards") or 1
    listen = values.get("shard_listen")
    if isinstance(listen, str) and not re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]*):\d{1,5}", listen):
        _reject(ctx, values, path, "shard_listen",
                f"expected host:port such as 127.0.0.1:0 or 0.0.0.0:7070, found {listen!r}")
        listen = None
    if shards > 1 and (values.get("workers") or 1) > 1:
        _reject(ctx, values, path, "workers", "give load.workers or load.shards, not both: each shard is one generator "
                "process; raise shards instead")
    if values.get("shard_launch") == "external":
        if shards < 2:
            _reject(ctx, values, path, "shard_launch", "external shards need load.shards of 2 or more")
        elif isinstance(listen, str) and listen.endswith(":0"):
            _reject(ctx, values, path, "shard_listen",
                    "external shards must be told where to connect: give a fixed port, "
                    "e.g. 0.0.0.0:7070")


def _safety(ctx: _Context, raw: object) -> SafetySpec:
    path: KeyPath = ("safety",)
    if raw is None:
        return SafetySpec()
    data = _mapping(ctx, raw, path, "the safety section")
    if data is None:
        return SafetySpec()
    values = _parse(ctx, data, path, sections.SAFETY, extra=("halt_on", "stop_when", "lever"))
    _positive(ctx, values, path, "max_duration")
    values.pop("stop_when", None)  # the schema lists them for the docs; parsed here, entry by entry
    values.pop("lever", None)
    if data.get("stop_when") is not None:
        values["stop_when"] = _stop_when(ctx, data["stop_when"], path + ("stop_when",))
    if data.get("lever") is not None:
        values["lever"] = _lever(ctx, data["lever"], path + ("lever",))
    allowed = values.pop("allowed_targets", None)
    if allowed is not None:
        values["allowed_targets"] = _allowed_targets(ctx, allowed, path + ("allowed_targets",))
    if data.get("halt_on") is not None:
        values["halt_on"] = _halt_on(ctx, data["halt_on"], path + ("halt_on",))
    interval = values.get("scrape_interval")
    lo, hi = _SCRAPE_BOUNDS
    if isinstance(interval, float) and not lo <= interval <= hi:
        _reject(ctx, values, path, "scrape_interval", f"must lie between {format_duration(lo)} and "
                f"{format_duration(hi)}, found {format_duration(interval)}")
    return SafetySpec(**_fields(values, SafetySpec))


def _capacity(ctx: _Context, raw: object, drafts: list[_PhaseDraft], sla: list[SlaEntry]) -> CapacitySpec | None:
    """``capacity:``: its bounds in order, its cases phases with faults, its SLAs entries that judge one window."""
    path: KeyPath = ("capacity",)
    if raw is None:
        return None
    data = _mapping(ctx, raw, path, "the capacity section")
    if data is None:
        return None
    values = _parse(ctx, data, path, sections.CAPACITY)
    values["low"], values["high"] = values.pop("min", 1.0), values.pop("max", 64.0)
    _capacity_bounds(ctx, values, path)
    faulted = [d.name for d in drafts if d.faults]
    for name in values.get("cases") or ():
        if name != BASELINE_CASE and name not in faulted:
            ctx.add(path + ("cases",), f"unknown case {name!r}{suggest(name, [BASELINE_CASE, *faulted])}; a case is "
                    f"{BASELINE_CASE} or a phase with faults: {', '.join([BASELINE_CASE, *faulted])}")
    # a probe is one window: kinds that compare phases (SlaSpec.capacity_fit false) cannot judge it
    fit = [e.name for e in sla if e.expect == "pass" and e.spec.capacity_fit]
    unfit = sorted({e.kind for e in sla if not e.spec.capacity_fit})
    why = f"{', '.join(unfit)} {'compares' if len(unfit) == 1 else 'compare'} two phases; " if unfit else ""
    for name in values.get("slas") or ():
        if name not in fit:
            ctx.add(path + ("slas",), f"{name!r} is not an SLA entry a probe can judge{suggest(name, fit)}; those "
                    f"are: {', '.join(fit) or 'none'} ({why}expect: fail entries are out)")
    if not fit:
        ctx.add(path, "a capacity search needs at least one SLA entry that judges one window (ttft, itl, "
                "goodput, errors...): the sla section has none")
    return CapacitySpec(**_fields(values, CapacitySpec))


def _capacity_bounds(ctx: _Context, values: dict[str, Any], path: KeyPath) -> None:
    low, high = values["low"], values["high"]
    if values.get("dimension", "concurrency") == "concurrency":
        for key, value in (("min", low), ("max", high), ("start", values.get("start"))):
            if value is not None and (value < 1 or value != int(value)):
                ctx.add(path + (key,), f"concurrency is a whole number of streams (1 or more), found {value:g}")
    if high <= low:
        ctx.add(path + ("max",), f"must be above min ({low:g}), found {high:g}")
    start = values.get("start")
    if start is not None and not low <= start <= high:
        _reject(ctx, values, path, "start", f"must lie between min ({low:g}) and max ({high:g}), found {start:g}")
    if values.get("max_probe", 24.0) < values.get("probe", 6.0):
        ctx.add(path + ("max_probe",), f"must be at least probe ({format_duration(values.get('probe', 6.0))})")


def _allowed_targets(ctx: _Context, raw: dict[str, Any], path: KeyPath) -> AllowedTargets:
    """``safety.allowed_targets``: its syntax checked entry by entry (``chaos.model.allowlist`` matches it at
    run time)."""
    from chaos.model.allowlist import syntax_problems

    values = _parse(ctx, raw, path, sections.ALLOWED_TARGETS)
    allowed = AllowedTargets(**{k: tuple(v) for k, v in values.items() if v is not None})
    for where, message in syntax_problems(allowed):
        ctx.add(path + where, message)
    return allowed


def _halt_on(ctx: _Context, raw: object, path: KeyPath) -> tuple[HaltSpec, ...]:
    """``safety.halt_on``: a list of conditions, each checked against its kind's keys."""
    if not isinstance(raw, list):
        ctx.add(path, f"expected a list of halt conditions ({{kind, ...}}; kinds: {', '.join(sections.HALT_KINDS)}), "
                f"found {_describe(raw)}")
        return ()
    out: list[HaltSpec] = []
    for i, entry in enumerate(raw):
        hpath = path + (i,)
        data = _mapping(ctx, entry, hpath, "a halt condition {kind, ...}")
        if data is None:
            continue
        schema = _kind(ctx, data, hpath, sections.HALT, "halt condition", "docs/targets.md: safety.halt_on")
        if schema is None:
            continue
        n = ctx.count
        values = _parse(ctx, data, hpath, schema)
        _positive(ctx, values, hpath, "window", "above")
        if ctx.count > n:
            continue
        values["name"] = values.get("name") or f"{data['kind']}[{i}]"
        out.append(HaltSpec(**_fields(values, HaltSpec)))
    return tuple(out)


def _stop_when(ctx: _Context, raw: object, path: KeyPath) -> tuple[StopSource, ...]:
    """``safety.stop_when``: a list of fleet signals, each checked against its source's keys; a Prometheus
    entry's alerts written inline or read from a krkn alert-profile file."""
    if not isinstance(raw, list):
        sources = ", ".join(sections.STOP_SOURCES)
        ctx.add(path, f"expected a list of fleet signals ({{source, ...}}; sources: {sources}), found {_describe(raw)}")
        return ()
    out: list[StopSource] = []
    for i, entry in enumerate(raw):
        spath = path + (i,)
        data = _mapping(ctx, entry, spath, "a fleet signal {source, ...}")
        if data is None:
            continue
        source = data.get("source")
        if not isinstance(source, str) or source not in sections.STOP_WHEN:
            known = ", ".join(sections.STOP_SOURCES)
            ctx.add(spath + ("source",) if "source" in data else spath,
                    f"unknown source {source!r}{suggest(str(source), sections.STOP_SOURCES)}; known: {known}"
                    if "source" in data else f"missing required key 'source' ({known})")
            continue
        n = ctx.count
        values = _parse(ctx, data, spath, sections.STOP_WHEN[source], extra=("alerts",))
        url_key = f"{source}_url"
        url = values.pop(url_key, None)
        if isinstance(url, str) and (why := _url_problem(url)):
            ctx.add(spath + (url_key,), f"{why}: expected an http:// or https:// URL such as "
                    f"http://prometheus:9090, found {url!r}")
        alerts: tuple[PromAlert, ...] = ()
        if source == "prometheus":
            alerts = _prom_alerts(ctx, data, values.pop("profile", None), spath)
        if ctx.count > n:
            continue
        values["matchers"] = tuple(values.get("matchers") or ())
        _matchers(ctx, values["matchers"], spath + ("matchers",))
        values.update(url=str(url), alerts=alerts, name=values.get("name") or f"{source}[{i}]",
                      where=render_path(spath))
        if any(other.name == values["name"] for other in out):  # notes, halts and verdicts are told apart by it
            ctx.add(spath + ("name",), f"duplicate name {values['name']!r}: each fleet signal needs its own")
            continue
        out.append(StopSource(**_fields(values, StopSource)))
    return tuple(out)


def _url_problem(url: str) -> str | None:
    """What is wrong with a server's URL (scheme, host, port, characters), or None. Pure."""
    from urllib.parse import urlsplit

    if any(c.isspace() or ord(c) < 32 for c in url):
        return "it holds a space or a control character"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError out of 0-65535
    except ValueError as exc:
        return f"it cannot be read ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "no http(s) scheme or no host"
    if port == 0:
        return "port 0"
    return None


def _prom_alerts(ctx: _Context, data: dict[str, Any], profile: str | None, path: KeyPath) -> tuple[PromAlert, ...]:
    """A Prometheus source's krkn alert-profile entries: ``alerts:`` inline or ``profile:`` a file, one of them."""
    inline = data.get("alerts")
    if (inline is None) == (profile is None):
        ctx.add(path, "give alerts: (a list of {expr, description, severity}) or profile: (a krkn alert-profile "
                "file), one of them")
        return ()
    where, wpath = render_path(path + ("alerts",)), path + ("alerts",)
    if profile is not None:
        file = Path(profile) if Path(profile).is_absolute() else ctx.base_dir / profile
        try:
            inline = yaml.safe_load(file.read_text())
        except (OSError, yaml.YAMLError) as exc:
            ctx.add(path + ("profile",), f"could not read the alert profile {str(file)!r}: {exc}")
            return ()
        where, wpath = f"{file}", path + ("profile",)
    if not isinstance(inline, list) or not inline:
        ctx.add(wpath, f"expected a non-empty list of {{expr, description, severity}}, found {_describe(inline)}"
                + (f" in {where}" if profile is not None else ""))
        return ()
    out: list[PromAlert] = []
    for j, entry in enumerate(inline):
        apath = wpath + (j,) if profile is None else wpath
        label = f"{where}[{j}]"
        item = _mapping(ctx, entry, apath, f"an alert {{expr, description, severity}} ({label})")
        if item is None:
            continue
        n = ctx.count
        values = _parse(ctx, item, apath, sections.PROM_ALERT)
        if ctx.count > n:
            continue
        if not str(values.get("expr", "")).strip():
            ctx.add(apath, f"{label}: expr is empty; give a PromQL expression")
            continue
        out.append(PromAlert(**_fields(values, PromAlert), where=label))
    return tuple(out)


def _matchers(ctx: _Context, matchers: tuple[str, ...], path: KeyPath) -> None:
    """Alertmanager label matchers, each checked for its syntax (the server checks them again)."""
    from chaos.fleet.alertmanager import parse_matcher

    for i, text in enumerate(matchers):
        try:
            parse_matcher(text)
        except ValueError as exc:
            ctx.add(path + (i,), str(exc))


def _lever(ctx: _Context, raw: object, path: KeyPath) -> LeverSpec:
    """``safety.lever``: where the fleet lever lives besides the host's default file."""
    data = _mapping(ctx, raw, path, "the lever section {file, namespace, ...}")
    if data is None:
        return LeverSpec()
    values = _parse(ctx, data, path, sections.LEVER)
    return LeverSpec(**_fields(values, LeverSpec))


@dataclass
class _FaultEntry:
    path: KeyPath
    cls: type[Fault]
    name: str | None  # explicit name, or None for the default
    params: dict[str, Any]
    keys: set[str]
    instance: Fault | None = None


@dataclass
class _PhaseDraft:
    name: str
    duration: float
    faults: list[_FaultEntry]
    max_duration: float | None = None  # a phase that runs until decided: its longest


def _phases(ctx: _Context, raw: object, present: bool) -> list[_PhaseDraft]:
    path: KeyPath = ("phases",)
    if not present:
        return []  # reported with the other missing top-level keys
    if not isinstance(raw, list) or not raw:
        ctx.add(path, f"expected a non-empty list of phases ({{name, duration, faults}}), found {_describe(raw)}")
        return []
    from faults.base import REGISTRY as FAULTS

    drafts: list[_PhaseDraft] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(raw):
        ppath = path + (i,)
        data = _mapping(ctx, entry, ppath, "a phase {name, duration, faults}")
        if data is None:
            continue
        ranged = isinstance(data.get("duration"), Mapping)
        values = _parse(ctx, data, ppath, _RANGED_PHASE if ranged else sections.PHASE, extra=("faults",))
        duration, longest = _phase_length(ctx, values, ppath)
        name = values.get("name")
        if isinstance(name, str):
            if not name.strip():
                ctx.add(ppath + ("name",), "a phase name must not be empty")
            elif name in seen:
                ctx.add(ppath + ("name",),
                        f"duplicate phase name {name!r} (also phases[{seen[name]}]); phase names must be unique")
            else:
                seen[name] = i
        faults: list[_FaultEntry] = []
        if data.get("faults") is not None:
            faults = _fault_entries(ctx, data["faults"], ppath + ("faults",), FAULTS)
        drafts.append(_PhaseDraft(name if isinstance(name, str) else f"phase{i}", duration, faults, longest))
    return drafts


# a phase whose duration is a mapping {min, max}: the same keys, its duration parsed by _phase_length
_RANGED_PHASE = Schema(tuple(replace(p, kind="mapping") if p.name == "duration" else p
                             for p in sections.PHASE.params))


def _phase_length(ctx: _Context, values: dict[str, Any], path: KeyPath) -> tuple[float, float | None]:
    """(planned duration, longest or None) of a phase: a fixed ``duration``; ``duration: {min, max}``
    (runs at least min, then until its verdicts decide, at most max); or a scalar with ``until: decided``
    (min that, max ``UNTIL_DECIDED_FACTOR`` times it). 0.0 where the duration was wrong (reported)."""
    raw = values.get("duration")
    if isinstance(raw, Mapping):
        return _duration_range(ctx, raw, path + ("duration",))
    _positive(ctx, values, path, "duration")
    duration = values.get("duration")
    if not isinstance(duration, float):
        return 0.0, None
    if values.get("until") == "decided":
        return duration, duration * sections.UNTIL_DECIDED_FACTOR
    return duration, None


def _duration_range(ctx: _Context, raw: Mapping[Any, Any], path: KeyPath) -> tuple[float, float | None]:
    """``duration: {min, max}``, both durations above zero and min no more than max."""
    data = _mapping(ctx, raw, path, "a duration range {min, max}")
    if data is None:
        return 0.0, None
    values = _parse(ctx, data, path, sections.PHASE_DURATION)
    _positive(ctx, values, path, "min", "max")
    low, high = values.get("min"), values.get("max")
    if isinstance(low, float) and isinstance(high, float) and low > high:
        ctx.add(path + ("max",), f"must be at least min ({format_duration(low)}), found {format_duration(high)}")
        return low, None
    return (low if isinstance(low, float) else 0.0), (high if isinstance(high, float) else None)


def _fault_entries(ctx: _Context, raw: object, path: KeyPath, registry: Mapping[str, type[Fault]]) -> list[_FaultEntry]:
    if not isinstance(raw, list):
        ctx.add(path, f"expected a list of fault entries ({{kind, name?, ...params}}), found {_describe(raw)}")
        return []
    out: list[_FaultEntry] = []
    for j, entry in enumerate(raw):
        fpath = path + (j,)
        data = _mapping(ctx, entry, fpath, "a fault entry {kind, name?, ...params}")
        if data is None:
            continue
        cls = _kind(ctx, data, fpath, registry, "fault", "streamchaos list faults")
        name = _entry_name(ctx, data, fpath)
        if cls is None:
            continue
        n = ctx.count
        values = _parse(ctx, data, fpath, cls.schema, extra=sections.FAULT_ENTRY_KEYS)
        if ctx.count > n:
            continue
        out.append(_FaultEntry(fpath, cls, name, values, set(data)))
    return out


def _kind(ctx: _Context, data: dict[str, Any], path: KeyPath, registry: Mapping[str, Any], what: str, hint: str) -> Any:
    if "kind" not in data:
        ctx.add(path, f"missing required key 'kind' (a {what} kind; see `{hint}`)")
        return None
    kind = data["kind"]
    if not isinstance(kind, str) or kind not in registry:
        known = ", ".join(sorted(registry)) or "none registered"
        ctx.add(path + ("kind",), f"unknown {what} kind {kind!r}{suggest(str(kind), registry)}; known kinds: {known}")
        return None
    return registry[kind]


def _entry_name(ctx: _Context, data: dict[str, Any], path: KeyPath) -> str | None:
    name = data.get("name")
    if name is None:
        return None
    if not isinstance(name, str) or not name.strip():
        ctx.add(path + ("name",), f"expected a non-empty name, found {name!r}")
        return None
    return name


def _unique_names(ctx: _Context, entries: list[tuple[KeyPath, str | None, str]], what: str) -> list[str]:
    """Explicit names must be unique; default names (the kind) get -2, -3, ... where they collide."""
    explicit: dict[str, KeyPath] = {}
    for path, name, _ in entries:
        if name is None:
            continue
        if name in explicit:
            ctx.add(path + ("name",),
                    f"duplicate {what} name {name!r} (also {render_path(explicit[name])}); names must be unique")
        else:
            explicit[name] = path
    taken = set(explicit)
    names: list[str] = []
    for _, name, kind in entries:
        if name is None:
            name, k = kind, 2
            while name in taken:
                name, k = f"{kind}-{k}", k + 1
            taken.add(name)
        names.append(name)
    return names


def _sla(ctx: _Context, raw: object, phase_names: list[str]) -> list[SlaEntry]:
    path: KeyPath = ("sla",)
    if raw is None:
        return []
    if not isinstance(raw, list):
        ctx.add(path, f"expected a list of verifier entries ({{kind, name?, phases?, expect?, ...budgets}}), found "
                f"{_describe(raw)}")
        return []
    from sla.base import REGISTRY as VERIFIERS

    drafts: list[tuple[KeyPath, str | None, str, dict[str, Any], tuple[str, ...] | None, Literal["pass", "fail"],
                       Turns | None, Unobservable]] = []
    for i, entry in enumerate(raw):
        spath = path + (i,)
        data = _mapping(ctx, entry, spath, "a verifier entry {kind, name?, phases?, expect?, ...budgets}")
        if data is None:
            continue
        spec = _kind(ctx, data, spath, VERIFIERS, "SLA", "streamchaos list slas")
        name = _entry_name(ctx, data, spath)
        phases = _scope(ctx, data, spath, phase_names)
        turns = _turns(ctx, data, spath)
        expect = data.get("expect", "pass")
        if expect not in ("pass", "fail"):
            ctx.add(spath + ("expect",),
                    f"expected pass or fail, found {expect!r}{suggest(str(expect), ('pass', 'fail'))}")
        unobservable = _when_unobservable(ctx, data, spath)
        if spec is None:
            continue
        n = ctx.count
        values = _parse(ctx, data, spath, spec.schema, extra=sections.SLA_ENTRY_KEYS)
        if ctx.count > n:
            continue
        drafts.append((spath, name, spec.kind, values, phases, "fail" if expect == "fail" else "pass", turns,
                       unobservable))
    names = _unique_names(ctx, [(p, n, k) for p, n, k, *_ in drafts], "SLA")
    return [SlaEntry(name=nm, spec=VERIFIERS[k].from_params(v), phases=ph, expect=e, turns=t, when_unobservable=u)
            for nm, (_, _, k, v, ph, e, t, u) in zip(names, drafts, strict=True)]


def _when_unobservable(ctx: _Context, data: dict[str, Any], path: KeyPath) -> Unobservable:
    """An entry's ``when_unobservable:``: how a verdict whose evidence cannot exist on the target counts
    (``chaos.model.verdict``): tolerate (the default), inconclusive or fail."""
    raw = data.get("when_unobservable", "tolerate")
    for policy in UNOBSERVABLE_POLICIES:
        if raw == policy:
            return policy
    ctx.add(path + ("when_unobservable",),
            f"expected tolerate, inconclusive or fail (how a verdict whose evidence this engine cannot show "
            f"counts), found {_describe(raw)}{suggest(str(raw), UNOBSERVABLE_POLICIES)}")
    return "tolerate"


def _turns(ctx: _Context, data: dict[str, Any], path: KeyPath) -> Turns | None:
    """An entry's ``turns:`` (chaos.model.turns): which conversation turns its verdict judges."""
    if data.get("turns") is None:
        return None
    try:
        return parse_turns(data["turns"])
    except ValueError as exc:
        ctx.add(path + ("turns",), str(exc))
        return None


def _scope(ctx: _Context, data: dict[str, Any], path: KeyPath, phase_names: list[str]) -> tuple[str, ...] | None:
    raw = data.get("phases")
    if raw is None:
        return None
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items or not all(isinstance(x, str) for x in items):
        ctx.add(path + ("phases",), f"expected a phase name or a non-empty list of phase names, found {_describe(raw)}")
        return None
    for j, name in enumerate(items):
        if name not in phase_names:
            where = path + ("phases",) + ((j,) if isinstance(raw, list) else ())
            ctx.add(where,
                    f"unknown phase {name!r}{suggest(name, phase_names)}; phases: {', '.join(phase_names) or 'none'}")
    return tuple(dict.fromkeys(items))


# ---------------------------------------------------------------------------------------------
# the whole experiment


def _assemble(ctx: _Context, data: object) -> Experiment:
    if not isinstance(data, Mapping):
        found = "an empty document" if data is None else _describe(data)
        ctx.add((), f"the experiment must be a mapping with at least name and phases, found {found}")
        raise ExperimentInvalid(ctx.problems())
    top = _mapping(ctx, data, (), "an experiment") or {}
    name, description, seed = _header(ctx, top)
    target = _target(ctx, top.get("target"))
    proxy = _proxy(ctx, top.get("proxy"), "proxy" in top)
    hops, proxy = _merge_path(ctx, _path(ctx, top.get("path"), "path" in top), proxy, top)
    load = _load(ctx, top.get("load"), target)
    drafts = _phases(ctx, top.get("phases"), "phases" in top)
    entries = _fault_instances(ctx, drafts)
    sla = _sla(ctx, top.get("sla"), list(dict.fromkeys(d.name for d in drafts)))
    safety = _safety(ctx, top.get("safety"))
    capacity = _capacity(ctx, top.get("capacity"), drafts, sla)
    phases = tuple(
        PhaseSpec(d.name, d.duration, tuple(f.instance for f in d.faults if f.instance is not None), d.max_duration)
        for d in drafts
    )
    experiment = Experiment(
        name=name, description=description, seed=seed, target=target, proxy=proxy, path=hops, load=load,
        phases=phases, sla=tuple(sla), safety=safety, capacity=capacity,
        source=None if ctx.file.startswith("<") else ctx.file,
    )
    experiment = _cleanup_window(ctx, experiment, top.get("safety"))
    _check_fits(ctx, experiment, top.get("safety"))
    _cross_checks(ctx, entries, experiment)
    _tap_checks(ctx, top.get("sla"), experiment.path)
    if ctx.found:
        raise ExperimentInvalid(ctx.problems())
    if "proxy" in top:
        _note_deprecated_proxy(ctx, experiment)
    return experiment


def _header(ctx: _Context, top: Mapping[str, Any]) -> tuple[str, str, int]:
    """Unknown and missing top-level keys; the name, description and seed (a wrong one: noted, defaulted)."""
    allowed = sections.TOP_LEVEL.names()
    for key in top:
        if key not in allowed:
            ctx.add((key,), f"unknown section {key!r}{suggest(key, allowed)}; allowed: {', '.join(allowed)}", at="key")
    for key in ("name", "phases"):
        if key not in top:
            ctx.add((), f"missing required key {key!r}")
    name = top.get("name")
    if "name" in top and (not isinstance(name, str) or not name.strip()):
        ctx.add(("name",), f"expected a non-empty string, found {_describe(name)}")
    description = top.get("description")
    if description is not None and not isinstance(description, str):
        ctx.add(("description",), f"expected a string, found {_describe(description)}")
    seed = top.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        ctx.add(("seed",), f"expected an integer, found {_describe(seed)}")
        seed = 0
    return (name if isinstance(name, str) else "", description if isinstance(description, str) else "", seed)


def _fault_instances(ctx: _Context, drafts: list[_PhaseDraft]) -> list[_FaultEntry]:
    """Every phase's fault entries, named uniquely and built into their specs (``entry.instance``)."""
    entries = [f for d in drafts for f in d.faults]
    fault_names = _unique_names(ctx, [(f.path, f.name, f.cls.kind) for f in entries], "fault")
    for entry, fname in zip(entries, fault_names, strict=True):
        try:
            entry.instance = entry.cls.from_params(fname, entry.params)
        except (ValueError, ChaosError) as exc:
            ctx.add(entry.path, str(exc))
    return entries


def _check_fits(ctx: _Context, experiment: Experiment, safety_raw: object) -> None:
    """The hard stop covers the whole run after start-up: the pre-load baseline, the phases, the drain
    and the cleanup window (and the wait for external shards). A run that cannot fit would always end
    in a timeout."""
    safety, load = experiment.safety, experiment.load
    # a phase that runs until decided may last its max: the hard stop must leave it that long
    needed = BASELINE_S + experiment.longest + safety.drain_timeout + safety.cleanup_window
    shard_wait = load.shard_connect_timeout if load.shard_launch == "external" and load.shards > 1 else 0.0
    needed += shard_wait
    if needed <= safety.max_duration:
        return
    waits = f" + shard_connect_timeout {format_duration(shard_wait)}" if shard_wait else ""
    what = (f"the run needs {format_duration(needed)} (phases {format_duration(experiment.longest)}"
            f"{' at their max' if experiment.longest > experiment.duration else ''} + drain_timeout "
            f"{format_duration(safety.drain_timeout)} + cleanup_window {format_duration(safety.cleanup_window)} + "
            f"{format_duration(BASELINE_S)} baseline{waits}), more than max_duration "
            f"{format_duration(safety.max_duration)}")
    if isinstance(safety_raw, Mapping) and "max_duration" in safety_raw:
        ctx.add(("safety", "max_duration"), f"{what}; raise max_duration or shorten the phases")
    else:
        ctx.add(("phases",), f"{what}; raise safety.max_duration or shorten the phases")


def _cleanup_window(ctx: _Context, experiment: Experiment, safety_raw: object) -> Experiment:
    """``safety.cleanup_window`` long enough for every ``kv_cleanup`` entry to see past its ``within``
    (scraping stops when the window ends: a shorter one leaves a leak unobserved). A window written in
    the file that is too short is an error at its key; the default one is raised to what is needed."""
    from sla.kv_cleanup import KvCleanup, cleanup_window_needed

    safety = experiment.safety
    needs: list[tuple[float, float, str]] = []
    for entry in experiment.sla:
        spec: object = entry.spec
        if isinstance(spec, KvCleanup):
            needs.append((cleanup_window_needed(spec.within, safety.scrape_interval), spec.within, entry.name))
    if not needs:
        return experiment
    need, within, name = max(needs)
    if need <= safety.cleanup_window + 1e-9:
        return experiment
    if isinstance(safety_raw, Mapping) and "cleanup_window" in safety_raw:
        ctx.add(("safety", "cleanup_window"),
                f"{format_duration(safety.cleanup_window)} is too short for SLA {name!r}: kv_cleanup judges "
                f"the series {format_duration(within)} (its within) after the last stream ended, and "
                f"scraping stops when the cleanup window ends; the window must exceed within by at least two "
                f"scrape intervals ({format_duration(2 * safety.scrape_interval)}): set cleanup_window: "
                f"{format_duration(math.ceil(need * 10 - 1e-6) / 10)} or more")
        return experiment
    window = math.ceil(need * 10 - 1e-6) / 10  # the default window, raised to the tenth of a second
    return replace(experiment, safety=replace(safety, cleanup_window=window))


def _cross_checks(ctx: _Context, entries: list[_FaultEntry], experiment: Experiment) -> None:
    """The checks each fault makes against the assembled experiment (e.g. "needs the proxy")."""
    for entry in entries:
        if entry.instance is None:
            continue
        try:
            cross = entry.instance.problems(experiment)
        except (ValueError, ChaosError) as exc:
            cross = [("", str(exc))]
        for key, message in cross:
            parts = tuple(key.split(".", 1)) if key else ()  # "selector.app": a key inside a mapping field
            ctx.add(entry.path + parts if parts and parts[0] in entry.keys else entry.path, message)


# the verifiers that read the stream hops' taps, and the hop kind that taps
_TAP_READERS = ("relay", "abort_path")
_STREAM_HOP = "stream"


def _tap_checks(ctx: _Context, raw_sla: object, hops: tuple[HopSpec, ...]) -> None:
    """Each ``relay`` and ``abort_path`` entry has taps to read: ``relay.over`` names a hop of the path
    with a tapping stream hop on each side of it (or is one), and ``abort_path`` has a tapping stream
    hop at all. Read off the raw entries, so each problem is located at the entry's own key."""
    if not isinstance(raw_sla, list):
        return
    for i, entry in enumerate(raw_sla):
        if not isinstance(entry, Mapping) or entry.get("kind") not in _TAP_READERS:
            continue
        if entry["kind"] == "abort_path":
            if not any(h.kind == _STREAM_HOP and h.tap for h in hops):
                ctx.add(("sla", i, "kind"), "a tap with no hop to tap: abort_path reads the stream hops' taps and "
                        "the path has no stream hop that taps; put a {kind: stream} hop on each side of the "
                        "gateways in path:")
        elif isinstance(entry.get("over"), str):
            message = _relay_over_problem(entry["over"], hops)
            if message:
                ctx.add(("sla", i, "over"), message)


def _relay_over_problem(over: str, hops: tuple[HopSpec, ...]) -> str | None:
    """Why ``relay`` cannot judge hop ``over`` of this path, or None: a name the path does not have, or a
    side of it with no stream hop that taps (what it received against what it sent are those taps)."""
    names = [h.name for h in hops]
    if over not in names:
        if not names:
            return (f"relay over {over!r}: the experiment has no path: relay judges a hop of path:, between "
                    "two stream hops, e.g. path: [{kind: stream}, {kind: nginx}, {kind: stream}]")
        return f"relay over {over!r}: not a hop of the path{suggest(over, names)}; its hops: {', '.join(names)}"
    at = names.index(over)
    sides: list[tuple[str, HopSpec | None]]
    if hops[at].kind == _STREAM_HOP:
        sides = [("itself", hops[at])]
    else:
        outer = next((h for h in reversed(hops[:at]) if h.kind == _STREAM_HOP), None)
        inner = next((h for h in hops[at + 1:] if h.kind == _STREAM_HOP), None)
        sides = [("between it and the load", outer), ("between it and the target", inner)]
    for where, hop in sides:
        if hop is None:
            return (f"a tap with no hop to tap: relay over {over!r} compares the stream hops on each side of it, "
                    f"and there is none {where}; put a {{kind: stream}} hop there in path:")
        if not hop.tap:
            return (f"a tap with no hop to tap: relay over {over!r} reads stream hop {hop.name!r}, which has "
                    "tap: false; remove tap: false")
    return None
