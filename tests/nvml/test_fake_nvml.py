"""The fake NVML library itself: return codes per the header, the two-call protocol, file-backed state.

Each test loads its own *copy* of the library by path (a new inode is a new object for glibc), so
its init count and in-memory state are fresh and nothing leaks into pynvml's process-wide handle.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fakenvml import fake_env, read_state

pytestmark = pytest.mark.timeout(30)

SUCCESS, UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED, NO_PERMISSION = 0, 1, 2, 3, 4
INSUFFICIENT_SIZE, GPU_IS_LOST = 7, 15


@pytest.fixture
def lib(fake_nvml_lib: Path, tmp_path: Path) -> ctypes.CDLL:
    copy = tmp_path / "copy" / "libnvidia-ml.so.1"
    copy.parent.mkdir()
    shutil.copy(fake_nvml_lib, copy)
    return ctypes.CDLL(str(copy))


def handle(lib: ctypes.CDLL, index: int = 0) -> ctypes.c_void_p:
    h = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(h)) == SUCCESS
    return h


def test_calls_before_init_are_uninitialized(lib: ctypes.CDLL, tmp_path: Path) -> None:
    with fake_env(Path("unused"), tmp_path / "state"):
        count = ctypes.c_uint()
        assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == UNINITIALIZED
        assert lib.nvmlShutdown() == UNINITIALIZED
        assert lib.nvmlInitWithFlags(0) == SUCCESS
        assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == SUCCESS and count.value == 1
        assert lib.nvmlShutdown() == SUCCESS
        assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == UNINITIALIZED


def test_bad_pointers_and_handles_are_invalid_argument(lib: ctypes.CDLL, tmp_path: Path) -> None:
    with fake_env(Path("unused"), tmp_path / "state", devices="2"):
        lib.nvmlInitWithFlags(0)
        assert lib.nvmlDeviceGetCount_v2(None) == INVALID_ARGUMENT
        h = ctypes.c_void_p()
        assert lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(2), ctypes.byref(h)) == INVALID_ARGUMENT
        clock = ctypes.c_uint()
        assert lib.nvmlDeviceGetClockInfo(ctypes.c_void_p(12345), 1, ctypes.byref(clock)) == INVALID_ARGUMENT
        assert lib.nvmlDeviceGetClockInfo(handle(lib, 1), 1, None) == INVALID_ARGUMENT
        assert lib.nvmlDeviceGetClockInfo(handle(lib, 1), 1, ctypes.byref(clock)) == SUCCESS and clock.value == 1980


def test_supported_clocks_two_call_protocol(lib: ctypes.CDLL, tmp_path: Path) -> None:
    with fake_env(Path("unused"), tmp_path / "state"):
        lib.nvmlInitWithFlags(0)
        h = handle(lib)
        count = ctypes.c_uint(0)
        assert lib.nvmlDeviceGetSupportedMemoryClocks(h, ctypes.byref(count), None) == INSUFFICIENT_SIZE
        assert count.value == 2
        mems = (ctypes.c_uint * count.value)()
        assert lib.nvmlDeviceGetSupportedMemoryClocks(h, ctypes.byref(count), mems) == SUCCESS
        count = ctypes.c_uint(0)
        assert lib.nvmlDeviceGetSupportedGraphicsClocks(h, mems[0], ctypes.byref(count), None) == INSUFFICIENT_SIZE
        clocks = (ctypes.c_uint * count.value)()
        assert lib.nvmlDeviceGetSupportedGraphicsClocks(h, mems[0], ctypes.byref(count), clocks) == SUCCESS
        assert clocks[0] == 1980 and list(clocks) == sorted(clocks, reverse=True)


def test_setters_change_getters_and_persist_in_the_state_file(lib: ctypes.CDLL, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with fake_env(Path("unused"), state):
        lib.nvmlInitWithFlags(0)
        h = handle(lib)
        assert lib.nvmlDeviceSetGpuLockedClocks(h, 990, 990) == SUCCESS
        clock, reasons = ctypes.c_uint(), ctypes.c_ulonglong()
        lib.nvmlDeviceGetClockInfo(h, 1, ctypes.byref(clock))
        lib.nvmlDeviceGetCurrentClocksEventReasons(h, ctypes.byref(reasons))
        assert clock.value == 990 and reasons.value & 0x2
        assert read_state(state)["dev0.locked_max"] == 990
        # Another process sees the lock (the rollback case) and can reset it.
        probe = (
            f"import ctypes; l = ctypes.CDLL({str(lib._name)!r}); l.nvmlInitWithFlags(0); h = ctypes.c_void_p();"
            "l.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)); c = ctypes.c_uint();"
            "l.nvmlDeviceGetClockInfo(h, 1, ctypes.byref(c)); print(c.value, l.nvmlDeviceResetGpuLockedClocks(h))"
        )
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=20,
                             check=True).stdout
        assert out.split() == ["990", "0"]
        assert read_state(state)["dev0.locked_max"] == 0
        lib.nvmlDeviceGetClockInfo(h, 1, ctypes.byref(clock))
        assert clock.value == 1980


def test_knobs_deny_old_arch_lost_and_power_range(lib: ctypes.CDLL, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with fake_env(Path("unused"), state, deny="1"):
        lib.nvmlInitWithFlags(0)
        assert lib.nvmlDeviceSetGpuLockedClocks(handle(lib), 990, 990) == NO_PERMISSION
    with fake_env(Path("unused"), state, arch="4"):
        assert lib.nvmlDeviceSetGpuLockedClocks(handle(lib), 990, 990) == NOT_SUPPORTED
    with fake_env(Path("unused"), state):
        assert lib.nvmlDeviceSetPowerManagementLimit(handle(lib), 100_000) == INVALID_ARGUMENT
        assert lib.nvmlDeviceSetPowerManagementLimit(handle(lib), 300_000) == SUCCESS
        assert read_state(state)["dev0.power_limit_mw"] == 300_000
        # symbolic limits must not be mixed with numbers
        assert lib.nvmlDeviceSetGpuLockedClocks(handle(lib), 990, 0xFFFFFF02) == INVALID_ARGUMENT
    with fake_env(Path("unused"), state, lost="1"):
        clock = ctypes.c_uint()
        assert lib.nvmlDeviceGetClockInfo(handle(lib), 1, ctypes.byref(clock)) == GPU_IS_LOST
