"""The open-file limit a run needs, raised before anything starts, or one clear error when the hard
limit forbids it (a host's common soft limit of 1,024 otherwise caps a run near 1,000 streams)."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.host.fd_limit import RESERVE_FDS, open_files_needed
from chaos.load.workload import streams_at_most
from chaos.model.experiment import LoadSpec

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]


def _under_limits(soft: int, hard: int, code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter whose RLIMIT_NOFILE is (soft, hard) from the start."""
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30,
                          preexec_fn=lower, check=False)


def test_the_need_counts_a_proxys_two_sockets_per_stream_and_a_reserve() -> None:
    assert open_files_needed(1000) == 2000 + RESERVE_FDS
    assert open_files_needed(0) == RESERVE_FDS


def test_the_streams_a_load_holds_open_closed_and_open_loop() -> None:
    assert streams_at_most(LoadSpec(concurrency=2048), 1024) == 2048
    assert streams_at_most(LoadSpec(rate=10.0, request_timeout=30.0), 1024) == 301  # arrivals x timeout
    assert streams_at_most(LoadSpec(rate=500.0, request_timeout=30.0), 1024) == 1024  # the in-flight cap
    assert streams_at_most(LoadSpec(rate=500.0, request_timeout=30.0, workers=4), 1024) == 4096  # a cap per worker


def test_a_low_soft_limit_is_raised_and_processes_started_after_inherit_it() -> None:
    code = ("import resource, subprocess, sys\n"
            "from chaos.host.fd_limit import ensure_open_files\n"
            "limit = ensure_open_files(1200)\n"
            "child = subprocess.run([sys.executable, '-c',"
            " 'import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])'],"
            " capture_output=True, text=True, check=True).stdout.strip()\n"
            "print(limit.soft_before, limit.soft, limit.raised, child)\n")
    done = _under_limits(256, 4096, code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["256", "1200", "True", "1200"]


def test_a_limit_already_high_enough_is_left_as_it_is() -> None:
    done = _under_limits(2048, 4096, "from chaos.host.fd_limit import ensure_open_files\n"
                                     "limit = ensure_open_files(1200); print(limit.soft, limit.raised)\n")
    assert done.stdout.split() == ["2048", "False"], done.stderr


def test_a_hard_limit_below_the_need_is_one_clear_error_naming_what_to_change() -> None:
    code = ("from chaos.host.fd_limit import ensure_open_files\n"
            "from chaos.model.errors import SetupFailed\n"
            "try:\n    ensure_open_files(1200)\n"
            "except SetupFailed as exc:\n    print(exc.exit_code, exc)\n")
    done = _under_limits(300, 300, code)
    assert done.returncode == 0, done.stderr
    exit_code, message = done.stdout.strip().split(" ", 1)
    assert exit_code == "4" and "\n" not in message
    assert "needs about 1200 open files" in message and "hard limit is 300" in message
    assert "ulimit -Hn 1200" in message and "LimitNOFILE=1200" in message and "load.concurrency" in message
