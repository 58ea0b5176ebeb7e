"""`target.network: host` without a Docker daemon: the readiness probe sends nothing (no API key) to a
port another process answers (issue 41, point 5).

The daemon's one answer the probe reads, the container's state with its init pid (``State.Pid``), is
stood in for by a tiny object; everything else is real: the container is a real child process, the
squatter a real HTTP server in another process that bound the port first and writes down each
request's Authorization header. ``tests/containers/test_docker_host_port.py`` is the same against a
real daemon (skipped where none runs).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.experiment import experiment_from_dict
from chaos.model.errors import SetupFailed
from chaos.targets.docker import DockerTarget

pytestmark = pytest.mark.timeout(30)
KEY = "sk-squatted-41-probe"

# An OpenAI-shaped HTTP server on 127.0.0.1:0 that logs each request's Authorization header to argv[1]
# (when given) and prints its port; ``sleep`` prints nothing and only waits (a server still loading).
CHILD = """
import http.server, sys
if sys.argv[1] == "sleep":
    sys.stdin.read(); sys.exit(0)
log = sys.argv[2] if len(sys.argv) > 2 else None
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if log:
            with open(log, "a") as f:
                f.write(f"{self.path} {self.headers.get('Authorization')}\\n")
        body = b'{"data": [{"id": "tiny"}]}'
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
server = http.server.HTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


class Container:
    """What ``docker inspect`` would say of a running container whose init is ``pid`` (all the probe reads)."""

    def __init__(self, pid: int) -> None:
        self.attrs: dict[str, Any] = {"Id": "c0ffee" * 8, "State": {"Status": "running", "Pid": pid}}

    def reload(self) -> None:
        pass

    def logs(self, tail: int) -> bytes:
        return b""


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)


def _start(started: list[subprocess.Popen[str]], *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    started.append(proc)
    return proc


def _target(tmp_path: Path, port: int, container_pid: int) -> DockerTarget:
    spec = experiment_from_dict({"name": "t", "phases": [{"name": "p", "duration": "1s"}], "target": {
        "kind": "docker", "image": "example/never-pulled", "network": "host", "port": port, "api_key": KEY,
        "startup_timeout": "3s"}}).target
    target = DockerTarget(spec, run_dir=tmp_path, seed=1, run_id="5qua9", record=None)
    target.port, target.container_id = port, "c0ffee" * 8
    container = Container(container_pid)
    target._container = lambda: container  # type: ignore[method-assign]  # the daemon's inspect answer only
    return target


async def test_a_squatter_that_bound_the_port_first_gets_no_request_and_no_key(
        tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    log = tmp_path / "squatter.log"
    squatter = _start(processes, "serve", str(log))
    assert squatter.stdout is not None
    port = int(squatter.stdout.readline())
    container = _start(processes, "sleep")  # the container: up, its server not listening yet
    target = _target(tmp_path, port, container.pid)
    with pytest.raises(SetupFailed) as caught:
        await target._wait_ready()
    message = str(caught.value)
    assert f"answered by pid {squatter.pid} (python" in message and "not by the target container" in message
    assert not log.exists()  # before: GET /v1/models with `Authorization: Bearer sk-...` landed here, and was used


async def test_the_containers_own_server_is_probed_and_answers(
        tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    server = _start(processes, "serve")  # the container's init is its server
    assert server.stdout is not None
    port = int(server.stdout.readline())
    info = await _target(tmp_path, port, server.pid)._wait_ready()
    assert info.base_url == f"http://127.0.0.1:{port}/v1" and info.model == "tiny"
