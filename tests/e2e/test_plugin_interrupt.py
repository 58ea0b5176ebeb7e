"""Ctrl-C during a `chaos_run` inside pytest still reverts the run's faults."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from chaos.toxiproxy.server import ToxiproxyThread

INNER = textwrap.dedent('''
    import os

    def test_long_run(chaos_run):
        chaos_run({
            "name": "interrupted",
            "target": {"kind": "builtin", "model": "tiny"},
            "proxy": {"server": "external", "url": os.environ["TPX_URL"]},
            "load": {"concurrency": 2, "max_tokens": 16},
            "phases": [{"name": "slow", "duration": "60s", "faults": [{"kind": "network.latency", "latency": "20ms"}]}],
            "sla": [{"kind": "errors", "budget": "100%"}],
            "safety": {"max_duration": "2m"},
        })
''')


@pytest.mark.timeout(120)
def test_ctrl_c_in_pytest_reverts_the_faults(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER, encoding="utf-8")
    with ToxiproxyThread() as tpx:
        toxics = f"{tpx.url}/proxies/streamchaos/toxics"
        inner = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "faulthandler_timeout=50",
             str(tmp_path / "test_inner.py")],  # a hang prints every thread's stack (in the failure below)
            cwd=tmp_path, env={**os.environ, "TPX_URL": tpx.url}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=_ctrl_c_as_in_a_terminal,
        )
        try:
            deadline = time.monotonic() + 60
            while True:  # wait until the fault is really in force
                response = httpx.get(toxics, timeout=5)
                if response.status_code == 200 and response.json():
                    break
                assert time.monotonic() < deadline and inner.poll() is None, "the fault never took effect"
                time.sleep(0.1)
            inner.send_signal(signal.SIGINT)
            try:
                output, _ = inner.communicate(timeout=60)
            except subprocess.TimeoutExpired as hung:
                said = hung.output.decode(errors="replace") if isinstance(hung.output, bytes) else hung.output or ""
                raise AssertionError(f"Ctrl-C did not end the inner run within 60s:\n{_signal_state(inner.pid)}\n"
                                     f"{said}") from None
        finally:
            if inner.poll() is None:
                inner.kill()
        assert "KeyboardInterrupt" in output or "Interrupted" in output, output[-2000:]
        response = httpx.get(toxics, timeout=5)
        assert response.status_code == 404 or response.json() == [], response.text


def _ctrl_c_as_in_a_terminal() -> None:
    """SIGINT back to its default in the inner pytest, as a terminal gives it.

    A suite started in the background by a shell without job control (``cmd &`` in a script,
    ``nohup``) inherits SIGINT *ignored*, and Python then never turns SIGINT into
    KeyboardInterrupt: the inner run would ignore the Ctrl-C this test sends and run out its phase.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signal_state(pid: int) -> str:
    """Each thread's blocked, pending and caught signal masks, for a hang's failure message."""
    lines = []
    for status in sorted(Path(f"/proc/{pid}/task").glob("*/status")):
        with contextlib.suppress(OSError):
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            lines.append(" ".join(f"{k}={fields.get(k, '?').strip()}"
                                  for k in ("Name", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")))
    return "\n".join(lines)
