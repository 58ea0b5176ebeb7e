"""Network faults: toxics on the Toxiproxy proxy between the load generator and the target.

Each fault adds one toxic per direction it acts on (named ``<fault>-<stream>``) and removes it on
revert; ``network.down`` disables the proxy instead. Evidence is the toxic as the server lists it.
Rollback after a crash deletes the same toxics (or re-enables the proxy) by plain HTTP; ``/reset``
is the last resort and is left to the operator, since it would touch other users' toxics.

Bad attribute values that crash a real Toxiproxy (slicer ``average_size: 0``, ``size_variation``
above ``average_size``, a zero or negative bandwidth) are rejected here, at validation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from chaos.errors import FaultUnsupported
from chaos.params import Param, Schema
from faults.base import Fault, FaultEnv, register
from faults.toxiproxy_client import ToxiproxyAPI

__all__ = ["NetworkFault", "ToxicFault"]

DIRECTION = Param("direction", "choice", "downstream", choices=("downstream", "upstream", "both"),
                  doc="downstream: server → client bytes; upstream: client → server")
TOXICITY = Param("toxicity", "fraction", 1.0, doc="share of connections (per direction) the toxic acts on")


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


class NetworkFault(Fault):
    """A fault acting on the proxy named in ``env.proxy``."""

    def problems(self, experiment: Any) -> list[tuple[str, str]]:
        if not experiment.proxy.enabled:
            return [("kind", f"{self.kind} needs a proxy between load and target: add a `proxy:` section (e.g. `proxy: {{server: auto}}`)")]
        return []

    def check(self, env: FaultEnv) -> None:
        if env.proxy is None:
            raise FaultUnsupported(f"{self.kind} needs the experiment's `proxy:` section: no Toxiproxy is in the path")

    def api(self, env: FaultEnv) -> ToxiproxyAPI:
        assert env.proxy is not None
        return ToxiproxyAPI(env.proxy.api_url)


class ToxicFault(NetworkFault):
    """A fault that is one Toxiproxy toxic type with attributes derived from the parameters."""

    toxic_type: ClassVar[str]
    default_direction: ClassVar[str] = "downstream"

    def attributes(self) -> dict[str, int]:
        raise NotImplementedError

    def streams(self) -> list[str]:
        direction = self.params.get("direction") or self.default_direction
        return ["downstream", "upstream"] if direction == "both" else [direction]

    def toxic_names(self) -> list[str]:
        return [f"{self.name}-{stream}" for stream in self.streams()]

    def plan(self, env: FaultEnv) -> dict[str, Any]:
        assert env.proxy is not None
        return {"api_url": env.proxy.api_url, "proxy": env.proxy.proxy_name, "toxics": self.toxic_names()}

    async def inject(self, env: FaultEnv) -> dict[str, Any]:
        assert env.proxy is not None
        api, listed = self.api(env), []
        for stream, name in zip(self.streams(), self.toxic_names()):
            listed.append(await api.add_toxic(
                env.proxy.proxy_name, name=name, type=self.toxic_type, stream=stream,
                toxicity=float(self.params.get("toxicity", 1.0)), attributes=self.attributes(),
            ))
        return {"server": env.proxy.server, "toxics": listed}

    async def revert(self, env: FaultEnv) -> dict[str, Any]:
        assert env.proxy is not None
        api = self.api(env)
        removed = {name: await api.remove_toxic(env.proxy.proxy_name, name) for name in self.toxic_names()}
        return {"removed": removed}

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        if not undo.get("api_url"):
            return {"skipped": "no proxy recorded"}
        api = ToxiproxyAPI(undo["api_url"])
        return {name: api.remove_toxic_sync(undo["proxy"], name) for name in undo.get("toxics", [])}


@register
class Latency(ToxicFault):
    kind = "network.latency"
    summary = "delay every chunk by latency ± jitter (per direction)"
    toxic_type = "latency"
    schema = Schema((
        Param("latency", "duration", required=True, doc="added one-way delay"),
        Param("jitter", "duration", 0.0, doc="uniform ± spread per chunk"),
        DIRECTION, TOXICITY,
    ))

    def attributes(self) -> dict[str, int]:
        return {"latency": _ms(self.params["latency"]), "jitter": _ms(self.params["jitter"])}


@register
class Bandwidth(ToxicFault):
    kind = "network.bandwidth"
    summary = "cap throughput per connection (a slow link)"
    toxic_type = "bandwidth"
    schema = Schema((Param("rate", "data_rate", required=True, min=1000, doc="at least 1KB/s; Toxiproxy counts 1 KB = 1000 B"), DIRECTION, TOXICITY))

    def attributes(self) -> dict[str, int]:
        return {"rate": max(1, int(self.params["rate"] // 1000))}


@register
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

    def problems(self, experiment: Any) -> list[tuple[str, str]]:
        out = super().problems(experiment)
        if self.params["size_variation"] > self.params["average_size"]:
            out.append(("size_variation", f"must be at most average_size ({self.params['average_size']:g} B); larger values crash Toxiproxy"))
        return out

    def attributes(self) -> dict[str, int]:
        return {"average_size": int(self.params["average_size"]), "size_variation": int(self.params["size_variation"]),
                "delay": int(round(self.params["delay"] * 1e6))}


@register
class Reset(ToxicFault):
    kind = "network.reset"
    summary = "reset the connection (TCP RST for new connections) after the next data plus a delay"
    toxic_type = "reset_peer"
    schema = Schema((Param("after", "duration", 0.0, doc="wait after the first chunk before the reset"), DIRECTION, TOXICITY))

    def attributes(self) -> dict[str, int]:
        return {"timeout": _ms(self.params["after"])}


@register
class Timeout(ToxicFault):
    kind = "network.timeout"
    summary = "black-hole data, closing the connection after it has been idle this long (0 = never)"
    toxic_type = "timeout"
    schema = Schema((Param("timeout", "duration", 0.0), DIRECTION, TOXICITY))

    def attributes(self) -> dict[str, int]:
        return {"timeout": _ms(self.params["timeout"])}


@register
class LimitData(ToxicFault):
    kind = "network.limit_data"
    summary = "close each connection after this many bytes (per direction)"
    toxic_type = "limit_data"
    schema = Schema((Param("bytes", "size", required=True, min=1), DIRECTION, TOXICITY))

    def attributes(self) -> dict[str, int]:
        return {"bytes": int(self.params["bytes"])}


@register
class SlowClose(ToxicFault):
    kind = "network.slow_close"
    summary = "hold the close of each connection for a delay"
    toxic_type = "slow_close"
    schema = Schema((Param("delay", "duration", required=True), DIRECTION, TOXICITY))

    def attributes(self) -> dict[str, int]:
        return {"delay": _ms(self.params["delay"])}


@register
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

    def problems(self, experiment: Any) -> list[tuple[str, str]]:
        out = super().problems(experiment)
        if experiment.proxy.server not in ("auto", "embedded"):
            out.append(("kind", f"network.buffer is a non-standard toxic only the embedded Toxiproxy has; proxy.server is {experiment.proxy.server!r}: use server: embedded"))
        return out

    def check(self, env: FaultEnv) -> None:
        super().check(env)
        assert env.proxy is not None
        if not env.proxy.supports_buffer:
            raise FaultUnsupported(f"network.buffer needs the embedded Toxiproxy; this run uses a {env.proxy.server} server. Set proxy.server: embedded")

    def attributes(self) -> dict[str, int]:
        return {"max_bytes": int(self.params["max_bytes"]), "max_time": _ms(self.params["max_time"])}


@register
class Down(NetworkFault):
    kind = "network.down"
    summary = "take the link down: the proxy closes live connections and refuses new ones"
    schema = Schema(())

    def plan(self, env: FaultEnv) -> dict[str, Any]:
        assert env.proxy is not None
        return {"api_url": env.proxy.api_url, "proxy": env.proxy.proxy_name}

    async def inject(self, env: FaultEnv) -> dict[str, Any]:
        assert env.proxy is not None
        return await self.api(env).set_enabled(env.proxy.proxy_name, False)

    async def revert(self, env: FaultEnv) -> dict[str, Any]:
        assert env.proxy is not None
        return await self.api(env).set_enabled(env.proxy.proxy_name, True)

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        if not undo.get("api_url"):
            return {"skipped": "no proxy recorded"}
        return {"proxy": ToxiproxyAPI(undo["api_url"]).enable_sync(undo["proxy"])}
