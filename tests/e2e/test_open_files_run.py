"""A real run that needs more sockets than the common soft limit of 1,024 allows: 1,100 streams held
open through the embedded Toxiproxy (two sockets each there), started under a soft limit of 1,024.
The runner raises the limit before the proxy and the load start, so every stream gets its content;
before it did, connects failed with EMFILE past the first thousand or so."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).parent / "held_streams_server.py"
STREAMS = 1100


def test_a_run_of_1100_streams_under_a_soft_limit_of_1024_raises_it_and_every_stream_gets_content(
        tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2 * STREAMS + 512:
        pytest.skip(f"the hard open-file limit here ({hard}) is below what this test needs")
    server = subprocess.Popen([sys.executable, str(SERVER), "6", "0.5"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        experiment = tmp_path / "many.yaml"
        experiment.write_text(
            "name: many-open-streams\nseed: 3\n"
            f"target: {{kind: openai, url: 'http://127.0.0.1:{port}'}}\n"
            "proxy: {server: embedded}\n"
            f"load: {{concurrency: {STREAMS}, max_tokens: 6, request_timeout: 30s}}\n"
            "phases: [{name: held, duration: 8s}]\n"
            "sla: [{kind: errors, budget: 0}]\n"
            "safety: {max_duration: 150s, cleanup_window: 1s}\n", encoding="utf-8")

        def soft_1024() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))

        out = tmp_path / "run"
        done = subprocess.run([sys.executable, "-m", "chaos", "run", str(experiment), "--out", str(out), "--quiet"],
                              cwd=ROOT, capture_output=True, text=True, timeout=200, preexec_fn=soft_1024, check=False)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        journal = [json.loads(line) for line in (out / "journal.jsonl").read_text(encoding="utf-8").splitlines()]
        raised = [r["data"] for r in journal if r.get("type") == "note" and r.get("topic") == "open_files"]
        assert raised and raised[0]["soft_before"] == 1024 and raised[0]["soft"] == 2 * STREAMS + 256, raised
        records = [r for r in journal if r.get("type") == "stream"]
        with_content = {r["id"] for r in records if r.get("t_first_content") is not None}
        assert len(with_content) >= STREAMS  # every slot's first request at least
        assert not [r for r in records if r.get("error")], "no stream failed to connect"
    finally:
        server.kill()
        server.wait(10)
