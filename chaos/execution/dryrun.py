"""``streamchaos run --dry-run``: validate, resolve the targets, say what each fault would change and
how it is undone — and touch nothing.

Nothing is started (no stack, no Toxiproxy, no load, no helper process), nothing is written (no run
directory), and the requests are ``GET <target>/v1/models`` for a remote target, then the load's own
request sent once as the run's preflight sends it (a remote server that refuses its shape, a 404 for
the endpoint, would stop the real run before any load), ``GET <toxiproxy>/version`` for an external
Toxiproxy, and for a Kubernetes target ``get`` its Service and the Deployments ``k8s.scale`` names
and ``list`` its pods (``chaos.targets.kubernetes``: each after the allow-list let it, as a run would); none
when ``safety.allowed_targets`` refuses it. For the builtin target, the engine extra the run would
start must be installed. Each fault gives its own account (``Fault.describe``) against a ``Scene`` built from
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

from chaos.host.capped import JSON_LIMIT, Capped, get_capped
from chaos.host.tls import tls_context
from chaos.model.allowlist import credentials_allowed, experiment_reach, refusals
from chaos.model.context import HopInfo, ProxyInfo, Scene, TargetInfo
from chaos.model.experiment import Experiment, HopSpec
from chaos.model.units import format_duration

__all__ = ["DryRun", "dry_run"]

PROBE_TIMEOUT_S = 10.0


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

    async def get(self, url: str, headers: dict[str, str]) -> Capped | str:
        """One GET (the only kind of request a dry run makes), recorded; the response (at most
        ``JSON_LIMIT`` bytes of it) or why there is none."""
        try:
            async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, headers=headers, trust_env=False,
                                         verify=tls_context()) as client:
                response = await get_capped(client, url, limit=JSON_LIMIT, deadline=PROBE_TIMEOUT_S)
        except httpx.HTTPError as exc:
            self.contacted.append(f"GET {url} -> {type(exc).__name__}")
            return f"{type(exc).__name__}: {exc}"
        self.contacted.append(f"GET {url} -> {response.status_code}")
        return response

    async def preflight(self, exp: Experiment, base: str, model: str) -> None:
        """The load's request, once, as the run's preflight sends it: does the target take its shape?"""
        from chaos.execution.preflight import PreflightRefused, preflight
        from chaos.load.workload import endpoint_url
        from chaos.model.engines import PROFILES
        from chaos.model.outcome import next_steps

        url = endpoint_url(base, exp.load.endpoint)
        profile = PROFILES.get(exp.target.engine, PROFILES["openai"])
        try:
            found = await preflight(exp.load, base_url=base, model=model, seed=exp.seed, api_key=exp.target.api_key,
                                    profile=profile, timeout=min(PROBE_TIMEOUT_S, exp.load.request_timeout))
        except PreflightRefused as exc:
            self.contacted.append(f"POST {url} (the load's request) -> refused")
            self.say(f"REFUSES THE LOAD'S REQUEST: {str(exc).splitlines()[0]}", 1)
            for step in next_steps(str(exc)):
                self.say(f"check: {step}", 2)
            self.worst(4)
            return
        self.contacted.append(f"POST {url} (the load's request) -> {found.record.status}")
        dropped = ", ".join(found.dropped) or "nothing"
        self.say(f"takes the load's request at POST {url} (HTTP {found.record.status}, {found.attempts} attempt(s)); "
                 f"dropped from requests: {dropped}", 1)
        if found.ignored:  # taken, but ignored: the run would judge other streams than the experiment asks for
            self.say("ignored by the server: " + ", ".join(f"{c.field} ({c.evidence})" for c in found.ignored), 2)
        if found.warning:  # taken, but a person should know (an answer with no Content-Type)
            self.say(f"warning: {found.warning}", 2)


async def dry_run(experiment: Experiment, *, target_url: str | None = None,
                  environ: Mapping[str, str] = os.environ) -> DryRun:
    """The whole account of ``experiment`` as ``streamchaos run`` would carry it out."""
    out = DryRun()
    exp = experiment
    out.say(f"dry run of {exp.name!r}" + (f" ({exp.source})" if exp.source else "") + f": seed {exp.seed}, "
            f"{len(exp.phases)} phase(s), {_span(exp.duration, exp.longest)} of load; "
            "nothing will be started or changed")

    reaches = experiment_reach(exp, target_url, environ)
    refused = refusals(reaches, exp.safety.allowed_targets)
    out.say()
    out.say("allowed targets (safety.allowed_targets):")
    if not reaches and exp.target.kind == "kubernetes":
        out.say("the target's namespace comes from the kubeconfig: checked once resolved, before any call (below)", 1)
    elif not reaches:
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
    proxy, hops = await _path(exp, target, probe, environ, out)
    out.say()
    _load(exp, proxy, hops, target, out)
    out.say()
    _phases(exp, Scene(target=target, proxy=proxy, hops=hops, safety=exp.safety, target_spawned=spawned), out)
    out.say()
    _slas(exp, out)
    out.say()
    s = exp.safety
    out.say(f"safety: max_duration {format_duration(s.max_duration)}, drain_timeout "
            f"{format_duration(s.drain_timeout)}, cleanup_window {format_duration(s.cleanup_window)}, GPU clock "
            f"changes {'allowed' if s.allow_gpu_clock_changes else 'refused'}")
    _deadline(exp, target_url or exp.target.url, out)
    out.say()
    out.say("contacted: " + ("; ".join(out.contacted) if out.contacted else "nothing")
            + ". Nothing was started, changed or written.")
    verdict = {0: "the run could go ahead", 2: "the run would be refused", 4: "the run could not be carried out here"}
    out.say(f"dry run: {verdict[out.exit_code]} (exit {out.exit_code})")
    return out


async def _target(exp: Experiment, target_url: str | None, probe: bool, out: DryRun) -> tuple[TargetInfo, bool]:
    """The target as the run would have it, and whether the run would start its process: the account
    (``Target.dry_run``) of the class ``start_target`` would make, chosen by the same question."""
    from chaos.targets.registry import target_class

    url = target_url or exp.target.url
    return await target_class(exp.target, url).dry_run(exp, url, probe, out)


async def _path(exp: Experiment, target: TargetInfo, probe: bool, environ: Mapping[str, str],
                out: DryRun) -> tuple[ProxyInfo | None, tuple[HopInfo, ...]]:
    """The hops between load and target as the run would start them (target outward), none started:
    the Toxiproxy proxy among them, and each hop as the faults would see it."""
    if not exp.path:
        out.say("proxy: none (no `proxy:` or `path:`): the load goes straight to the target")
        return None, ()
    if [h.kind for h in exp.path] == ["toxiproxy"]:  # the old `proxy:`: its account as it always was
        only = await _proxy(exp, target.base_url, probe, environ, out)
        return only, () if only is None else (_toxiproxy_hop(exp.path[0], only, target.base_url),)
    from chaos.execution.path import start_allowance_s

    route = " -> ".join(f"{h.name} ({h.kind})" for h in exp.path)
    out.say(f"path: load -> {route} -> target; started from the target outward and stopped at the end (not "
            f"started now); start allowance {format_duration(start_allowance_s(exp))} (the run's deadline grows by "
            "it, as by the target's startup_timeout)")
    proxy: ProxyInfo | None = None
    hops: list[HopInfo] = []
    upstream = target.base_url
    for spec in reversed(exp.path):
        hop, made = await _hop(exp, spec, upstream, probe, environ, out)
        proxy = made or proxy
        hops.append(hop)
        upstream = hop.base_url
    return proxy, tuple(reversed(hops))


_PLACEHOLDER = "127.0.0.1:<port>"


async def _hop(exp: Experiment, spec: HopSpec, upstream: str, probe: bool, environ: Mapping[str, str],
               out: DryRun) -> tuple[HopInfo, ProxyInfo | None]:
    """One hop's account (said before the hops nearer the load: the order they would start in)."""
    root = f"http://{_PLACEHOLDER}{urlsplit(upstream).path}"
    if spec.kind == "toxiproxy":
        proxy = await _proxy(exp, upstream, probe, environ, out, hop=spec.name)
        if proxy is None:
            return HopInfo(spec.name, spec.kind, _PLACEHOLDER, upstream, root), None
        return _toxiproxy_hop(spec, proxy, upstream), proxy
    if spec.kind == "url":
        out.say(f"hop {spec.name!r} (url): the gateway you run at {spec.url}: reached, never started or stopped; "
                "what it forwards to is its own configuration's business, not this run's", 1)
        if not credentials_allowed(spec.url or "", exp.safety.allowed_targets):
            out.say("REFUSED: neither on this host's loopback nor allowed by safety.allowed_targets.hosts", 2)
            out.worst(2)
        return HopInfo(spec.name, spec.kind, _host_port(spec.url or ""), "", spec.url or ""), None
    if spec.kind == "stream":
        taps = "taps what it relays (journaled at the end)" if spec.tap else "taps nothing (tap: false)"
        tls = bool(spec.option("tls", False))
        speaks = ("HTTP/2 (h2 by ALPN) and HTTP/1.1 over TLS" if tls else "HTTP/2 (h2c) and HTTP/1.1") \
            if str(spec.option("http", "1.1")) == "2" else ("HTTP/1.1 over TLS" if tls else "HTTP/1.1")
        out.say(f"hop {spec.name!r} (stream): the embedded stream hop, a child process listening on {_PLACEHOLDER}, "
                f"speaking {speaks}, upstream {upstream}; {taps}; stream faults act through its control API", 1)
        if tls:
            root = "https" + root[len("http"):]
        return HopInfo(spec.name, spec.kind, _PLACEHOLDER, upstream, root, control_url=f"http://{_PLACEHOLDER}",
                       taps=spec.tap), None
    _gateway(spec, upstream, out)
    return HopInfo(spec.name, spec.kind, _PLACEHOLDER, upstream, root), None


def _gateway(spec: HopSpec, upstream: str, out: DryRun) -> None:
    """A gateway the run would start: its binary (found, not run), its configuration, its log."""
    from chaos.hops.gateways.base import gateway_class
    from chaos.model.errors import SetupFailed

    gateway = gateway_class(spec.kind)()
    try:
        binary: str | None = gateway.find_binary()  # looked up, never run: a dry run starts no process
    except SetupFailed as exc:
        binary, missing = None, str(exc)
    config = (f"your configuration {spec.config} (its placeholders filled in)" if spec.config
              else f"its shipped streaming configuration ({gateway.options.format(dict(spec.options))})")
    out.say(f"hop {spec.name!r} ({spec.kind}): {binary or spec.kind} from {config}, listening on {_PLACEHOLDER}, "
            f"upstream {upstream}; its version and configuration in the report, its log in the run directory "
            f"(hops/{spec.name}.log)", 1)
    if binary is None:
        out.say(f"NOT POSSIBLE HERE: {missing}", 2)
        out.worst(4)


def _toxiproxy_hop(spec: HopSpec, proxy: ProxyInfo, upstream: str) -> HopInfo:
    listen = _PLACEHOLDER if proxy.listen.endswith(":0") else proxy.listen
    return HopInfo(spec.name, "toxiproxy", listen, upstream, f"http://{listen}{urlsplit(upstream).path}")


async def _proxy(exp: Experiment, upstream_url: str, probe: bool, environ: Mapping[str, str],
                 out: DryRun, hop: str | None = None) -> ProxyInfo | None:
    """The Toxiproxy proxy as the run would create it (the server resolved as ``chaos.execution.proxy``
    would, without starting one), in front of ``upstream_url`` (the target, or the next hop)."""
    spec = exp.proxy
    url = spec.url or environ.get("TOXIPROXY_URL")
    upstream = _host_port(upstream_url)
    at = 0 if hop is None else 1  # the old `proxy:`'s account as it was; a hop's, under the path
    if hop is not None:
        out.say(f"hop {hop!r} (toxiproxy):", at)
        at += 1
    if spec.server in ("auto", "external") and url:
        server, api = "external", url.rstrip("/")
        out.say(f"proxy: the Toxiproxy at {api} (given: proxy.url or TOXIPROXY_URL)", at)
        if probe:
            answer = await out.get(api + "/version", {})
            if isinstance(answer, str) or answer.status_code >= 400:
                out.say(f"DOES NOT ANSWER: GET {api}/version: "
                        f"{answer if isinstance(answer, str) else f'HTTP {answer.status_code}'}", at + 1)
                out.worst(4)
            else:
                out.say(f"answers GET /version: {answer.text.strip()[:40]}", at + 1)
    elif spec.server == "external":
        out.say("proxy: server external, but no proxy.url or TOXIPROXY_URL is set", at)
        out.worst(4)
        return None
    else:
        server, why = _server_to_start(spec.server, environ)
        if why.startswith("NOT POSSIBLE"):
            out.worst(4)
        api = "http://127.0.0.1:<toxiproxy port>"
        out.say(f"proxy: {why}; stopped at the end (not started now)", at)
    out.say(f"proxy {spec.name!r} listening on {spec.listen}, upstream {upstream}: the load goes through it; "
            "deleted at the end of the run", at + 1)
    return ProxyInfo(api_url=api, proxy_name=spec.name, listen=spec.listen, upstream=upstream, server=server,
                     supports_buffer=server == "embedded")


def _server_to_start(choice: str, environ: Mapping[str, str]) -> tuple[str, str]:
    """The Toxiproxy server a run would start (none given by URL), and what to say of it, as
    ``chaos.execution.proxy.resolve_server`` picks it: ``auto`` is the embedded one, whose API answers
    only the run; a binary or a container only when named, their API open to every local user."""
    unguarded = "; ITS API IS UNGUARDED: any local user can redirect the run's proxy (SECURITY.md)"
    if choice == "binary":
        binary = environ.get("TOXIPROXY_SERVER_BIN") or shutil.which("toxiproxy-server")
        if not binary:
            return "binary", "NOT POSSIBLE HERE: no toxiproxy-server on PATH (or TOXIPROXY_SERVER_BIN)"
        return "binary", f"the toxiproxy-server binary {binary}, started on a free loopback port{unguarded}"
    if choice == "docker":
        return "docker", ("a Toxiproxy container through the Docker SDK (the daemon is not asked in a dry run)"
                          + unguarded)
    if choice == "auto":
        return "embedded", ("no proxy.url or TOXIPROXY_URL: the embedded server as a child process, its API answering "
                            "only this run")
    return "embedded", "the embedded server as a child process, its API answering only this run"


def _host_port(url: str) -> str:
    parts = urlsplit(url)
    try:
        port: int | str = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:  # the builtin stack's placeholder port
        port = "<port>"
    return f"{parts.hostname}:{port}"


def _load(exp: Experiment, proxy: ProxyInfo | None, hops: tuple[HopInfo, ...], target: TargetInfo,
          out: DryRun) -> None:
    load = exp.load
    shape = f"closed loop, {load.concurrency} streams in flight" if load.rate is None else \
        f"open loop, {load.rate:g} requests/s (burstiness {load.burstiness:g})" + \
        (f", at most {load.concurrency} in flight" if load.concurrency else "")
    lo, hi = load.max_tokens
    tokens = f"{lo}" if lo == hi else f"{lo}-{hi}"
    if hops and hops[0].kind != "toxiproxy":
        via = f"through the path, to hop {hops[0].name!r} first"
    else:
        via = f"through proxy {proxy.proxy_name!r}" if proxy else f"to {target.base_url}"
    made = f"{tokens} tokens each"
    if load.workload.kind == "trace":  # each request's own output length (ShareGPT: capped)
        made = "as many tokens as the trace says"
    if load.concurrency is None and load.rate is None:  # a Mooncake trace: its timestamps are the schedule
        shape = "open loop at the trace's timestamps"
    out.say(f"load: {shape}; {load.endpoint}, {made}, {via}"
            + (f"; at most {load.max_requests} requests" if load.max_requests else ""))
    from chaos.load.workloads import workload_line

    line = workload_line(load.workload)
    if line:
        out.say(line, 1)
    shards = getattr(load, "shards", 1)
    if shards > 1:
        launch = getattr(load, "shard_launch", "local")
        out.say(f"split across {shards} generator shards "
                f"({'started here' if launch == 'local' else 'started elsewhere'}), coordinated on "
                f"{getattr(load, 'shard_listen', '')}", 1)
    elif load.workers > 1:
        out.say(f"in {load.workers} generator processes on this host", 1)


def _phases(exp: Experiment, scene: Scene, out: DryRun) -> None:
    out.say("timeline (each phase's faults are injected at its start and reverted at its end, however it ends):")
    at, at_most = 0.0, 0.0  # when the phase starts: earliest, and latest after phases that run until decided
    for phase in exp.phases:
        out.say(f"phase {phase.name!r}: +{_span(at, at_most)} for {phase.length_text()}"
                + ("" if phase.faults else ", no faults"), 1)
        here = Scene(target=scene.target, proxy=scene.proxy, hops=scene.hops, safety=scene.safety,
                     target_spawned=scene.target_spawned, phase=phase.name, phase_duration_s=phase.duration)
        for fault in phase.faults:
            account = fault.describe(here)
            out.say(f"fault {fault.name!r} ({fault.kind})", 2)
            out.say(f"changes: {account.changes}", 3)
            out.say(f"undone:  {account.undo}", 3)
            if account.refused:
                out.say(f"WOULD BE REFUSED: {account.refused}", 3)
                out.worst(4)
        at, at_most = at + phase.duration, at_most + phase.longest


def _span(low: float, high: float) -> str:
    """``8s``, or ``8s–60s`` where phases that run until decided make the length a range."""
    return format_duration(low) if high <= low else f"{format_duration(low)}–{format_duration(high)}"


def _deadline(exp: Experiment, url: str | None, out: DryRun) -> None:
    """The run's deadline as ``chaos.execution.deadline`` will set it: the start-up allowance it grants
    the target (its kind's own, as the run asks it) and the path, then the phases against max_duration."""
    from chaos.execution.deadline import START_GRACE_S
    from chaos.execution.path import start_allowance_s
    from chaos.experiment.loader import BASELINE_S
    from chaos.targets.registry import target_class

    allowance = target_class(exp.target, url).startup_allowance_s(exp.target)
    if allowance is None:
        start = f"the target is already running: it has {format_duration(START_GRACE_S)} to answer"
    else:
        start = (f"the target has {format_duration(allowance + START_GRACE_S)} to be ready (its start-up allowance "
                 f"{format_duration(allowance)} + {format_duration(START_GRACE_S)} to launch and check it)")
    if exp.path:
        start += f", the path {format_duration(start_allowance_s(exp))} to start"
    s = exp.safety
    needed = BASELINE_S + exp.longest + s.drain_timeout + s.cleanup_window
    restarts = any(getattr(fault, "restart", False) for _, fault in exp.faults())
    uncounted = [what for what, on in (("the path's start", bool(exp.path)), ("a restart a fault asks for", restarts))
                 if on]
    verb = "are" if len(uncounted) > 1 else "is"
    out.say(f"deadline: {start}; safety.max_duration counts from when the target is ready"
            + (f" ({' and '.join(uncounted)} {verb} not counted)" if uncounted else ""))
    out.say(f"the run then needs {format_duration(needed)} of max_duration {format_duration(s.max_duration)} (phases "
            f"{format_duration(exp.longest)}{' at their max' if exp.longest > exp.duration else ''} + "
            f"{format_duration(BASELINE_S)} baseline + drain_timeout + cleanup_window): "
            f"{format_duration(max(0.0, s.max_duration - needed))} to spare", 1)


def _slas(exp: Experiment, out: DryRun) -> None:
    from sla.base import REGISTRY

    out.say("judged:" if exp.sla else "judged: nothing (no `sla:` entries)")
    for entry in exp.sla:
        spec = REGISTRY.get(entry.kind)
        params = spec.schema.format(entry.params) if spec else ", ".join(f"{k}={v}" for k, v in entry.params.items())
        scope = ", ".join(entry.phases) if entry.phases else "the whole run"
        expect = "" if entry.expect == "pass" else " (expected to FAIL: a regression check)"
        out.say(f"{entry.name} ({entry.kind}) over {scope}: {params}{expect}", 1)

