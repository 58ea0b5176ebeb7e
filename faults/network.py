"""Network faults: toxics on the Toxiproxy proxy between the load generator and the target (a `toxiproxy` hop
of the experiment's `path:`, or the old `proxy:` section).

Each fault adds one toxic per direction it acts on (named ``<fault>-<stream>``) and removes it on
revert; ``network.down`` disables the proxy instead. Evidence is the toxic as the server lists it.
Rollback after a crash deletes the same toxics (or re-enables the proxy) by plain HTTP; ``/reset``
is the last resort and is left to the operator, since it would touch other users' toxics.

Bad attribute values that crash a real Toxiproxy (slicer ``average_size: 0``, ``size_variation``
above ``average_size``, a zero or negative bandwidth) are rejected here, at validation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from chaos.model.context import FaultAccount, ProxyInfo, RunContext, Scene
from chaos.model.errors import FaultError, FaultUnsupported
from chaos.model.params import Param, Schema
from chaos.toxiproxy.client import ToxiproxyAPI, ToxiproxyRefused
from faults.base import Fault, Injection, register

if TYPE_CHECKING:
    from chaos.model.experiment import Experiment

__all__ = ["NetworkFault", "ToxicFault"]

DIRECTION = Param("direction", "choice", "downstream", choices=("downstream", "upstream", "both"),
                  doc="downstream: server → client bytes; upstream: client → server")
TOXICITY = Param("toxicity", "fraction", 1.0, doc="share of connections (per direction) the toxic acts on")


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


# what a network fault's refusal tells the user to write (the old `proxy:` section still works, deprecated)
ADD_TOXIPROXY = ("add a toxiproxy hop to the path, e.g. `path: [{kind: toxiproxy}]` (the old `proxy:` section "
                 "still works)")


@dataclass(frozen=True, kw_only=True)
class NetworkFault(Fault):
    """A fault acting on the proxy in the run's context."""

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        if not experiment.proxy.enabled:
            return [("kind", f"{self.kind} needs Toxiproxy between load and target: {ADD_TOXIPROXY}")]
        return []

    def describe(self, scene: Scene) -> FaultAccount:
        account = self.describe_on(scene.proxy or ProxyInfo("(none)", "(none)", "", "", "none"))
        if scene.proxy is None:
            return FaultAccount(account.changes, account.undo,
                                refused=f"{self.kind} needs a toxiproxy hop in the experiment's `path:`")
        return account

    def describe_on(self, proxy: ProxyInfo) -> FaultAccount:
        raise NotImplementedError

    def require_proxy(self, ctx: RunContext) -> ProxyInfo:
        if ctx.proxy is None:
            raise FaultUnsupported(f"{self.kind} needs Toxiproxy between load and target, and none is in the path: "
                                   f"{ADD_TOXIPROXY}")
        return ctx.proxy


@dataclass(frozen=True, kw_only=True)
class ToxicFault(NetworkFault):
    """A fault that is one Toxiproxy toxic type with attributes derived from the parameters."""

    toxic_type: ClassVar[str]

    direction: str
    toxicity: float

    def attributes(self) -> dict[str, int]:
        raise NotImplementedError

    def streams(self) -> list[str]:
        return ["downstream", "upstream"] if self.direction == "both" else [self.direction]

    def toxic_names(self) -> list[str]:
        return [f"{self.name}-{stream}" for stream in self.streams()]

    def activate(self, ctx: RunContext) -> Injection:
        return _Toxics(self, ctx, self.require_proxy(ctx))

    def describe_on(self, proxy: ProxyInfo) -> FaultAccount:
        names = ", ".join(self.toxic_names())
        return FaultAccount(
            changes=(f"adds {self.toxic_type} toxic(s) {names} ({self.schema.format(self.params)}) "
                     f"to proxy {proxy.proxy_name!r} on the Toxiproxy at {proxy.api_url}: {self.summary}"),
            undo=(f"deletes toxic(s) {names} when the phase ends; after a crash `streamchaos rollback` deletes them "
                  "by name; other toxics on that server are left alone"),
        )

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        if not undo.get("api_url"):
            return {"skipped": "no proxy recorded"}
        api = ToxiproxyAPI(undo["api_url"])
        try:
            return {name: api.remove_toxic_sync(undo["proxy"], name) for name in undo.get("toxics", [])}
        except ToxiproxyRefused as exc:
            raise _refusal(exc, undo) from exc


class _Toxics(Injection):
    """The fault's toxics on the run's proxy, one per direction."""

    def __init__(self, fault: ToxicFault, ctx: RunContext, proxy: ProxyInfo) -> None:
        super().__init__(fault, ctx)
        self.toxic = fault
        self.proxy = proxy
        self.api = ToxiproxyAPI(proxy.api_url, proxy.token)

    def plan(self) -> dict[str, Any]:
        return {"api_url": self.proxy.api_url, "proxy": self.proxy.proxy_name, "toxics": self.toxic.toxic_names()}

    async def inject(self) -> dict[str, Any]:
        listed = []
        for stream, name in zip(self.toxic.streams(), self.toxic.toxic_names(), strict=True):
            listed.append(await self.api.add_toxic(
                self.proxy.proxy_name, name=name, type=self.toxic.toxic_type, stream=stream,
                toxicity=self.toxic.toxicity, attributes=self.toxic.attributes(),
            ))
        return {"server": self.proxy.server, "toxics": listed}

    async def revert(self) -> dict[str, Any]:
        removed = {name: await self.api.remove_toxic(self.proxy.proxy_name, name) for name in self.toxic.toxic_names()}
        return {"removed": removed}


@register
@dataclass(frozen=True, kw_only=True)
class Latency(ToxicFault):
    kind = "network.latency"
    summary = "delay every chunk by latency ± jitter (per direction)"
    toxic_type = "latency"
    schema = Schema((
        Param("latency", "duration", required=True, doc="added one-way delay"),
        Param("jitter", "duration", 0.0, doc="uniform ± spread per chunk"),
        DIRECTION, TOXICITY,
    ))

    latency: float
    jitter: float

    def attributes(self) -> dict[str, int]:
        return {"latency": _ms(self.latency), "jitter": _ms(self.jitter)}


@register
@dataclass(frozen=True, kw_only=True)
class Bandwidth(ToxicFault):
    kind = "network.bandwidth"
    summary = "cap throughput per connection (a slow link)"
    toxic_type = "bandwidth"
    schema = Schema((Param("rate", "data_rate", required=True, min=1000,
                           doc="at least 1KB/s; Toxiproxy counts 1 KB = 1000 B"), DIRECTION, TOXICITY))

    rate: float

    def attributes(self) -> dict[str, int]:
        return {"rate": max(1, int(self.rate // 1000))}


@register
@dataclass(frozen=True, kw_only=True)
class Slicer(ToxicFault):
    kind = "network.slicer"
    summary = "split chunks into small TCP writes (tiny packets; multibyte characters split)"
    toxic_type = "slicer"
    schema = Schema((
        Param("average_size", "size", required=True, min=1, doc="target piece size (bytes)"),
        Param("size_variation", "size", 0, min=0, doc="± variation of the split point, at most average_size"),
        Param("delay", "duration", 0.0, doc="pause after each piece"),
        DIRECTION, TOXICITY,
    ))

    average_size: float
    size_variation: float
    delay: float

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        out = super().problems(experiment)
        if self.size_variation > self.average_size:
            out.append(("size_variation", f"must be at most average_size ({self.average_size:g} B); "
                                          "larger values crash Toxiproxy"))
        return out

    def attributes(self) -> dict[str, int]:
        return {"average_size": int(self.average_size), "size_variation": int(self.size_variation),
                "delay": int(round(self.delay * 1e6))}


@register
@dataclass(frozen=True, kw_only=True)
class Reset(ToxicFault):
    kind = "network.reset"
    summary = "reset the connection (TCP RST for new connections) after the next data plus a delay"
    toxic_type = "reset_peer"
    schema = Schema((Param("after", "duration", 0.0, doc="wait after the first chunk before the reset"),
                     DIRECTION, TOXICITY))

    after: float

    def attributes(self) -> dict[str, int]:
        return {"timeout": _ms(self.after)}


@register
@dataclass(frozen=True, kw_only=True)
class Timeout(ToxicFault):
    kind = "network.timeout"
    summary = "black-hole data, closing the connection after it has been idle this long (0 = never)"
    toxic_type = "timeout"
    schema = Schema((Param("timeout", "duration", 0.0), DIRECTION, TOXICITY))

    timeout: float

    def attributes(self) -> dict[str, int]:
        return {"timeout": _ms(self.timeout)}


@register
@dataclass(frozen=True, kw_only=True)
class LimitData(ToxicFault):
    kind = "network.limit_data"
    summary = "close each connection after this many bytes (per direction)"
    toxic_type = "limit_data"
    schema = Schema((Param("bytes", "size", required=True, min=1), DIRECTION, TOXICITY))

    bytes: float

    def attributes(self) -> dict[str, int]:
        return {"bytes": int(self.bytes)}


@register
@dataclass(frozen=True, kw_only=True)
class SlowClose(ToxicFault):
    kind = "network.slow_close"
    summary = "hold the close of each connection for a delay"
    toxic_type = "slow_close"
    schema = Schema((Param("delay", "duration", required=True), DIRECTION, TOXICITY))

    delay: float

    def attributes(self) -> dict[str, int]:
        return {"delay": _ms(self.delay)}


@register
@dataclass(frozen=True, kw_only=True)
class Buffer(ToxicFault):
    kind = "network.buffer"
    summary = "a buffering proxy (proxy_buffering on): hold each response until it ends, or a size or time limit"
    toxic_type = "buffer"
    schema = Schema((
        Param("max_bytes", "size", 0, doc="flush after this many bytes (0 = unlimited)"),
        Param("max_time", "duration", 0.0, doc="flush after holding this long (0 = unlimited)"),
        Param("direction", "choice", "downstream", choices=("downstream",)),
        TOXICITY,
    ))

    max_bytes: float
    max_time: float

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        out = super().problems(experiment)
        if experiment.proxy.server not in ("auto", "embedded"):
            out.append(("kind", "network.buffer is a non-standard toxic only the embedded Toxiproxy has; "
                                f"the toxiproxy hop's server is {experiment.proxy.server!r}: use server: embedded"))
        return out

    def activate(self, ctx: RunContext) -> Injection:
        proxy = self.require_proxy(ctx)
        if not proxy.supports_buffer:
            raise FaultUnsupported(f"network.buffer needs the embedded Toxiproxy; this run uses a {proxy.server} "
                                   "server. Set server: embedded on the toxiproxy hop")
        return super().activate(ctx)

    def attributes(self) -> dict[str, int]:
        return {"max_bytes": int(self.max_bytes), "max_time": _ms(self.max_time)}


@register
@dataclass(frozen=True, kw_only=True)
class Down(NetworkFault):
    kind = "network.down"
    summary = "take the link down: the proxy closes live connections and refuses new ones"
    schema = Schema(())

    def activate(self, ctx: RunContext) -> Injection:
        return _LinkDown(self, ctx, self.require_proxy(ctx))

    def describe_on(self, proxy: ProxyInfo) -> FaultAccount:
        return FaultAccount(
            changes=(f"disables proxy {proxy.proxy_name!r} on the Toxiproxy at {proxy.api_url}: "
                     "live connections through it close, new ones are refused"),
            undo="enables the proxy again when the phase ends; after a crash `streamchaos rollback` enables it",
        )

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        if not undo.get("api_url"):
            return {"skipped": "no proxy recorded"}
        try:
            return {"proxy": ToxiproxyAPI(undo["api_url"]).enable_sync(undo["proxy"])}
        except ToxiproxyRefused as exc:
            raise _refusal(exc, undo) from exc


class _LinkDown(Injection):
    """The proxy disabled for the phase, enabled again on revert."""

    def __init__(self, fault: Down, ctx: RunContext, proxy: ProxyInfo) -> None:
        super().__init__(fault, ctx)
        self.proxy = proxy
        self.api = ToxiproxyAPI(proxy.api_url, proxy.token)

    def plan(self) -> dict[str, Any]:
        return {"api_url": self.proxy.api_url, "proxy": self.proxy.proxy_name}

    async def inject(self) -> dict[str, Any]:
        return await self.api.set_enabled(self.proxy.proxy_name, False)

    async def revert(self) -> dict[str, Any]:
        return await self.api.set_enabled(self.proxy.proxy_name, True)


def _refusal(exc: ToxiproxyRefused, undo: Mapping[str, Any]) -> FaultError:
    """What an offline rollback says when the run's Toxiproxy refuses it (a run's embedded server takes
    orders only with that run's token, never journaled): nothing was undone, and how to end it."""
    pid = _journaled_pid(undo.get("run_dir"), str(undo["api_url"]))
    server = "the Toxiproxy server that run started" if pid is None else f"its Toxiproxy (pid {pid}, per the journal)"
    return FaultError(
        f"{exc}: the run's own Toxiproxy answers only that run's token, which is never journaled, so nothing was "
        f"undone. It ends with its runner; if {server} still runs, the run may still be going (it takes its "
        f"own faults off when it ends), or stop the server{'' if pid is None else f' (`kill {pid}`)'}: what this "
        "fault set there ends with it, and a rollback then finds it gone")


def _journaled_pid(run_dir: object, api_url: str) -> int | None:
    """The pid of the server the run's journal (its ``server`` records) says answers on ``api_url``."""
    if not isinstance(run_dir, str) or not run_dir:
        return None
    from chaos.host.journal_file import JOURNAL_NAME
    from chaos.model.observations import iter_journal

    want, pid = _origin(api_url), None
    for body in iter_journal(Path(run_dir) / JOURNAL_NAME):
        urls = body.get("urls") if body.get("type") == "server" and isinstance(body.get("pid"), int) else None
        if isinstance(urls, list) and any(isinstance(u, str) and _origin(u) == want for u in urls):
            pid = int(body["pid"])  # the latest record of that address
    return pid


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    try:
        return parts.scheme, (parts.hostname or "").lower(), parts.port
    except ValueError:  # a malformed port names no server
        return parts.scheme, "", None
