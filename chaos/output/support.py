"""Which fault kinds work against which targets, and which SLAs need which metrics (docs/support.md's matrices).

What a fault needs decides where it works, and it is one of a few things: nothing but the load
generator (``client.*``, ``kv.pressure`` with ``method: hog``), Toxiproxy in front of the target
(``network.*``: any server reachable over TCP), an admin API (``server.*`` at the ASGI points: the
builtin stack's, or the middleware a vllm target loads into vLLM), the builtin stack's own hook
points (``server.*`` inside its engine and sockets, ``kv.pressure`` with ``method: reserve``: the
stack streamchaos starts, or one started elsewhere given its admin token), a serving process the
runner started itself (``process.kill``,
``gpu.throttle`` with ``backend: cpu_duty``), or a GPU on the runner's host (``gpu.*`` through NVML
or a co-tenant). ``render_markdown`` draws the tables from the registries and ``chaos.model.engines``.
"""

from __future__ import annotations

from collections.abc import Sequence

from chaos.model.engines import PROFILES

__all__ = ["NEEDS", "TARGETS", "fault_support", "render_markdown"]

# What each way of acting needs → where it works, per target column.
TARGETS: tuple[tuple[str, str], ...] = (
    ("builtin", "builtin (started by the run)"),
    ("builtin-remote", "builtin elsewhere (--target-url + admin token)"),
    ("vllm", "vllm (spawned by the run)"),
    ("remote", "any other server (--target-url)"),
    ("docker", "docker (a container the run starts)"),
    ("kubernetes", "kubernetes (pods behind a Service)"),
)
_WORKS: dict[str, dict[str, str]] = {
    "client": {"builtin": "yes", "builtin-remote": "yes", "vllm": "yes (outside)", "remote": "yes", "docker": "yes",
               "kubernetes": "yes"},
    "proxy": {"builtin": "yes", "builtin-remote": "yes", "vllm": "yes (outside)", "remote": "yes", "docker": "yes",
              "kubernetes": "yes (proxy.listen reachable)"},
    "admin": {"builtin": "yes", "builtin-remote": "yes", "vllm": "yes (inside: middleware)", "remote": "no",
              "docker": "builtin image only", "kubernetes": "no"},
    "engine-hooks": {"builtin": "yes", "builtin-remote": "yes", "vllm": "no", "remote": "no",
                     "docker": "builtin image only",
                     "kubernetes": "no"},
    "pid": {"builtin": "yes", "builtin-remote": "no", "vllm": "yes (API server or EngineCore)", "remote": "no",
            "docker": "no",
            "kubernetes": "no"},
    "gpu": {"builtin": "GPU host", "builtin-remote": "GPU host", "vllm": "CUDA host", "remote": "GPU host",
            "docker": "GPU host",
            "kubernetes": "no"},
    "container": {"builtin": "no", "builtin-remote": "no", "vllm": "no", "remote": "no", "docker": "yes",
                  "kubernetes": "no"},
    "cluster": {"builtin": "no", "builtin-remote": "no", "vllm": "no", "remote": "no", "docker": "no",
                "kubernetes": "yes"},
}
NEEDS_WORDS = {
    "client": "the load generator only",
    "proxy": "Toxiproxy between load and target (`proxy:`)",
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
    "server.timeout": (("where first_byte, mid_stream, request_body", "admin"),
                       ("where engine_step, detokenize, send", "engine-hooks")),
    "server.stall": (("where event_loop", "admin"), ("where engine", "engine-hooks")),
    "server.nagle": (("", "engine-hooks"),),
    "server.": (("", "admin"),),
    "kv.pressure": (("method: reserve", "engine-hooks"), ("method: hog", "client")),
    "process.kill": (("", "pid"),),
    "gpu.throttle": (("backend nvml / contention", "gpu"), ("backend cpu_duty", "pid")),
    "gpu.power_cap": (("", "gpu"),),
    "docker.": (("", "container"),),
    "k8s.": (("", "cluster"),),
}


def _needs(kind: str) -> tuple[tuple[str, str], ...] | None:
    if kind in NEEDS:
        return NEEDS[kind]
    family = kind.split(".", 1)[0] + "."
    return NEEDS.get(family)


def fault_support(kind: str) -> dict[str, str]:
    """Per target column, whether ``kind`` works there (and how); ``?`` for a kind without an entry."""
    ways = _needs(kind)
    if ways is None:
        return {t: "?" for t, _ in TARGETS}
    out: dict[str, str] = {}
    for target, _ in TARGETS:
        cells = []
        for how, need in ways:
            works = _WORKS[need][target]
            if works != "no":
                cells.append(f"{works} ({how})" if how and len(ways) > 1 else works)
        if cells and all(c.startswith("yes") for c in cells):
            cells = ["yes"]
        out[target] = "; ".join(cells) if cells else "no"
    return out


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


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
    lines += ["", "## Fault support", "",
              "Which fault kinds work against which targets (generated from `chaos/output/support.py`). "
              "What each one needs: " + "; ".join(f"{w}" for w in NEEDS_WORDS.values()) + ". "
              "Against a remote engine the profile does not change what a fault can do.", "",
              _row(["fault kind", *(title for _, title in TARGETS), "needs"]), _row(["---"] * (len(TARGETS) + 2))]
    for kind in fault_kinds:
        support = fault_support(kind)
        ways = _needs(kind) or ()
        needs = "; ".join(f"{how + ': ' if how else ''}{NEEDS_WORDS[need]}" for how, need in ways) or "?"
        lines.append(_row([f"`{kind}`", *(support[t] for t, _ in TARGETS), needs]))
    lines += ["", "## What each SLA needs", "",
              "Every SLA but `kv_cleanup` and `abort_propagation` judges the client's own stamps and works against any "
              "engine; `early_close` (and every verdict that counts complete streams) uses the profile's end-of-stream "
              "rule; `kv_cleanup` needs a KV usage and a running-requests series, `abort_propagation` a "
              "running-requests series, each inconclusive (and saying why) without them.", "",
              _row(["SLA", *(f"`{p.name}`" for p in PROFILES.values())]), _row(["---"] * (len(PROFILES) + 1))]
    for kind in sla_kinds:
        cells = []
        for p in PROFILES.values():
            if kind in ("kv_cleanup", "abort_propagation") and p.gateway:
                cells.append("the engine behind it (`target.metrics_url`)")
            elif kind == "kv_cleanup":
                cells.append(f"`{p.usage_series[0][0]}`" + (" (of several)" if len(p.usage_series) > 1 else "")
                             if p.usage_series else "inconclusive")
            elif kind == "abort_propagation":
                cells.append(f"`{p.running_series[0]}`" if p.running_series else "inconclusive")
            elif kind == "early_close":
                cells.append("finish_reason + [DONE]" if p.end.done else "finish_reason")
            else:
                cells.append("yes")
        lines.append(_row([f"`{kind}`", *cells]))
    return "\n".join(lines) + "\n"
