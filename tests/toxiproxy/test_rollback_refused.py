"""``streamchaos rollback`` of network faults on a run's embedded Toxiproxy, which answers only that
run's token (issue 41 point 1): the token is never journaled, so an offline rollback is refused while
the server still runs. It must say so, name the server's pid from the journal and how to stop it, and
leave the faults outstanding, not report them rolled back; once the server is gone, a rollback says
``gone``. Before, it printed ``rolled back f0 (network.latency): {"...": "HTTP 401"}``, exit 0, and
journaled the toxic as undone while it was still in force."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from chaos.execution.journal import Journal
from chaos.execution.proxy import resolve_server
from chaos.host.runfiles import prepare_private_dir, release_dir
from chaos.model.observations import FaultEvent, Note
from chaos.toxiproxy.client import ToxiproxyAPI

ROOT = Path(__file__).resolve().parents[2]
PROXY = "streamchaos"


def _killed_runs_journal(run_dir: Path, api_url: str, pid: int) -> None:
    """The journal of a run killed mid-phase, as the runner writes it: the path note naming its
    Toxiproxy (the journal adds the ``server`` record), a latency and a link-down fault planned, no end."""
    prepare_private_dir(run_dir)
    journal = Journal(run_dir / "journal.jsonl", "killed", 0, 0.0)
    hop = {"name": "toxiproxy", "kind": "toxiproxy", "listen": "127.0.0.1:3", "base_url": "http://127.0.0.1:3/v1",
           "pid": pid, "config": json.dumps({"api_url": api_url, "server": "embedded"})}
    journal.on_event(Note(topic="path", t=1, data={"hops": [hop]}))
    journal.append(FaultEvent(fault="lag", kind="network.latency", action="plan", t=2, phase="p",
                              undo={"api_url": api_url, "proxy": PROXY, "toxics": ["lag-downstream"]}))
    journal.append(FaultEvent(fault="cut", kind="network.down", action="plan", t=3, phase="p",
                              undo={"api_url": api_url, "proxy": PROXY}))
    journal._file.close()  # killed: no end record
    release_dir(run_dir)


def _rollback(run_dir: Path, api_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("TOXIPROXY_URL", None)
    return subprocess.run([sys.executable, "-m", "chaos", "rollback", str(run_dir), "--toxiproxy-url", api_url],
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(90)
def test_a_rollback_refused_by_the_runs_toxiproxy_says_why_and_how_to_stop_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    server = resolve_server("embedded", None, 7, tmp_path / "toxiproxy.log")
    try:
        assert server.process is not None and server.token
        api = ToxiproxyAPI(server.url, server.token)
        api.create_proxy_sync(PROXY, "127.0.0.1:9", "127.0.0.1:0")
        asyncio.run(api.add_toxic(PROXY, name="lag-downstream", type="latency", stream="downstream", toxicity=1.0,
                                  attributes={"latency": 100}))
        run_dir = tmp_path / "run"
        _killed_runs_journal(run_dir, server.url, server.process.pid)
        refused = _rollback(run_dir, server.url)
        out = refused.stdout
        assert refused.returncode == 4 and "Traceback" not in refused.stderr, out + refused.stderr
        for fault, call in (("lag (network.latency)", f"DELETE /proxies/{PROXY}/toxics/lag-downstream"),
                            ("cut (network.down)", f"POST /proxies/{PROXY}")):
            line = next(line for line in out.splitlines() if line.startswith(f"FAILED {fault}:"))
            assert f"refused {call}: HTTP 401" in line and "never journaled" in line, line
            assert f"pid {server.process.pid}" in line and f"`kill {server.process.pid}`" in line, line
        assert "rolled back" not in out, out
        listed = httpx.get(f"{server.url}/proxies/{PROXY}", headers={"Authorization": f"Bearer {server.token}"},
                           timeout=5).json()
        assert [t["name"] for t in listed["toxics"]] == ["lag-downstream"]  # refused, and said so: nothing removed
    finally:
        server.stop()
    gone = _rollback(run_dir, server.url)  # still outstanding; its server has ended: gone with it
    assert gone.returncode == 0 and gone.stdout.count("gone ") == 2, gone.stdout + gone.stderr
    assert f"(pid {server.process.pid}) exited" in gone.stdout, gone.stdout
