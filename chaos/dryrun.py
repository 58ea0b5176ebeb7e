"""``streamchaos run --dry-run``: validate, resolve the targets, say what each fault would change and
how it is undone — and touch nothing.

Nothing is started (no stack, no Toxiproxy, no load, no helper process), nothing is written (no run
directory), and the only requests are reads: ``GET <target>/v1/models`` for a remote target and
``GET <toxiproxy>/version`` for an external Toxiproxy, and neither when ``safety.allowed_targets``
refuses it. Each fault gives its own account (``Fault.describe``) against a ``Scene`` built from
what is known without starting anything.

Exit codes as for a run: 0 the run could go ahead, 2 something is refused (the allow-list, an
invalid experiment), 4 it could not be carried out here (the target does not answer, a fault would
be refused at activation).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from chaos.allowlist import experiment_reach, refusals
from chaos.context import ProxyInfo, Scene, TargetInfo
from chaos.experiment.model import Experiment
from chaos.units import format_duration

__all__ = ["DryRun", "dry_run"]

PROBE_TIMEOUT_S = 10.0
_BUILTIN_URL = "http://127.0.0.1:<ephemeral port>"


@dataclass
class DryRun:
    """The account a dry run prints, and the exit code a run would likely end with before any verdict."""

    lines: list[str] = field(default_factory=list)
    exit_code: int = 0
    contacted: list[str] = field(default_factory=list)  # "GET url -> status", every request made

    def say(self, text: str = "", indent: int = 0) -> None:
        self.lines.append("  " * indent + text)

    def worst(self, code: int) -> None:
        # 2 (refused by configuration) outranks 4 (not possible here): fix the configuration first
        if self.exit_code == 0 or code == 2:
            self.exit_code = code


async def dry_run(experiment: Experiment, *, target_url: str | None = None, environ: Mapping[str, str] = os.environ) -> DryRun:
    """The whole account of ``experiment`` as ``streamchaos run`` would carry it out."""
    out = DryRun()
    exp = experiment
    out.say(f"dry run of {exp.name!r}" + (f" ({exp.source})" if exp.source else "") + f": seed {exp.seed}, "
            f"{len(exp.phases)} phase(s), {format_duration(exp.duration)} of load; nothing will be started or changed")

    reaches = experiment_reach(exp, target_url, environ)
    refused = refusals(reaches, exp.safety.allowed_targets)
    out.say()
    out.say("allowed targets (safety.allowed_targets):")
    if not reaches:
        out.say("only this host's loopback is used: nothing to check", 1)
    for reach in reaches:
        where = reach.url or f"namespace {reach.namespace}" + (f", selector {reach.selector}" if reach.selector else "")
        out.say(f"{reach.what}: {where}", 1)
    for text in refused:
        out.say(f"REFUSED: {text}", 1)
    if refused:
        out.worst(2)
    probe = not refused  # a refused run contacts nothing, not even to read

    out.say()
    target, spawned = await _target(exp, target_url, probe, out)
    out.say()
    proxy = await _proxy(exp, target, probe, environ, out)
    out.say()
    _load(exp, proxy, target, out)
    out.say()
    _phases(exp, Scene(target=target, proxy=proxy, safety=exp.safety, target_spawned=spawned), out)
    out.say()
    _slas(exp, out)
    out.say()
    s = exp.safety
    out.say(f"safety: max_duration {format_duration(s.max_duration)}, drain_timeout {format_duration(s.drain_timeout)}, "
            f"cleanup_window {format_duration(s.cleanup_window)}, GPU clock changes {'allowed' if s.allow_gpu_clock_changes else 'refused'}")
    out.say()
    out.say("contacted: " + ("; ".join(out.contacted) if out.contacted else "nothing") + ". Nothing was started, changed or written.")
    verdict = {0: "the run could go ahead", 2: "the run would be refused", 4: "the run could not be carried out here"}
    out.say(f"dry run: {verdict[out.exit_code]} (exit {out.exit_code})")
    return out


async def _get(url: str, headers: dict[str, str], out: DryRun) -> httpx.Response | str:
    """One GET (the only kind of request a dry run makes), recorded; the response or why there is none."""
    try:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, headers=headers) as client:
            response = await client.get(url)
    except httpx.HTTPError as exc:
        out.contacted.append(f"GET {url} -> {type(exc).__name__}")
        return f"{type(exc).__name__}: {exc}"
    out.contacted.append(f"GET {url} -> {response.status_code}")
    return response


async def _target(exp: Experiment, target_url: str | None, probe: bool, out: DryRun) -> tuple[TargetInfo, bool]:
    """The target as the run would have it, and whether the run would start its process."""
    spec = exp.target
    url = target_url or spec.url
    if url:
        base = url.rstrip("/")
        base = base if base.endswith("/v1") else base + "/v1"
        from chaos.targets import configured_admin_token

        admin_token = configured_admin_token(spec)
        root = base[: -len("/v1")]
        kind = "openai" if spec.kind == "builtin" else spec.kind
        info = TargetInfo(kind=kind, base_url=base, metrics_url=spec.metrics_url or root + "/metrics", model=spec.model,
                          admin_url=f"{root}/admin" if admin_token else None)
        out.say(f"target: {kind} server at {base} (already running; streamchaos neither starts nor stops it)")
        if not probe:
            out.say("not contacted: refused above", 1)
            return info, False
        headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
        answer = await _get(base + "/models", headers, out)
        if isinstance(answer, str) or answer.status_code >= 400:
            out.say(f"DOES NOT ANSWER: GET {base}/models: {answer if isinstance(answer, str) else f'HTTP {answer.status_code}'}", 1)
            out.worst(4)
            return info, False
        served = _served(answer)
        model = spec.model if not served or spec.model in served else served[0]
        out.say(f"answers GET /v1/models: serves {', '.join(served) or '(no list)'}; requests will name model {model!r}", 1)
        out.say(f"metrics read from {info.metrics_url} (reading only)", 1)
        out.say("admin API: " + (f"{root}/admin, used for in-process faults only if the server proves it holds the configured "
                                 "token (not asked in a dry run)" if admin_token else
                                 "none configured (target.admin_token_file or STREAMCHAOS_ADMIN_TOKEN): in-process faults are off"), 1)
        return TargetInfo(kind=kind, base_url=base, metrics_url=info.metrics_url, model=model, admin_url=info.admin_url), False
    if spec.kind == "builtin":
        out.say(f"target: the builtin stack, started as a child process on {_BUILTIN_URL} and stopped at the end "
                "(not started now)")
        out.say(f"model {spec.model}, device {spec.device}, kv_blocks {spec.kv_blocks} x {spec.block_size} tokens, "
                f"max_num_seqs {spec.max_num_seqs}, max_model_len {spec.max_model_len}, startup_timeout "
                f"{format_duration(spec.startup_timeout)}", 1)
        return TargetInfo(kind="builtin", base_url=f"{_BUILTIN_URL}/v1", metrics_url=f"{_BUILTIN_URL}/metrics",
                          admin_url=f"{_BUILTIN_URL}/admin", device=spec.device, model=spec.model), True
    if spec.kind == "vllm":
        binary = shutil.which("vllm")
        out.say(f"target: `vllm serve {spec.model}` started as a child process on a free loopback port (not started now)")
        if binary is None:
            out.say("NOT POSSIBLE HERE: no `vllm` command on PATH; install vLLM, or run it yourself and set target.url", 1)
            out.worst(4)
        else:
            out.say(f"vllm: {binary}", 1)
        return TargetInfo(kind="vllm", base_url="http://127.0.0.1:<free port>/v1", device="cuda", model=spec.model), True
    out.say(f"target: kind {spec.kind} needs a URL: set target.url in the experiment or pass --target-url")
    out.worst(4)
    return TargetInfo(kind=spec.kind, base_url="(none)", model=spec.model), False


def _served(response: httpx.Response) -> list[str]:
    try:
        return [str(m["id"]) for m in response.json().get("data", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


async def _proxy(exp: Experiment, target: TargetInfo, probe: bool, environ: Mapping[str, str], out: DryRun) -> ProxyInfo | None:
    """The Toxiproxy proxy as the run would create it (the server resolved as ``chaos.proxy`` would, without starting one)."""
    spec = exp.proxy
    if not spec.enabled:
        out.say("proxy: none (no `proxy:` section): the load goes straight to the target")
        return None
    url = spec.url or environ.get("TOXIPROXY_URL")
    upstream = _host_port(target.base_url)
    if spec.server in ("auto", "external") and url:
        server, api = "external", url.rstrip("/")
        out.say(f"proxy: the Toxiproxy at {api} (given: proxy.url or TOXIPROXY_URL)")
        if probe:
            answer = await _get(api + "/version", {}, out)
            if isinstance(answer, str) or answer.status_code >= 400:
                out.say(f"DOES NOT ANSWER: GET {api}/version: {answer if isinstance(answer, str) else f'HTTP {answer.status_code}'}", 1)
                out.worst(4)
            else:
                out.say(f"answers GET /version: {answer.text.strip()[:40]}", 1)
    elif spec.server == "external":
        out.say("proxy: server external, but no proxy.url or TOXIPROXY_URL is set")
        out.worst(4)
        return None
    else:
        binary = environ.get("TOXIPROXY_SERVER_BIN") or shutil.which("toxiproxy-server")
        if spec.server in ("auto", "binary") and binary:
            server, why = "binary", f"the toxiproxy-server binary {binary}, started on a free loopback port"
        elif spec.server == "binary":
            server, why = "binary", "NOT POSSIBLE HERE: no toxiproxy-server on PATH (or TOXIPROXY_SERVER_BIN)"
            out.worst(4)
        elif spec.server == "docker":
            server, why = "docker", "a Toxiproxy container through the Docker SDK (the daemon is not asked in a dry run)"
        elif spec.server == "auto":
            server, why = "embedded", ("no proxy.url, TOXIPROXY_URL or toxiproxy-server: a Toxiproxy container if a Docker daemon "
                                       "answers (not asked now), else the embedded server as a child process")
        else:
            server, why = "embedded", "the embedded server as a child process"
        api = "http://127.0.0.1:<toxiproxy port>"
        out.say(f"proxy: {why}; stopped at the end (not started now)")
    out.say(f"proxy {spec.name!r} listening on {spec.listen}, upstream {upstream}: the load goes through it; "
            "deleted at the end of the run", 1)
    return ProxyInfo(api_url=api, proxy_name=spec.name, listen=spec.listen, upstream=upstream, server=server,
                     supports_buffer=server == "embedded")


def _host_port(url: str) -> str:
    parts = urlsplit(url)
    try:
        port: int | str = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:  # the builtin stack's placeholder port
        port = "<port>"
    return f"{parts.hostname}:{port}"


def _load(exp: Experiment, proxy: ProxyInfo | None, target: TargetInfo, out: DryRun) -> None:
    load = exp.load
    shape = f"closed loop, {load.concurrency} streams in flight" if load.rate is None else \
        f"open loop, {load.rate:g} requests/s (burstiness {load.burstiness:g})" + (f", at most {load.concurrency} in flight" if load.concurrency else "")
    lo, hi = load.max_tokens
    tokens = f"{lo}" if lo == hi else f"{lo}-{hi}"
    via = f"through proxy {proxy.proxy_name!r}" if proxy else f"to {target.base_url}"
    out.say(f"load: {shape}; {load.endpoint}, {tokens} tokens each, {via}"
            + (f"; at most {load.max_requests} requests" if load.max_requests else ""))
    shards = getattr(load, "shards", 1)
    if shards > 1:
        launch = getattr(load, "shard_launch", "local")
        out.say(f"split across {shards} generator shards ({'started here' if launch == 'local' else 'started elsewhere'}), "
                f"coordinated on {getattr(load, 'shard_listen', '')}", 1)
    elif load.workers > 1:
        out.say(f"in {load.workers} generator processes on this host", 1)


def _phases(exp: Experiment, scene: Scene, out: DryRun) -> None:
    out.say("timeline (each phase's faults are injected at its start and reverted at its end, however it ends):")
    at = 0.0
    for phase in exp.phases:
        out.say(f"phase {phase.name!r}: +{format_duration(at)} for {format_duration(phase.duration)}"
                + ("" if phase.faults else ", no faults"), 1)
        here = Scene(target=scene.target, proxy=scene.proxy, safety=scene.safety, target_spawned=scene.target_spawned,
                     phase=phase.name, phase_duration_s=phase.duration)
        for fault in phase.faults:
            account = fault.describe(here)
            out.say(f"fault {fault.name!r} ({fault.kind})", 2)
            out.say(f"changes: {account.changes}", 3)
            out.say(f"undone:  {account.undo}", 3)
            if account.refused:
                out.say(f"WOULD BE REFUSED: {account.refused}", 3)
                out.worst(4)
        at += phase.duration


def _slas(exp: Experiment, out: DryRun) -> None:
    from sla.base import REGISTRY

    out.say("judged:" if exp.sla else "judged: nothing (no `sla:` entries)")
    for entry in exp.sla:
        spec = REGISTRY.get(entry.kind)
        params = spec.schema.format(entry.params) if spec else ", ".join(f"{k}={v}" for k, v in entry.params.items())
        scope = ", ".join(entry.phases) if entry.phases else "the whole run"
        expect = "" if entry.expect == "pass" else " (expected to FAIL: a regression check)"
        out.say(f"{entry.name} ({entry.kind}) over {scope}: {params}{expect}", 1)
