"""Run directories and the files in them: private to the runner, never through a planted link.

A runner may run as root on a shared host. A run directory another local user created, or can
write to, would let that user plant a symlink (``report.html -> /etc/cron.d/x``) and have the
runner overwrite any file with report content. So a run directory is the runner's own and
0700 (``prepare_private_dir``), and every run file is created with
``O_CREAT | O_EXCL | O_NOFOLLOW`` at 0600 (``open_new``, ``write_new``), appended to only when it is
a regular file of ours with one link (``open_append``), or replaced by a rename that replaces a
link rather than follows it (``replace_file``: a page written again, such as ``verify.json``).
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import IO, Any

from chaos.model.errors import UsageError

__all__ = ["check_private_dir", "open_append", "open_new", "prepare_private_dir", "replace_file", "write_new"]

FILE_MODE = 0o600
DIR_MODE = 0o700
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def check_private_dir(path: Path, what: str = "--out") -> None:
    """Refuse a directory (``UsageError``, exit 2) that is a link, not ours, or writable by group or others."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot use it ({exc.strerror})") from None
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


def prepare_private_dir(path: Path, what: str = "--out") -> None:
    """Create ``path`` 0700, or take an existing empty one that passes ``check_private_dir`` (made 0700).

    Parents that do not exist are created too (0700); the directory itself is then checked and
    tightened through a descriptor opened without following a link.
    """
    if not os.path.lexists(path):
        try:
            path.mkdir(parents=True, mode=DIR_MODE)
        except FileExistsError:
            pass  # created meanwhile by someone: checked below like any existing directory
        except OSError as exc:
            raise UsageError(f"{what} {path}: cannot create it ({exc.strerror})") from None
    check_private_dir(path, what)
    if any(path.iterdir()):
        raise UsageError(f"{what} {path}: the directory is not empty (a previous run?); give a new or empty directory")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, DIR_MODE)
    finally:
        os.close(fd)


def _fdopen(fd: int, binary: bool, append: bool) -> IO[Any]:
    mode = ("a" if append else "w") + ("b" if binary else "")
    return os.fdopen(fd, mode) if binary else os.fdopen(fd, mode, encoding="utf-8")


def open_new(path: Path, *, binary: bool = False) -> IO[Any]:
    """A new file at ``path``, 0600; ``FileExistsError`` when anything (a link too) is there already."""
    return _fdopen(os.open(path, _NEW, FILE_MODE), binary, append=False)


def write_new(path: Path, data: str | bytes) -> None:
    """Write a new file (``open_new``) holding ``data``."""
    with open_new(path, binary=isinstance(data, bytes)) as f:
        f.write(data)


def open_append(path: Path, *, binary: bool = True) -> IO[Any]:
    """``path`` for appending: created as ``open_new`` does, or, when it exists, only a regular file
    of ours with one link (never through a symlink: ``O_NOFOLLOW``); ``OSError`` otherwise."""
    try:
        return _fdopen(os.open(path, _NEW | os.O_APPEND, FILE_MODE), binary, append=True)
    except FileExistsError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
        os.close(fd)
        raise PermissionError(f"{path}: not a private regular file of this user; not appending to it")
    return _fdopen(fd, binary, append=True)


def replace_file(path: Path, data: str | bytes) -> None:
    """Write ``data`` to a new 0600 file beside ``path`` and rename it over ``path`` (a link there is
    replaced, not followed; a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        write_new(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
