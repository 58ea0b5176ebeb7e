"""The fleet lever: one switch every run checks before it starts and while it runs (AWS FIS's safety lever).

Two places hold it:

- a **host file** (``DEFAULT_FILE``, ``$STREAMCHAOS_LEVER_FILE``, or ``safety.lever.file``): the lever is
  engaged while *anything* is at that path, so ``sudo touch /var/lib/streamchaos/lever`` works in a hurry.
  Its content is optional JSON, ``{"reason": str, "by": str, "since": unix seconds}``; plain text is read
  as the reason; anything else (empty, binary, unreadable) still engages it, reason unknown.
- a **Kubernetes ConfigMap** (``safety.lever.namespace``, name ``safety.lever.configmap``), for game-days
  run from several machines: ``data.engaged`` is ``"true"`` or ``"false"``, beside ``reason``, ``by``,
  ``since``. No ConfigMap: not engaged. A ConfigMap whose ``engaged`` is missing or anything but
  ``false``/``0``/``no``/``off`` is engaged (a typo must stop runs, not let them through).
  ``lever off`` keeps the object and writes ``engaged: "false"`` with who released it and when.

A run calls ``refuse_if_engaged`` before it touches anything (``RunRefused``, exit 4) and keeps
``watching_lever`` entered while it runs (the runner halts and reverts its faults when it fires).
A lever that cannot be read is never taken as released: ``FleetSignalError`` before a run, a halt after
``LEVER_UNREADABLE_HALT_S`` of failed reads during one.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import os
import socket
import stat
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chaos.model.context import LeverSpec
from chaos.model.errors import ChaosError, FleetSignalError, RunRefused
from chaos.model.observations import Note

__all__ = [
    "DEFAULT_CONFIGMAP",
    "DEFAULT_FILE",
    "LEVER_FILE_ENV",
    "LEVER_UNREADABLE_HALT_S",
    "READ_TIMEOUT_S",
    "LeverState",
    "default_by",
    "engage_configmap",
    "engage_file",
    "lever_file",
    "read_configmap_lever",
    "read_file_lever",
    "read_levers",
    "refuse_if_engaged",
    "release_configmap",
    "release_file",
    "watching_lever",
]

DEFAULT_FILE = "/var/lib/streamchaos/lever"
LEVER_FILE_ENV = "STREAMCHAOS_LEVER_FILE"
DEFAULT_CONFIGMAP = LeverSpec.configmap
LEVER_UNREADABLE_HALT_S = 10.0  # a lever that could not be read this long in a row, while a run runs, halts it
READ_TIMEOUT_S = 5.0  # one ConfigMap read (the client's own bound, CALL_TIMEOUT_S, is 15 s: too long for a lever)
CONTENT_MAX = 64 * 1024  # the most of the file's content read (its existence is what counts)
RELEASED_WORDS = frozenset({"false", "0", "no", "off"})  # data.engaged values that mean released
CAS_TRIES = 5  # compare-and-set attempts when someone else writes the ConfigMap meanwhile


@dataclass(frozen=True)
class LeverState:
    """One lever as read: engaged or not, where, and what its holder wrote (None where unknown).
    For a released ConfigMap lever, ``by``/``since``/``reason`` say who released it and when."""

    engaged: bool
    where: str  # "file /var/lib/streamchaos/lever" or "ConfigMap ns/name"
    reason: str | None = None
    by: str | None = None
    since: float | None = None  # unix seconds

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def release_command(self) -> str:
        """The command that releases this lever, as an operator would type it."""
        kind, _, place = self.where.partition(" ")
        if kind == "ConfigMap":
            namespace, _, name = place.partition("/")
            extra = f" --configmap {name}" if name != DEFAULT_CONFIGMAP else ""
            return f"streamchaos lever off --namespace {namespace}{extra}"
        if place == DEFAULT_FILE:
            return "sudo streamchaos lever off"
        return f"streamchaos lever off --file {place}"

    def describe(self) -> str:
        """One line for humans: where, by whom, since when (UTC and age), why, and how to release it."""
        when = ""
        if self.since is not None:
            stamp = datetime.fromtimestamp(self.since, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            when = f" since {stamp} ({_age(time.time() - self.since)} ago)"
        by = f" by {self.by}" if self.by else ""
        if not self.engaged:
            if by or when:
                return f"the fleet lever ({self.where}) is released: released{by}{when.replace(' since', ' at')}"
            return f"the fleet lever ({self.where}) is released"
        reason = self.reason or "reason unknown"
        return (f"the fleet lever ({self.where}) is ENGAGED{by}{when}: {reason}; "
                f"release it with `{self.release_command()}`")


def _age(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def default_by() -> str:
    """Who is acting: ``user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a uid without a passwd entry (a container)
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"


# -- the host file ---------------------------------------------------------------------------------------


def lever_file(spec: LeverSpec, environ: Mapping[str, str] = os.environ) -> Path:
    """The lever's file: ``spec.file``, else ``$STREAMCHAOS_LEVER_FILE``, else ``DEFAULT_FILE``. Pure."""
    chosen = spec.file or environ.get(LEVER_FILE_ENV, "").strip() or DEFAULT_FILE
    return Path(os.path.expanduser(chosen))


def _unreadable_dir(path: Path, exc: OSError) -> FleetSignalError:
    return FleetSignalError(
        f"cannot tell whether the fleet lever is engaged: {path} cannot be looked up by this user "
        f"({exc.strerror or exc}); let it be searched (chmod a+x on {path.parent} and the folders above it) or set "
        f"{LEVER_FILE_ENV} (safety.lever.file) to a path every run on this host can see")


def read_file_lever(path: Path) -> LeverState:
    """The file lever at ``path``: engaged when anything is there (a dangling link too).

    Raises ``FleetSignalError`` when the path cannot be looked up (a folder on the way this user may not
    search): that is never taken as released. The content is read only when something is there."""
    where = f"file {path}"
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return LeverState(False, where)
    except OSError as exc:
        raise _unreadable_dir(path, exc) from None
    reason: str | None = None
    by: str | None = None
    since: float | None = st.st_mtime  # when it was touched, unless the content says
    if stat.S_ISREG(st.st_mode):
        try:
            with open(path, "rb") as fh:
                raw = fh.read(CONTENT_MAX)
        except OSError as exc:
            raw, reason = b"", f"reason unknown (the file cannot be read: {exc.strerror or exc})"
        reason, by, since = _content(raw, reason, by, since)
    if by is None:
        by = _owner(st.st_uid)
    return LeverState(True, where, reason, by, since)


def _content(raw: bytes, reason: str | None, by: str | None,
             since: float | None) -> tuple[str | None, str | None, float | None]:
    """``(reason, by, since)`` from the file's content; the fallbacks where it says nothing usable."""
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return reason, by, since
    try:
        data = json.loads(text) if text else None
    except ValueError:
        data = None
        first = text.splitlines()[0].strip() if text else ""
        if first.isprintable() and first:
            reason = first[:300]  # `echo "db migration" | sudo tee /var/lib/streamchaos/lever`
    if isinstance(data, dict):
        if isinstance(data.get("reason"), str) and data["reason"].strip():
            reason = data["reason"].strip()[:300]
        if isinstance(data.get("by"), str) and data["by"].strip():
            by = data["by"].strip()[:200]
        if isinstance(data.get("since"), (int, float)) and not isinstance(data.get("since"), bool):
            since = float(data["since"])
    return reason, by, since


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (the file's owner)"
    except (ImportError, KeyError):
        return f"uid {uid} (the file's owner)"


def _cannot_write(path: Path, exc: OSError) -> FleetSignalError:
    return FleetSignalError(
        f"cannot write the fleet lever file {path} ({exc.strerror or exc}): run it as root "
        f"(sudo streamchaos lever ...) or set {LEVER_FILE_ENV} to a path you can write, the same one every run "
        "on this host sees")


def engage_file(path: Path, reason: str | None = None, by: str | None = None) -> LeverState:
    """Engage the file lever: write ``{"reason", "by", "since"}`` at ``path`` (its folder created), readable by
    every user whatever the umask, replaced atomically. Raises ``FleetSignalError`` when it cannot be written."""
    state = LeverState(True, f"file {path}", reason or None, by or default_by(), time.time())
    record = {"reason": state.reason, "by": state.by, "since": state.since}
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.fchmod(fd, 0o644)  # runs as other users must read it: not the umask's 0600
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise _cannot_write(path, exc) from None
    return state


def release_file(path: Path) -> LeverState:
    """Release the file lever (remove ``path``); idempotent. Returns the lever as it was before."""
    before = read_file_lever(path)
    if before.engaged:
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                os.rmdir(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _cannot_write(path, exc) from None
    return before


# -- the ConfigMap ---------------------------------------------------------------------------------------


def _where(spec: LeverSpec) -> str:
    return f"ConfigMap {spec.namespace}/{spec.configmap}"


async def _connect(spec: LeverSpec) -> Any:
    """A ``KubeApi`` for the lever's cluster; every failure is a ``FleetSignalError``."""
    from chaos.k8s.client import KubeApi

    try:
        return await KubeApi.connect(spec.kubeconfig, spec.context, error=FleetSignalError)
    except FleetSignalError:
        raise
    except ChaosError as exc:
        raise FleetSignalError(f"cannot read the fleet lever ({_where(spec)}): {exc}") from None


async def _get(api: Any, spec: LeverSpec) -> dict[str, Any] | None:
    """The ConfigMap as the server sent it, or None when there is none."""
    assert spec.namespace is not None
    try:
        async with asyncio.timeout(READ_TIMEOUT_S):
            return dict(await api.read_configmap(spec.namespace, spec.configmap, READ_TIMEOUT_S))
    except TimeoutError:
        raise FleetSignalError(f"cannot read the fleet lever ({_where(spec)}): the API server {api.server} did not "
                               f"answer within {READ_TIMEOUT_S:g}s") from None
    except FleetSignalError as exc:
        if getattr(exc, "http_status", 0) == 404:
            return None
        raise FleetSignalError(f"cannot read the fleet lever ({_where(spec)}): {exc}") from None


def _state(spec: LeverSpec, obj: dict[str, Any] | None) -> LeverState:
    """The lever a ConfigMap (or its absence) says. Pure."""
    if obj is None:
        return LeverState(False, _where(spec))
    data = obj.get("data") or {}
    engaged = str(data.get("engaged", "")).strip().lower() not in RELEASED_WORDS  # missing: engaged
    try:
        since: float | None = float(data["since"]) if data.get("since") else None
    except ValueError:
        since = None
    return LeverState(engaged, _where(spec), str(data.get("reason") or "").strip()[:300] or None,
                      str(data.get("by") or "").strip()[:200] or None, since)


async def read_configmap_lever(spec: LeverSpec, api: Any | None = None) -> LeverState:
    """The ConfigMap lever ``spec`` names (``spec.namespace`` must be set), through ``api`` or a fresh
    connection. Raises ``FleetSignalError`` when it cannot be read (no configuration, 403, no answer in
    ``READ_TIMEOUT_S``); a missing ConfigMap is a released lever."""
    if api is not None:
        return _state(spec, await _get(api, spec))
    own = await _connect(spec)
    try:
        return _state(spec, await _get(own, spec))
    finally:
        await own.close()


async def _write(spec: LeverSpec, data: dict[str, str], *, create: bool) -> LeverState:
    """Set our keys in the ConfigMap (others kept), by compare-and-set on its resourceVersion; create it when
    it is missing and ``create``. Returns the lever as it was before."""
    assert spec.namespace is not None
    api = await _connect(spec)
    try:
        for _ in range(CAS_TRIES):
            current = await _get(api, spec)
            before = _state(spec, current)
            if current is None and not create:
                return before
            try:
                await api.write_configmap(spec.namespace, spec.configmap, data, current=current,
                                          labels={"app.kubernetes.io/managed-by": "streamchaos"},
                                          timeout_s=READ_TIMEOUT_S)
                return before
            except FleetSignalError as exc:
                if getattr(exc, "http_status", 0) not in (404, 409):  # someone wrote (or deleted) it meanwhile
                    raise FleetSignalError(f"cannot write the fleet lever ({_where(spec)}): {exc}") from None
        raise FleetSignalError(f"cannot write the fleet lever ({_where(spec)}): it kept changing under us "
                               f"({CAS_TRIES} tries); read it with "
                               f"`streamchaos lever status --namespace {spec.namespace}`")
    finally:
        await api.close()


async def engage_configmap(spec: LeverSpec, reason: str | None = None, by: str | None = None) -> LeverState:
    """Engage the ConfigMap lever (create the ConfigMap, or set ``engaged: "true"`` in it). Returns the
    new state; ``FleetSignalError`` when it cannot be written (the message names the Role rule missing)."""
    now, who = time.time(), by or default_by()
    await _write(spec, {"engaged": "true", "reason": reason or "", "by": who, "since": f"{now:.3f}"}, create=True)
    return LeverState(True, _where(spec), reason or None, who, now)


async def release_configmap(spec: LeverSpec, reason: str | None = None, by: str | None = None) -> LeverState:
    """Release the ConfigMap lever: ``engaged: "false"``, with who released it, when and why; the object is
    kept (its history in one place; an operator then needs ``update`` on it only). No ConfigMap: nothing is
    written. Returns the lever as it was before."""
    return await _write(spec, {"engaged": "false", "reason": reason or "", "by": by or default_by(),
                               "since": f"{time.time():.3f}"}, create=False)


# -- what a run calls --------------------------------------------------------------------------------------


async def read_levers(spec: LeverSpec) -> list[LeverState]:
    """Every lever ``spec`` names: the file, then the ConfigMap when ``spec.namespace`` is set.
    Raises ``FleetSignalError`` when one cannot be read."""
    states = [read_file_lever(lever_file(spec))]
    if spec.namespace:
        states.append(await read_configmap_lever(spec))
    return states


async def refuse_if_engaged(spec: LeverSpec) -> list[LeverState]:
    """Called before a run touches anything. Raises ``RunRefused`` naming each engaged lever (who, since
    when, why, how to release it), ``FleetSignalError`` when a lever cannot be read (never taken as
    released); returns the levers as read, for the run's record."""
    states = [read_file_lever(lever_file(spec))]
    unreadable: FleetSignalError | None = None
    if spec.namespace:
        try:
            states.append(await read_configmap_lever(spec))
        except FleetSignalError as exc:
            unreadable = exc
    engaged = [s for s in states if s.engaged]
    if engaged:
        also = f" (and {unreadable})" if unreadable else ""
        raise RunRefused("the run was not started: " + "; ".join(s.describe() for s in engaged) + also)
    if unreadable is not None:
        raise unreadable
    return states


@contextlib.asynccontextmanager
async def watching_lever(spec: LeverSpec, halt: Callable[[str], bool | None],
                         emit: Callable[[Any], None]) -> AsyncIterator[None]:
    """While entered, every lever ``spec`` names is read every ``spec.every`` seconds (the file and the
    ConfigMap each on its own loop: a slow API server never delays the file). When one is engaged: a
    ``halt`` note (``data.lever``: the state) and ``halt(why)``, once, then the watch ends; the runner
    reverts its faults and ends ``halted``. A lever that could not be read for ``LEVER_UNREADABLE_HALT_S``
    in a row halts the run too. On exit, a ``lever_watch`` note: reads, failed reads, where it looked.

    Halt latency: engaged → ``halt`` within ``spec.every`` plus one read: the file read is a ``stat``
    (microseconds), a ConfigMap read at most ``READ_TIMEOUT_S`` (a few ms on a healthy API server).
    An unreadable lever halts within ``LEVER_UNREADABLE_HALT_S`` + ``spec.every`` + ``READ_TIMEOUT_S``."""
    watch = _Watch(spec, halt, emit)
    task = asyncio.create_task(watch.run(), name="lever-watch")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        emit(Note(topic="lever_watch", t=time.monotonic_ns(),
                  data={"every_s": spec.every, "reads": watch.reads, "unreadable": watch.unreadable,
                        "where": watch.where, **({"last_error": watch.last_error} if watch.last_error else {})}))


class _Watch:
    """The watch's loops and counts (one per ``watching_lever``)."""

    def __init__(self, spec: LeverSpec, halt: Callable[[str], bool | None], emit: Callable[[Any], None]) -> None:
        self.spec, self._halt, self.emit = spec, halt, emit
        self.path = lever_file(spec)
        self.where = [f"file {self.path}"] + ([_where(spec)] if spec.namespace else [])
        self.reads = 0
        self.unreadable = 0
        self.last_error = ""
        self.halted = False
        self.api: Any = None

    async def run(self) -> None:
        loops = [self._loop(self.where[0], self._read_file)]
        if self.spec.namespace:
            loops.append(self._loop(self.where[1], self._read_configmap))
        try:
            await asyncio.gather(*loops)
        finally:
            if self.api is not None:
                await self.api.close()

    async def _read_file(self) -> LeverState:
        return read_file_lever(self.path)

    async def _read_configmap(self) -> LeverState:
        if self.api is None:
            self.api = await _connect(self.spec)
        return await read_configmap_lever(self.spec, self.api)

    async def _loop(self, where: str, read: Callable[[], Any]) -> None:
        failing_since: float | None = None
        while not self.halted:
            started = time.monotonic()
            try:
                state: LeverState = await read()
            except Exception as exc:  # noqa: BLE001 - FleetSignalError, or anything a client raises: a failed read
                self.unreadable += 1
                self.last_error = str(exc) or type(exc).__name__
                failing_since = started if failing_since is None else failing_since
                if time.monotonic() - failing_since >= LEVER_UNREADABLE_HALT_S:
                    why = (f"the fleet lever could not be read for {LEVER_UNREADABLE_HALT_S:g}s "
                           f"({where}): {self.last_error}")
                    self.fire(why, {"where": where, "error": self.last_error,
                                    "unreadable_s": round(time.monotonic() - failing_since, 3)})
                    return
            else:
                self.reads += 1
                failing_since = None
                if state.engaged:
                    self.fire(state.describe(), state.as_dict())
                    return
            await asyncio.sleep(max(0.0, self.spec.every - (time.monotonic() - started)))

    def fire(self, why: str, lever: dict[str, Any]) -> None:
        if self.halted:
            return
        self.halted = True
        t = time.monotonic_ns()
        if self._halt(why) is not False:  # taken: the run stops for it (not one already stopping or in teardown)
            self.emit(Note(topic="halt", t=t, data={"reason": why, "top_errors": [], "lever": lever}))

