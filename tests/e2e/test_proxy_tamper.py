"""A whole run halts when its proxy's upstream is changed behind its back (issue 41, point 1).

Another local user reaches an external Toxiproxy (one a run cannot guard with a token) and points
the run's proxy at her relay. Before the watch the run went on, exit 0, its load (and the target's
key) at her relay; now it halts within about a second, its fault reverted, exit 4, the change in
the report's halt section.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from chaos.execution.runner import Runner
from chaos.experiment import experiment_from_dict
from chaos.model.observations import StreamRecord
from chaos.output.report import halt_facts
from chaos.toxiproxy.server import ToxiproxyThread

pytestmark = pytest.mark.timeout(120)


def test_a_run_whose_upstream_is_redirected_halts_and_reverts(tmp_path: Path) -> None:
    relay = socket.create_server(("127.0.0.1", 0))  # hers: accepts, never answers
    relay_at = f"127.0.0.1:{relay.getsockname()[1]}"
    with ToxiproxyThread() as tpx, relay:
        experiment = experiment_from_dict({
            "name": "tamper", "target": {"kind": "builtin"},
            "proxy": {"server": "external", "url": tpx.url},
            "load": {"concurrency": 2, "max_tokens": 8},
            "phases": [{"name": "slow", "duration": "30s", "faults": [{"kind": "network.latency", "latency": "1ms"}]}],
            "safety": {"max_duration": "2m", "cleanup_window": "200ms", "drain_timeout": "500ms"},
        })

        class Redirect:
            """After a few streams, as another user: POST /proxies/streamchaos {"upstream": her relay}."""

            def __init__(self, runner: Runner) -> None:
                self.runner, self.left, self.status = runner, 3, 0

            def on_event(self, event: Any) -> None:
                if isinstance(event, StreamRecord):
                    self.left -= 1
                    if self.left == 0:
                        threading.Thread(target=self.redirect, daemon=True).start()

            def redirect(self) -> None:
                self.status = httpx.post(f"{tpx.url}/proxies/streamchaos", json={"upstream": relay_at},
                                         timeout=5).status_code

        # no report files (their pages take seconds): the report's halt section is the last halt note
        runner = Runner(experiment, out_dir=tmp_path / "run", handle_signals=False)
        redirect = Redirect(runner)
        runner.listeners.append(redirect)
        result = asyncio.run(runner.run())
        toxics = httpx.get(f"{tpx.url}/proxies/streamchaos/toxics", timeout=5)
    assert redirect.status == 200  # the external Toxiproxy took it from anyone
    assert result.status == "halted" and result.exit_code == 4, (result.status, result.error)
    assert "its upstream was changed from " in (result.error or "") and relay_at in (result.error or "")
    assert [e.action for e in result.observations.faults] == ["plan", "inject", "revert"]
    assert toxics.status_code == 404 or toxics.json() == []  # the fault reverted, the proxy deleted
    assert result.ended - result.started < 25  # it did not wait for the 30 s phase
    halt = halt_facts(result.observations)
    assert halt is not None and any(relay_at in c for c in halt["proxy_changes"]), halt
