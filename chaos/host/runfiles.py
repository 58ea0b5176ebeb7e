"""Run directories and the files in them: private to the runner, never through a planted link.

A runner may run as root on a shared host. A run directory another local user created, or can
write to, would let that user plant a symlink (``report.html -> /etc/cron.d/x``) and have the
runner overwrite any file with report content. So a run directory is the runner's own and
0700 (``prepare_private_dir``), and every run file is created with
``O_CREAT | O_EXCL | O_NOFOLLOW`` at 0600 (``open_new``, ``write_new``), appended to only when it is
a regular file of ours with one link (``open_append``), or replaced by a rename that replaces a
link rather than follows it (``replace_file``: a page written again, such as ``verify.json``).

The directory itself is held by a descriptor from the moment it is taken (``prepare_private_dir``):
every file this process creates in it, or in a directory made inside it, is created relative to that
descriptor (``dir_fd``), so swapping the run directory's *name* for a link mid-run (whoever can write
its parent can rename it) moves nothing of the run into the directory the link names. And a run
directory whose parents another user could rename is refused up front (``unsafe_parent``): the
processes a run starts (load shards, hops, vLLM) and the readers after it (``verify``, ``rollback``,
the watchdog) open run files by name.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import secrets
import stat
import threading
from pathlib import Path
from typing import IO, Any

from chaos.model.errors import UsageError

__all__ = ["check_private_dir", "make_private_dir", "open_append", "open_at", "open_new", "prepare_private_dir",
           "release_dir", "replace_file", "touch", "unsafe_parent", "write_new"]

FILE_MODE = 0o600
DIR_MODE = 0o700
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_HELD = 64  # run directories held at once in one process; the oldest is let go past it (a leak bound)

# absolute path of a run directory as named -> a descriptor of the directory taken, and its resolved path
# (a docker target names the run directory resolved)
_held: dict[str, tuple[int, str]] = {}
_held_lock = threading.Lock()


# -- the held descriptors -------------------------------------------------------------------------


def _locate(path: Path | str) -> tuple[int | None, str]:
    """The descriptor of the innermost held run directory ``path`` lies in, and ``path`` relative to
    it; ``(None, path)`` outside every held one (opened by name, as before)."""
    absolute = os.path.abspath(path)
    with _held_lock:
        under = [(d, fd) for key, (fd, real) in _held.items() for d in (key, real)
                 if absolute.startswith(d.rstrip(os.sep) + os.sep)]
    if not under:
        return None, absolute
    directory, fd = max(under, key=lambda held: len(held[0]))
    return fd, os.path.relpath(absolute, directory)


def _hold(path: Path, fd: int) -> None:
    key = os.path.abspath(path)
    with _held_lock:
        old = _held.pop(key, None)
        _held[key] = (fd, os.path.realpath(path))
        while len(_held) > MAX_HELD:
            os.close(_held.pop(next(iter(_held)))[0])
    if old is not None:
        os.close(old[0])


def release_dir(path: Path | str) -> None:
    """Let go of a run directory's descriptor (its run has written its last file); files named in it
    are opened by name again after this."""
    with _held_lock:
        held = _held.pop(os.path.abspath(path), None)
    if held is not None:
        os.close(held[0])


def open_at(path: Path | str, flags: int, mode: int = FILE_MODE) -> int:
    """``os.open`` of ``path``, relative to the held run directory it lies in (``prepare_private_dir``)."""
    fd, rel = _locate(path)
    return os.open(rel, flags | os.O_CLOEXEC, mode, dir_fd=fd)


def touch(path: Path | str) -> None:
    """Set ``path``'s times to now (a lease), never through a link, relative to its held run directory."""
    fd, rel = _locate(path)
    os.utime(rel, dir_fd=fd, follow_symlinks=False)


# -- the directory --------------------------------------------------------------------------------


def _refuse_stat(st: os.stat_result, path: Path, what: str) -> None:
    """The reasons ``check_private_dir`` refuses a directory, from its (l)stat."""
    if stat.S_ISLNK(st.st_mode):
        raise UsageError(f"{what} {path}: is a symbolic link; give a directory of your own")
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{what} {path}: exists and is not a directory")
    if st.st_uid != os.geteuid():
        raise UsageError(f"{what} {path}: owned by uid {st.st_uid}, not by this user (uid {os.geteuid()});"
                         " give a new directory or one of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UsageError(f"{what} {path}: writable by group or others (mode {stat.S_IMODE(st.st_mode):04o});"
                         " give a new directory or chmod 700 it")


def check_private_dir(path: Path, what: str = "--out") -> None:
    """Refuse a directory (``UsageError``, exit 2) that is a link, not ours, or writable by group or others."""
    fd, rel = _locate(path)
    try:
        st = os.stat(rel, dir_fd=fd, follow_symlinks=False)
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot use it ({exc.strerror})") from None
    _refuse_stat(st, path, what)


def make_private_dir(path: Path, *, exist_ok: bool = False) -> None:
    """``mkdir`` 0700 relative to the held run directory ``path`` lies in (a hop's work directory)."""
    fd, rel = _locate(path)
    try:
        os.mkdir(rel, DIR_MODE, dir_fd=fd)
    except FileExistsError:
        if not exist_ok:
            raise


def _mkdirs(path: Path, what: str) -> None:
    """``path`` and its missing parents, 0700; those inside a held run directory relative to it."""
    fd, rel = _locate(path)
    if fd is None:
        try:
            path.mkdir(parents=True, mode=DIR_MODE)
        except FileExistsError:
            pass  # created meanwhile by someone: checked like any existing directory
        except OSError as exc:
            raise UsageError(f"{what} {path}: cannot create it ({exc.strerror})") from None
        return
    parts = Path(rel).parts
    for i in range(1, len(parts) + 1):
        with contextlib.suppress(FileExistsError):
            os.mkdir(os.path.join(*parts[:i]), DIR_MODE, dir_fd=fd)


def prepare_private_dir(path: Path, what: str = "--out") -> None:
    """Create ``path`` 0700, or take an existing empty one that passes ``check_private_dir`` (made 0700),
    and hold a descriptor of it: every run file is then created relative to the directory taken here.

    Refused first (``UsageError``, exit 2): a ``path`` another user could swap for a link, because a
    directory on the way to it is theirs or writable by them (``unsafe_parent``). Parents that do not
    exist are created too (0700); the directory is checked and tightened through the descriptor,
    opened without following a link.
    """
    why = unsafe_parent(path)
    if why is not None:
        raise UsageError(f"{what} {path}: {why}; another user could swap the run directory for a link. "
                         f"{_what_would_do(what, why)}")
    parent_fd, rel = _locate(path)
    try:
        before = os.stat(rel, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        _mkdirs(path, what)
        before = None
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot use it ({exc.strerror})") from None
    if before is not None:
        _refuse_stat(before, path, what)  # a link or another's directory: named as such, before any open
    try:
        fd = os.open(rel, _DIR, dir_fd=parent_fd)
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot use it ({exc.strerror})") from None
    try:
        _take(fd, path, what)
    except BaseException:
        os.close(fd)
        raise
    _hold(path, fd)


def _what_would_do(what: str, why: str) -> str:
    """How to go on when ``unsafe_parent`` refuses: where a run directory would be safe. Root running on a
    checkout another uid owns (a CI workspace bind-mounted into a container) is refused rightly, that
    uid could redirect root's writes, and is told its two ways out."""
    where = (f"Give {what} below directories only you (uid {os.geteuid()}) or root can write, e.g. a new "
             "directory in your home or in /tmp")
    if os.geteuid() == 0 and "belongs to uid" in why:
        where += (f"; as root on a checkout another uid owns (a CI workspace mounted into a container), give {what} "
                  "outside it (e.g. /tmp/runs/NAME, and copy the results out) or chown the checkout to root first")
    return where


def _take(fd: int, path: Path, what: str) -> None:
    """Check the directory open on ``fd`` is ours, private and empty, and make it 0700."""
    _refuse_stat(os.fstat(fd), path, what)
    if os.listdir(fd):
        raise UsageError(f"{what} {path}: the directory is not empty (a previous run?); give a new or empty directory")
    os.fchmod(fd, DIR_MODE)


# -- who could swap it ----------------------------------------------------------------------------


def _lookups(path: Path) -> list[tuple[str, str]]:
    """Each (directory, entry) a lookup of ``path`` goes through: along the path as named and along
    its resolved form (a link on the way is looked up in its own directory, its target in another)."""
    seen: dict[tuple[str, str], None] = {}
    for full in (os.path.abspath(path), os.path.realpath(path)):
        parts = Path(full).parts
        for i in range(1, len(parts)):
            seen[(os.path.join(*parts[:i]), parts[i])] = None
    return list(seen)


def _private_group(gid: int) -> bool:
    """Whether group ``gid`` is this user's alone (a user-private group: ``umask 002`` setups)."""
    try:
        me = pwd.getpwuid(os.geteuid()).pw_name
        members = set(grp.getgrgid(gid).gr_mem) - {me}
        others = [p for p in pwd.getpwall() if p.pw_gid == gid and p.pw_uid != os.geteuid()]
    except KeyError:
        return False
    return gid == os.getegid() and not members and not others


def _swappable(directory: str, entry: str) -> str | None:
    """Why another user could rename ``entry`` in ``directory`` (or make ``directory`` let them), or None."""
    try:
        st = os.stat(directory)
    except OSError:
        return None  # not there yet: created by us below a directory already checked
    if st.st_uid not in (0, os.geteuid()):
        return f"{directory} belongs to uid {st.st_uid}"
    writable = st.st_mode & (stat.S_IWOTH | (0 if _private_group(st.st_gid) else stat.S_IWGRP))
    if not writable:
        return None
    if st.st_mode & stat.S_ISVTX:  # sticky (/tmp): only the entry's owner may rename it
        try:
            owner = os.stat(os.path.join(directory, entry), follow_symlinks=False).st_uid
        except OSError:
            return None  # not there yet: it will be ours
        return None if owner in (0, os.geteuid()) else f"{os.path.join(directory, entry)} belongs to uid {owner}"
    return f"{directory} is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} " \
           f"(mode {stat.S_IMODE(st.st_mode):04o}, no sticky bit)"


def unsafe_parent(path: Path) -> str | None:
    """Why another user could replace ``path`` (or a directory on the way to it) with a link, or None:
    a directory on the way that belongs to another user, or that others (or a shared group) may write
    without the sticky bit, or an entry of a sticky directory that another user owns."""
    for directory, entry in _lookups(path):
        why = _swappable(directory, entry)
        if why is not None:
            return why
    return None


# -- the files ------------------------------------------------------------------------------------


def _fdopen(fd: int, binary: bool, append: bool) -> IO[Any]:
    mode = ("a" if append else "w") + ("b" if binary else "")
    return os.fdopen(fd, mode) if binary else os.fdopen(fd, mode, encoding="utf-8")


def open_new(path: Path, *, binary: bool = False) -> IO[Any]:
    """A new file at ``path``, 0600; ``FileExistsError`` when anything (a link too) is there already."""
    return _fdopen(open_at(path, _NEW), binary, append=False)


def write_new(path: Path, data: str | bytes) -> None:
    """Write a new file (``open_new``) holding ``data``."""
    with open_new(path, binary=isinstance(data, bytes)) as f:
        f.write(data)


def open_append(path: Path, *, binary: bool = True) -> IO[Any]:
    """``path`` for appending: created as ``open_new`` does, or, when it exists, only a regular file
    of ours with one link (never through a symlink: ``O_NOFOLLOW``); ``OSError`` otherwise."""
    try:
        return _fdopen(open_at(path, _NEW | os.O_APPEND), binary, append=True)
    except FileExistsError:
        pass
    fd = open_at(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
        os.close(fd)
        raise PermissionError(f"{path}: not a private regular file of this user; not appending to it")
    return _fdopen(fd, binary, append=True)


def replace_file(path: Path, data: str | bytes) -> None:
    """Write ``data`` to a new 0600 file beside ``path`` and rename it over ``path`` (a link there is
    replaced, not followed; a reader never sees half a file), within the held run directory."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd, rel = _locate(path)
    rel_tmp = os.path.join(os.path.dirname(rel), tmp.name)
    try:
        write_new(tmp, data)
        os.replace(rel_tmp, rel, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(rel_tmp, dir_fd=fd)
        raise
