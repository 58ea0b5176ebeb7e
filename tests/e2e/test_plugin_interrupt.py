"""Ctrl-C during a `chaos_run` inside pytest still reverts the run's faults."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from faults.toxiproxy_server import ToxiproxyThread

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
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_inner.py")],
            cwd=tmp_path, env={**os.environ, "TPX_URL": tpx.url}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
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
            output, _ = inner.communicate(timeout=60)
        finally:
            if inner.poll() is None:
                inner.kill()
        assert "KeyboardInterrupt" in output or "Interrupted" in output, output[-2000:]
        response = httpx.get(toxics, timeout=5)
        assert response.status_code == 404 or response.json() == [], response.text
