"""Undoing what a killed run left behind, from its journal alone (`streamchaos rollback RUN_DIR`).

A fault is outstanding when the journal has its ``plan`` but neither a ``revert`` nor a
``rollback`` after it. Each outstanding fault is undone by its kind's ``Fault.rollback(undo)``
(newest first) and a ``rollback`` event is appended, so running this twice does nothing the
second time.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from chaos.errors import ChaosError, SetupFailed
from chaos.observations import iter_journal

__all__ = ["outstanding", "rollback_run"]


def outstanding(journal_lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Plans not yet undone, oldest first, each with the undo data of its plan and inject merged. Pure."""
    open_plans: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for body in journal_lines:
        if body.get("type") != "fault":
            continue
        name, action = body["fault"], body["action"]
        if action == "plan":
            open_plans[name] = {"fault": name, "kind": body["kind"], "phase": body.get("phase", ""), "undo": dict(body.get("undo") or {})}
            if name in order:
                order.remove(name)
            order.append(name)
        elif action == "inject" and name in open_plans:
            open_plans[name]["undo"].update(body.get("undo") or {})
        elif action in ("revert", "rollback") and name in open_plans:
            del open_plans[name]
            order.remove(name)
    return [open_plans[n] for n in order]


def rollback_run(run_dir: str | Path) -> list[dict[str, Any]]:
    """Undo every outstanding fault of a run; return what was done (one entry per fault)."""
    import faults  # noqa: F401 - registers every fault kind
    from faults.base import REGISTRY

    journal = Path(run_dir) / "journal.jsonl"
    if not journal.is_file():
        raise SetupFailed(f"{run_dir} holds no journal.jsonl: is it a streamchaos run directory?")
    done = []
    pending = outstanding(list(iter_journal(journal)))
    with open(journal, "a", encoding="utf-8") as out:
        for item in reversed(pending):
            cls = REGISTRY.get(item["kind"])
            entry: dict[str, Any] = {"fault": item["fault"], "kind": item["kind"]}
            try:
                if cls is None:
                    raise ChaosError(f"unknown fault kind {item['kind']!r}; cannot roll it back")
                entry["evidence"] = cls.rollback(item["undo"])
                action = "rollback"
            except Exception as exc:  # keep going: one stuck fault must not block the others
                entry["error"] = f"{type(exc).__name__}: {exc}"
                action = "error"
            event = {
                "type": "fault", "fault": item["fault"], "kind": item["kind"], "action": action, "t": time.monotonic_ns(),
                "phase": item["phase"], "evidence": entry.get("evidence", {}), "undo": item["undo"],
                "message": entry.get("error", "rolled back by streamchaos rollback"),
            }
            out.write(json.dumps(event, default=str) + "\n")
            out.flush()
            os.fsync(out.fileno())
            done.append(entry)
    return done
