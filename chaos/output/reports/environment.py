"""The environment a run ran in: versions, host, seed, the target and its engine profile, the path's
hops (each with its effective configuration), the proxy and why that one was chosen, how often the
run read its proxy back (a change it did not make halts it), the warm-up and the load generator's own
lag. Pure: report dict → HTML."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chaos.output.reports.html import esc, kv_table

__all__ = ["render_environment"]

_SECTIONS = (
    ("target", "target"),
    ("engine_profile", "engine profile"),
    ("profile", "engine profile"),
    ("preflight", "preflight"),
    ("proxy", "proxy (and why this one)"),
    ("proxy_watch", "proxy watch (the run reading its proxy back: reads, and reads the server did not answer)"),
    ("warmup", "warm-up request"),
    ("client_lag", "load generator's own event-loop lag"),
    ("shards", "load shards: clock offsets (shard − coordinator, ± bound), records live and merged"),
    ("allowed_targets", "allowed targets (checked before anything started)"),
)


def render_environment(report: Mapping[str, Any]) -> str:
    env: Mapping[str, Any] = report.get("environment") or {}
    host = {k: v for k, v in env.items() if k not in {key for key, _ in _SECTIONS} and k != "versions"}
    rows = [("run", kv_table({"experiment": report.get("experiment"), "seed": report.get("seed"),
                              "status": report.get("status"), "exit code": report.get("exit_code")})),
            ("host", kv_table(host)), ("versions", kv_table(env.get("versions") or {}))]
    shown = set()
    for key, title in _SECTIONS:
        if key in env and title not in shown:
            rows.append((title, kv_table(env[key])))
            shown.add(title)
    hops = report.get("path") or ()
    rows += [(f"hop {hop.get('name')} ({hop.get('kind')})", _hop_cell(hop)) for hop in hops]  # load side first
    if "proxy" not in env and report.get("proxy"):
        rows.append(("proxy", kv_table(report["proxy"])))
    if "target" not in env and report.get("target"):
        rows.append(("target", kv_table(report["target"])))
    if "proxy" not in env and not report.get("proxy") and not hops:
        rows.append(("proxy",
                     '<span class="muted">none: no network fault, the load went straight to the target</span>'))
    return ('<table class="environment">' + "".join(f"<tr><th>{esc(t)}</th><td>{body}</td></tr>" for t, body in rows)
            + "</table>")


def _hop_cell(hop: Mapping[str, Any]) -> str:
    """One hop of the path: its facts, and the configuration it ran with (a started gateway's, secrets
    redacted by the run) as written, folded: the report's answer to "what exactly was in front"."""
    facts = kv_table(hop, skip=("name", "kind", "config"))
    config = hop.get("config")
    if not isinstance(config, str) or not config:
        return facts
    return facts + f"<details><summary>effective configuration</summary><pre>{esc(config)}</pre></details>"
