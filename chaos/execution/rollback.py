"""Undoing what a killed run left behind, from its journal (`streamchaos rollback RUN_DIR`).

A fault is outstanding when the journal has its ``plan`` but neither a ``revert`` nor a
``rollback`` after it. Each outstanding fault is undone by its kind's ``Fault.rollback(undo)``
(newest first) and a ``rollback`` event is appended, so running this twice does nothing the
second time.

The journal is data, never authority. Rollback reads only a journal this user owns that nobody
else can write; it contacts only the URLs configuration allows (``--target-url``,
``--toxiproxy-url``, ``TOXIPROXY_URL``, or those the runner handed its watchdog), never one the
journal alone names; credentials come from the environment; an NVML library only from
``STREAMCHAOS_NVML_LIB``. Each kind's rollback then checks the live state is still this run's
change (a process with the recorded start time, a clock or power limit still at the value the run
set, helpers with the run's exact tag) and leaves anything else alone.

A fault acting through a server the run started (the journal's ``server`` records: pid and start
time) whose process has exited or whose pid now names another process is ``gone``: what it set there
ended with it, and nothing is contacted. One rollback of a run at a time (``rollback_lock``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from chaos.host.journal_file import JOURNAL_NAME, JournalFile
from chaos.host.runfiles import open_append
from chaos.model.errors import ChaosError, RollbackInProgress, SetupFailed
from chaos.model.observations import FaultEvent, iter_journal, to_json

LOCK_NAME = "rollback.lock"
_LOCK_POLL_S = 0.1  # how often a waiting rollback tries the lock again

__all__ = ["LOCK_NAME", "gone_server", "origin", "outstanding", "outstanding_resources", "rollback_lock",
           "rollback_run", "servers_by_origin", "trusted_journal"]


def outstanding(journal_lines: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Plans not yet undone, oldest first, each with the undo data of its plan and inject merged. Pure."""
    open_plans: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for body in journal_lines:
        if body.get("type") != "fault":
            continue
        name, action = body["fault"], body["action"]
        if action == "plan":
            open_plans[name] = {"fault": name, "kind": body["kind"], "phase": body.get("phase", ""),
                                "undo": dict(body.get("undo") or {})}
            if name in order:
                order.remove(name)
            order.append(name)
        elif action == "inject" and name in open_plans:
            open_plans[name]["undo"].update(body.get("undo") or {})
        elif action in ("revert", "rollback") and name in open_plans:
            del open_plans[name]
            order.remove(name)
    return [open_plans[n] for n in order]


def origin(url: str) -> str:
    """``scheme://host:port`` of a URL (the port made explicit), for comparing where requests go."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


def trusted_journal(path: Path) -> None:
    """Refuse a journal another user owns or may write: rollback acts on what it says."""
    try:
        st = path.stat()
    except OSError as exc:
        raise SetupFailed(f"{path.parent} holds no readable {JOURNAL_NAME}: is it a streamchaos run directory? "
                          f"({exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise SetupFailed(f"{path} is not a regular file")
    if st.st_uid != os.getuid():
        raise SetupFailed(f"{path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}): rollback acts only on "
                          "journals it wrote")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SetupFailed(f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): it may have been "
                          "altered; rollback refuses it")


@contextlib.contextmanager
def rollback_lock(run_dir: Path, *, wait_s: float = 0.0) -> Iterator[None]:
    """Hold ``RUN_DIR/rollback.lock`` (``flock``, exclusive) while rolling back: two rollbacks of one journal
    (two watchdogs, a watchdog and ``streamchaos rollback``) would undo each fault twice and interleave their
    records. The holder's pid is written in the file. A second one waits up to ``wait_s`` for the first to
    end (then reads what that one left outstanding), else is refused (``RollbackInProgress``) naming it. The
    file stays (removing it would let a third lock another inode)."""
    path = run_dir / LOCK_NAME
    with open_append(path) as lock:  # 0600, never through a link (chaos.host.runfiles)
        deadline = time.monotonic() + max(0.0, wait_s)
        announced = False
        while True:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _holder(path)
                if time.monotonic() >= deadline:
                    waited = f" after waiting {wait_s:g}s" if wait_s > 0 else ""
                    busy = RollbackInProgress(f"{run_dir}: rollback already in progress by pid {holder}{waited}; "
                                              "nothing was done here (run it again once that one ends to see what "
                                              "is left)")
                    busy.holder = holder
                    raise busy from None
                if not announced:  # a watchdog rolling a killed run back takes seconds: say why nothing happens yet
                    print(f"{run_dir}: rollback in progress by pid {holder}; waiting up to {wait_s:g}s for it to end",
                          file=sys.stderr, flush=True)
                    announced = True
                time.sleep(_LOCK_POLL_S)  # bounded by wait_s
        os.ftruncate(lock.fileno(), 0)
        lock.write(f"{os.getpid()}\n".encode())
        lock.flush()
        yield  # the lock goes with the descriptor, also when this process is killed


def _holder(path: Path) -> str:
    """The pid the lock file names ("unknown" while its holder has not written it yet)."""
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as f:
            text = f.read(32).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


def _foreign_urls(undo: dict[str, Any], allowed: set[str]) -> list[str]:
    """URLs in a plan record that configuration does not allow."""
    out = []
    for key, value in undo.items():
        if not (key.endswith("_url") and value):
            continue
        try:
            if origin(str(value)) not in allowed:
                out.append(str(value))
        except ValueError as exc:  # a malformed port or host: not a URL configuration could allow
            out.append(f"{value!r} ({key}: not a valid URL: {exc})")
    return out


def rollback_run(run_dir: str | Path, *, allowed_urls: Iterable[str] = (),
                 wait_s: float = 0.0) -> list[dict[str, Any]]:
    """Undo every outstanding fault of a run, then remove what it created (containers); return what
    was done (one entry per fault or resource). ``wait_s``: how long to wait for a rollback of the run
    already in progress (``rollback_lock``)."""
    import faults  # noqa: F401 - registers every fault kind
    from faults.base import REGISTRY

    journal = Path(run_dir) / JOURNAL_NAME
    trusted_journal(journal)
    allowed = {origin(u) for u in allowed_urls if u}
    if os.environ.get("TOXIPROXY_URL"):
        allowed.add(origin(os.environ["TOXIPROXY_URL"]))
    done = []
    # one rollback of a run at a time: what is outstanding is read under the lock
    with rollback_lock(Path(run_dir), wait_s=wait_s):
        lines = list(iter_journal(journal))
        pending = outstanding(lines)
        servers = servers_by_origin(lines)
        # What this rollback acts for, from the command line and the journal's own first record: a
        # kind's rollback checks live state against these (container labels), never the plan's claims.
        authority = {"run_dir": str(Path(run_dir).resolve()), "run_id": _run_id(lines)}
        out = JournalFile(journal)
        try:
            for item in reversed(pending):
                entry = _roll_back_one(item, REGISTRY.get(item["kind"]), allowed, servers, authority)
                event = FaultEvent(
                    fault=item["fault"], kind=item["kind"], action="error" if "error" in entry else "rollback",
                    t=time.monotonic_ns(), phase=item["phase"], evidence=entry.get("evidence", {}), undo=item["undo"],
                    message=entry.get("error", "gone with the run" if "gone" in entry.get("evidence", {})
                                      else "rolled back by streamchaos rollback"),
                )
                out.write(to_json(event), durable=True)
                done.append(entry)
            # after the faults acting on them
            done.extend(_release_resources(outstanding_resources(lines), authority, out))
        finally:
            out.close()
    return done


def _roll_back_one(item: dict[str, Any], cls: Any, allowed: set[str], servers: dict[str, dict[str, Any]],
                   authority: dict[str, str]) -> dict[str, Any]:
    """Undo one outstanding fault: ``gone`` when the server it acted on died with the run (nothing
    contacted), else its kind's rollback; an ``error`` entry when that fails or is not allowed."""
    entry: dict[str, Any] = {"fault": item["fault"], "kind": item["kind"]}
    try:
        why_gone = gone_server(item["undo"], servers)
        if why_gone is not None:
            entry["evidence"] = {"gone": why_gone}
            return entry
        foreign = _foreign_urls(item["undo"], allowed)
        if cls is None:
            raise ChaosError(f"unknown fault kind {item['kind']!r}; cannot roll it back")
        if foreign:
            raise ChaosError(
                f"the journal names {', '.join(foreign)}, which configuration does not allow; nothing was sent "
                "there. If that is your target or Toxiproxy, pass --target-url or --toxiproxy-url"
            )
        entry["evidence"] = cls.rollback({**item["undo"], **authority})
    except Exception as exc:  # keep going: one stuck fault must not block the others
        entry["error"] = f"{type(exc).__name__}: {exc}"
    return entry


def servers_by_origin(journal_lines: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The run's server processes (``server`` records, ``chaos.execution.journal``) by the origin of each
    URL they answer on; a later record of an origin (a restarted target) replaces an earlier. Pure."""
    out: dict[str, dict[str, Any]] = {}
    for body in journal_lines:
        if body.get("type") != "server" or not isinstance(body.get("pid"), int):
            continue
        for url in body.get("urls") or []:
            try:
                out[origin(str(url))] = body
            except ValueError:
                continue  # a malformed URL names no origin
    return out


def gone_server(undo: dict[str, Any], servers: dict[str, dict[str, Any]]) -> str | None:
    """Why the server a plan acted through is gone (its pid has exited, or now has another start time:
    reused), so what the fault set there went with it; None when it may still run. Reads /proc only."""
    from chaos.host.procs import alive

    for key, value in undo.items():
        if not (key.endswith("_url") and isinstance(value, str) and value):
            continue
        try:
            server = servers.get(origin(value))
        except ValueError:
            continue
        if server is None or server.get("start_time") is None:
            continue  # not a server this run started, or one whose identity was not recorded: ask it
        pid, started = int(server["pid"]), server["start_time"]
        if not alive(pid, started):
            how = "exited" if not alive(pid) else "is another process now (start time differs)"
            return (f"the {server.get('role', 'server')} at {value} (pid {pid}) {how}; what this fault set "
                    "there ended with it. Nothing was contacted or signalled")
    return None


def _run_id(lines: list[dict[str, Any]]) -> str:
    """The run id of the journal's first record ("" when it has none)."""
    first = next((body for body in lines if body.get("type") == "run"), {})
    return str(first.get("run_id") or "")


def outstanding_resources(journal_lines: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Resources (``Journal.resource``) planned and neither released nor rolled back, oldest first. Pure."""
    open_plans: dict[str, dict[str, Any]] = {}
    for body in journal_lines:
        if body.get("type") != "resource":
            continue
        name, action = str(body.get("name")), body.get("action")
        if action == "plan":
            previous = open_plans.pop(name, {"undo": {}})
            open_plans[name] = {"name": name, "kind": str(body.get("kind")),
                                "undo": {**previous["undo"], **dict(body.get("undo") or {})}}
        elif action in ("release", "rollback"):
            open_plans.pop(name, None)
    return list(open_plans.values())


def _resource_undoers() -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
    from chaos.docker.containers import rollback_container
    from chaos.host.procguard import rollback_group

    return {"docker.container": rollback_container, "process.group": rollback_group}


def _release_resources(pending: list[dict[str, Any]], authority: dict[str, str],
                       out: JournalFile) -> list[dict[str, Any]]:
    """Undo each outstanding resource, newest first; journal each outcome as a resource record."""
    undoers = _resource_undoers()
    done = []
    for item in reversed(pending):
        entry: dict[str, Any] = {"fault": item["name"], "kind": item["kind"], "resource": True}
        action = "rollback"
        try:
            undo = undoers.get(item["kind"])
            if undo is None:
                raise ChaosError(f"unknown resource kind {item['kind']!r}; cannot remove it")
            entry["evidence"] = undo({**item["undo"], **authority})
        except Exception as exc:  # keep going, and leave it outstanding for the next rollback
            entry["error"] = f"{type(exc).__name__}: {exc}"
            action = "error"
        out.write({"type": "resource", "name": item["name"], "kind": item["kind"], "action": action,
                   "t": time.monotonic_ns(),
                   "evidence": entry.get("evidence", {}),
                   "message": entry.get("error", "removed by streamchaos rollback")},
                  durable=True)
        done.append(entry)
    return done
