"""`target.network: host` against the real daemon: another process on the container's port is refused
before the container starts, and one that binds it before the container's server gets no request and
no API key (issue 41: the squatter used to receive both, and the run exited 0)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dockerd import free_port

import chaos.targets.docker as docker_target
from chaos.experiment import experiment_from_dict
from chaos.model.errors import SetupFailed
from chaos.targets.host_image import host_image
from chaos.targets.registry import running_target

pytestmark = pytest.mark.timeout(60)
KEY = "sk-squatted-41"

# Answers every GET as an OpenAI server would, and writes each request's Authorization header down.
SQUATTER = """
import http.server, sys
port, log = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(log, "a") as f:
            f.write(f"{self.path} {self.headers.get('Authorization')}\\n")
        body = b'{"data": [{"id": "tiny"}]}'
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
server = http.server.HTTPServer(("127.0.0.1", port), H)
print("listening", flush=True)
server.serve_forever()
"""


class Squatters:
    """Processes of another program answering 127.0.0.1:PORT, each request's Authorization header in ``log``."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.started: list[subprocess.Popen[str]] = []

    def __call__(self, port: int) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-c", SQUATTER, str(port), str(self.log)], stdout=subprocess.PIPE,
                                text=True)
        self.started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
        return proc


@pytest.fixture
def squatter(tmp_path: Path) -> Iterator[Squatters]:
    squatters = Squatters(tmp_path / "squatter.log")
    yield squatters
    for proc in squatters.started:
        proc.kill()
        proc.wait(timeout=10)


def sleeper(docker_client: Any, port: int) -> Any:
    """A container on the host's network whose 'server' never listens (a slow vLLM still loading)."""
    return experiment_from_dict({"name": "t", "phases": [{"name": "p", "duration": "1s"}], "target": {
        "kind": "docker", "image": host_image(docker_client), "network": "host", "port": port, "api_key": KEY,
        "volumes": ["/usr:/usr:ro"], "command": ["/usr/bin/sleep", "60"], "startup_timeout": "20s"}}).target


async def test_a_port_taken_before_the_start_is_refused_before_anything_is_created(
        tmp_path: Path, docker_client: Any, leftovers: list[str], squatter: Squatters) -> None:
    leftovers.append(str(tmp_path))
    port = free_port()
    holder = squatter(port)
    records: list[dict[str, Any]] = []
    with pytest.raises(SetupFailed) as caught:
        async with running_target(sleeper(docker_client, port), target_url=None, run_dir=tmp_path, seed=1,
                                  run_id="5qua7", record=records.append):
            pass
    message = str(caught.value)
    assert f"port {port} (target.port) is already in use on this host: pid {holder.pid} (python" in message
    assert records == [] and not squatter.log.exists()  # nothing created, nothing sent


async def test_a_squatter_that_binds_before_the_containers_server_gets_no_request(
        tmp_path: Path, docker_client: Any, leftovers: list[str], squatter: Squatters, monkeypatch: Any) -> None:
    leftovers.append(str(tmp_path))
    port = free_port()
    holders: list[subprocess.Popen[str]] = []
    real = docker_target.DockerTarget._create_and_start

    def then_squat(self: Any, client: Any, config: dict[str, Any], image: str) -> Any:
        container = real(self, client, config, image)
        holders.append(squatter(port))  # after the free-port check, while the container's server is not up
        return container

    monkeypatch.setattr(docker_target.DockerTarget, "_create_and_start", then_squat)
    with pytest.raises(SetupFailed) as caught:
        async with running_target(sleeper(docker_client, port), target_url=None, run_dir=tmp_path, seed=1,
                                  run_id="5qua8"):
            pass
    message = str(caught.value)
    assert f"answered by pid {holders[0].pid} (python" in message and "not by the target container" in message
    assert not squatter.log.exists()  # no readiness request, so no API key, ever reached it
