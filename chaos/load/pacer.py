"""Waking at a scheduled instant to the tens of microseconds, where ``asyncio.sleep`` wakes to the millisecond.

An open loop sends each request at its scheduled time; how late it really goes is its send-time error.
Every epoll-based event loop waits in whole milliseconds (uvloop's libuv timers are milliseconds;
asyncio's selector rounds its timeout up to one), so ``asyncio.sleep`` alone left a trace replay at 500
requests/s with requests up to 1.2 ms early and about 1 ms late (benchmarks/bench_trace_replay.py).
On Linux a timerfd armed for the absolute instant on ``CLOCK_MONOTONIC`` (the clock of
``time.monotonic_ns``) becomes readable then, and the loop wakes on it like on any socket: one
``timerfd_settime`` a wait, no spinning, no CPU between sends. Elsewhere (no timerfd, a libc that will
not load) it falls back to ``asyncio.sleep``, and says so in ``precise``.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import time
from collections.abc import Callable

__all__ = ["Pacer"]

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1
_NS = 1_000_000_000


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _load_libc() -> ctypes.CDLL | None:
    # the C library the interpreter already links (dlopen(NULL)): ``ctypes.util.find_library`` would run
    # ``ldconfig -p`` in a subprocess, 6.5 ms inside the load's running event loop at each open loop's start
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timerfd_create.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.timerfd_settime.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                                         ctypes.POINTER(_Itimerspec))
        return libc
    except (OSError, AttributeError, TypeError):  # not Linux, or no libc to load
        return None


_LIBC = _load_libc()


class Pacer:
    """``await pacer.until(t_ns)``: return at ``t_ns`` (``time.monotonic_ns``), or at once when it has passed.
    One per event loop user; ``close()`` releases the timerfd."""

    def __init__(self) -> None:
        self._fd = -1
        self._libc = _LIBC
        if self._libc is not None:
            fd = self._libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            self._fd = fd if fd >= 0 else -1
        # the reader stays registered from the first wait to close(): two epoll_ctl calls a wait fewer
        self._loop: asyncio.AbstractEventLoop | None = None
        self._woken: asyncio.Future[None] | None = None
        self._on_time: Callable[[], None] | None = None

    @property
    def precise(self) -> bool:
        """Whether waits end on a timerfd (to the tens of µs) rather than ``asyncio.sleep`` (to the ms)."""
        return self._fd >= 0

    async def until(self, t_ns: int, on_time: Callable[[], None] | None = None) -> None:
        """``on_time``: called at ``t_ns`` from the timer's wake-up itself, before this coroutine resumes (a
        loop iteration later, after whatever other callbacks were ready): what must happen at the instant
        (an open loop's write) happens there. Its exception is raised here."""
        if t_ns <= time.monotonic_ns():
            if on_time is not None:
                on_time()
            return
        if self._fd < 0 or self._libc is None or not self._arm(t_ns):
            await asyncio.sleep((t_ns - time.monotonic_ns()) / _NS)
            if on_time is not None:
                on_time()
            return
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None:
                self._loop.remove_reader(self._fd)
            loop.add_reader(self._fd, self._readable)
            self._loop = loop
        self._woken = loop.create_future()
        self._on_time = on_time
        try:
            await self._woken
        finally:
            self._woken = None
            self._on_time = None

    def _readable(self) -> None:
        try:
            os.read(self._fd, 8)  # the expiry count: read, or the fd stays readable
        except BlockingIOError:
            return  # a stale wake-up: the timer was re-armed after it fired
        woken, on_time = self._woken, self._on_time
        if woken is None or woken.done():
            return
        self._on_time = None
        if on_time is not None:
            try:
                on_time()
            except Exception as exc:  # noqa: BLE001 - handed to the waiting coroutine, never lost in the loop
                woken.set_exception(exc)
                return
        woken.set_result(None)

    def _arm(self, t_ns: int) -> bool:
        assert self._libc is not None
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(t_ns // _NS, t_ns % _NS))
        return int(self._libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None)) == 0

    def close(self) -> None:
        if self._fd >= 0:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._fd)
            self._loop = None
            os.close(self._fd)
            self._fd = -1
