"""Which fault kinds work against which targets, and which SLAs need which metrics (docs/support.md's matrices).

What a fault needs decides where it works, and it is one of a few things: nothing but the load
generator (``client.*``, ``kv.pressure`` with ``method: hog``), Toxiproxy in front of the target
(``network.*``: any server reachable over TCP), an admin API (``server.*`` at the ASGI points: the
builtin stack's, or the middleware a vllm target loads into vLLM), the builtin stack's own hook
points (``server.*`` inside its engine and sockets, ``kv.pressure`` with ``method: reserve``: the
stack streamchaos starts, or one started elsewhere given its admin token), a serving process the
runner started itself (``process.kill``,
``gpu.throttle`` with ``backend: cpu_duty``), or a GPU on the runner's host (``gpu.*`` through NVML
or a co-tenant). Each target kind declares its column(s), what works there per need (``Target.support``).
``render_markdown`` draws the tables from the registries and ``chaos.model.engines``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from chaos.model.engines import PROFILES, EngineProfile

if TYPE_CHECKING:
    from chaos.targets.base import SupportColumn

__all__ = ["NEEDS", "NEEDS_WORDS", "fault_support", "render_markdown", "target_columns"]



def target_columns() -> tuple[SupportColumn, ...]:
    """The matrix's target columns: every registered kind's ``support`` (``Target.support``), by rank;
    each says, per need below, what works there."""
    from chaos.targets.registry import kinds

    return tuple(sorted((column for cls in kinds().values() for column in cls.support), key=lambda c: c.rank))


NEEDS_WORDS = {
    "client": "the load generator only",
    "proxy": "Toxiproxy between load and target (`path: [{kind: toxiproxy}]`)",
    "stream-hop": "a stream hop in the experiment's `path:` (it stands wherever Toxiproxy can)",
    "admin": "the admin API of the builtin stack or of the middleware a vllm target loads into vLLM",
    "engine-hooks": "the builtin stack's own hook points (engine thread, detokenizer, sockets)",
    "pid": "a serving process the run started",
    "gpu": "a GPU on the runner's host (NVML or a co-tenant)",
    "container": "a container the run started (Docker SDK)",
    "cluster": "a Kubernetes target and the RBAC its faults need",
}

# fault kind (or family prefix ending in '.') → [(how, need)]; the first that fits a target is used
NEEDS: dict[str, tuple[tuple[str, str], ...]] = {
    "client.": (("", "client"),),
    "network.": (("", "proxy"),),
    "stream.": (("", "stream-hop"),),
    "server.timeout": (("where first_byte, mid_stream, request_body", "admin"),
                       ("where engine_step, detokenize, send", "engine-hooks")),
    "server.stall": (("where event_loop", "admin"), ("where engine", "engine-hooks")),
    "server.nagle": (("", "engine-hooks"),),
    "server.": (("", "admin"),),
    "kv.pressure": (("method: reserve", "engine-hooks"), ("method: hog", "client")),
    "kv.prefix_flush": (("", "engine-hooks"),),
    "process.kill": (("", "pid"),),
    "gpu.throttle": (("backend nvml / contention", "gpu"), ("backend cpu_duty", "pid")),
    "gpu.power_cap": (("", "gpu"),),
    "docker.": (("", "container"),),
    "k8s.": (("", "cluster"),),
}


# a need a target column may leave unnamed, and the need whose answer it shares: the stream hop is a
# proxy on the runner's host in front of the target, so it works wherever Toxiproxy does
_SAME_AS = {"stream-hop": "proxy"}


def _needs(kind: str) -> tuple[tuple[str, str], ...] | None:
    if kind in NEEDS:
        return NEEDS[kind]
    family = kind.split(".", 1)[0] + "."
    return NEEDS.get(family)


def fault_support(kind: str) -> dict[str, str]:
    """Per target column, whether ``kind`` works there (and how); ``?`` for a kind without an entry."""
    ways = _needs(kind)
    columns = target_columns()
    if ways is None:
        return {c.key: "?" for c in columns}
    out: dict[str, str] = {}
    for column in columns:
        target = column.key
        cells = []
        for how, need in ways:
            works = column.works.get(need, column.works.get(_SAME_AS.get(need, need), "no"))
            if works != "no":
                cells.append(f"{works} ({how})" if how and len(ways) > 1 else works)
        if cells and all(c.startswith("yes") for c in cells):
            cells = ["yes"]
        out[target] = "; ".join(cells) if cells else "no"
    return out


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


_SERIES_WORDS = {"kv_usage": "a KV usage", "running": "a running-requests"}  # SlaSpec.needs that are series


def _sla_needs(kind: str) -> tuple[str, ...]:
    """What the verifier ``kind`` reads of the engine (``SlaSpec.needs``)."""
    import sla  # noqa: F401  (importing the package registers every verifier)
    from sla.base import REGISTRY

    return tuple(REGISTRY[kind].needs)


def _sla_needs_text(sla_kinds: Sequence[str]) -> str:
    """The paragraph over the SLA table, from the kinds' ``needs``."""
    series = sorted(((k, [n for n in _sla_needs(k) if n in _SERIES_WORDS]) for k in sla_kinds),
                    key=lambda kn: (-len(kn[1]), kn[0]))
    series = [(k, ns) for k, ns in series if ns]
    ends = [k for k in sla_kinds if "end_of_stream" in _sla_needs(k)]
    said = [f"`{k}` {'needs ' if i == 0 else ''}{' and '.join(_SERIES_WORDS[n] for n in ns)} series"
            for i, (k, ns) in enumerate(series)]
    return (f"Every SLA but {' and '.join(f'`{k}`' for k, _ in series) or 'none'} judges the client's own stamps "
            f"and works against any engine; {' and '.join(f'`{k}`' for k in ends)} (and every verdict that counts "
            f"complete streams) uses the profile's end-of-stream rule; {', '.join(said)}, each unobservable "
            "(and saying why) where the engine cannot export them, inconclusive where they could be read and were "
            "not.")


def _sla_cell(needs: Sequence[str], p: EngineProfile) -> str:
    """What an SLA that reads ``needs`` of the engine reads of profile ``p``, or ``yes``."""
    if p.gateway and any(n in _SERIES_WORDS for n in needs):
        return "the engine behind it (`target.metrics_url`)"
    if "kv_usage" in needs:  # (a series the engine cannot export: unobservable, sla.engine_series)
        return (f"`{p.usage_series[0][0]}`" + (" (of several)" if len(p.usage_series) > 1 else "")
                if p.usage_series and p.metrics else "unobservable")
    if "running" in needs:
        return f"`{p.running_series[0]}`" if p.running_series and p.metrics else "unobservable"
    if "end_of_stream" in needs:
        return "finish_reason + [DONE]" if p.end.done else "finish_reason"
    return "yes"


PROTOCOL_WORDS = {"http/1.1": "HTTP/1.1", "h2": "HTTP/2"}


def protocol_cell(kind: str) -> str:
    """The protocols of the load's streams a fault kind acts on (``Fault.protocols``), in words."""
    from faults import REGISTRY

    protocols = getattr(REGISTRY.get(kind), "protocols", ("http/1.1", "h2"))
    words = [PROTOCOL_WORDS.get(p, p) for p in protocols]
    return words[0] + " only" if len(words) == 1 else ", ".join(words)


def render_markdown(fault_kinds: Sequence[str], sla_kinds: Sequence[str]) -> str:
    """The engine profiles, the fault-support matrix and the SLA × metrics matrix, as Markdown."""
    lines = ["## Engine profiles", "",
             "Detected at warm-up (or set with `target.engine`); the report and the console say which and why. "
             "The preflight leaves out the fields a profile does not accept and drops any other the server refuses.",
             "",
             _row(["`target.engine`", "engine", "accepts", "a complete stream ends with", "KV usage series",
                   "running series", "detected by", "notes"]),
             _row(["---"] * 8)]
    for p in PROFILES.values():
        end = "finish_reason, [DONE]" if p.end.done else "finish_reason (no [DONE])"
        usage = ", ".join(f"`{n}`" for n, _ in p.usage_series[:3]) + (", ..." if len(p.usage_series) > 3 else "")
        running = ", ".join(f"`{n}`" for n in p.running_series[:2]) + (", ..." if len(p.running_series) > 2 else "")
        lines.append(_row([f"`{p.name}`", p.title, ", ".join(f"`{a}`" for a in sorted(p.accepts)) or "none", end,
                           usage or ("none" if p.metrics else "no /metrics"), running or "none",
                           p.detection.replace("|", "/"), p.notes]))
    columns = target_columns()
    lines += ["", "## Fault support", "",
              "Which fault kinds work against which targets (generated from `chaos/output/support.py`). "
              "What each one needs: " + "; ".join(f"{w}" for w in NEEDS_WORDS.values()) + ". "
              "Against a remote engine the profile does not change what a fault can do.", "",
              _row(["fault kind", *(c.title for c in columns), "protocol", "needs"]),
              _row(["---"] * (len(columns) + 3))]
    for kind in fault_kinds:
        support = fault_support(kind)
        ways = _needs(kind) or ()
        needs = "; ".join(f"{how + ': ' if how else ''}{NEEDS_WORDS[need]}" for how, need in ways) or "?"
        lines.append(_row([f"`{kind}`", *(support[c.key] for c in columns), protocol_cell(kind), needs]))
    lines += ["", "## What each SLA needs", "", _sla_needs_text(sla_kinds), "",
              _row(["SLA", *(f"`{p.name}`" for p in PROFILES.values())]), _row(["---"] * (len(PROFILES) + 1))]
    for kind in sla_kinds:
        reads = _sla_needs(kind)
        lines.append(_row([f"`{kind}`", *(_sla_cell(reads, p) for p in PROFILES.values())]))
    return "\n".join(lines) + "\n"
