"""The admin token (issue 11, findings 9 and 11): always required, never on a command line, and sent
only to a stack that has shown it holds it.

Everything runs against real processes on loopback: stacks started as a user would start them, and
for the "foreign server" a small HTTP server that records every request it gets.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from chaos.experiment import TargetSpec
from chaos.host.children import first_line
from chaos.stack.process import StackProcess
from chaos.stack.serve import READY_PREFIX
from chaos.targets.base import BuiltinStack, RemoteTarget

pytestmark = pytest.mark.timeout(120)

TOKEN = "t0ken-" + "x" * 30


def _serve(*args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "chaos.stack", "--port", "0", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "STREAMCHAOS_ADMIN_TOKEN"}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _stop(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=5)
    return proc.returncode, err.decode(errors="replace")


def test_loopback_without_the_token_is_refused(tmp_path: Path) -> None:
    """The peer address is not a credential: a same-host proxy makes every remote client loopback."""
    with StackProcess.start() as stack:
        assert httpx.get(stack.admin_url + "/state", timeout=5).status_code == 403
        forwarded = {"X-Forwarded-For": "127.0.0.1", "X-Real-IP": "127.0.0.1"}
        assert httpx.get(stack.admin_url + "/state", headers=forwarded, timeout=5).status_code == 403
        assert httpx.get(stack.admin_url + "/state", headers=stack.admin_headers, timeout=5).status_code == 200


def test_a_token_on_the_command_line_is_refused() -> None:
    proc = _serve("--admin-token", TOKEN, env=_env())
    try:
        proc.wait(timeout=60)  # a stack that accepted it would serve until stopped
    finally:
        code, err = _stop(proc)
    assert code == 2 and "/proc/PID/cmdline" in err and "STREAMCHAOS_ADMIN_TOKEN" in err, err


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN)
    path.chmod(0o644)
    proc = _serve("--admin-token-file", str(path), env=_env())
    try:
        proc.wait(timeout=60)
    finally:
        code, err = _stop(proc)
    assert code == 2 and "chmod 600" in err, err


def test_a_stack_started_by_hand_writes_its_token_to_a_0600_file() -> None:
    proc = _serve(env=_env())
    try:
        line = first_line(proc, 60)
        assert line.startswith(READY_PREFIX), line
        url = line[len(READY_PREFIX):].split(" ", 1)[0]  # `` ca=PATH`` follows under --tls
        assert proc.stderr is not None
        notice = proc.stderr.readline().decode()
        path = Path(notice.split("admin token written to ", 1)[1].split(" ", 1)[0])
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, oct(path.stat().st_mode)
        token = path.read_text().strip()
        assert token and token not in notice
        assert httpx.get(url + "/admin/state", timeout=5).status_code == 403
        assert httpx.get(url + "/admin/state", headers={"Authorization": f"Bearer {token}"},
                         timeout=5).status_code == 200
    finally:
        code, err = _stop(proc)
    assert code == 0, err
    assert not path.exists(), "the generated token file outlived the stack"


@pytest.mark.parametrize("configured", [None, TOKEN], ids=["generated", "configured"])
def test_the_runner_passes_the_token_by_environment_not_command_line(configured: str | None, tmp_path: Path) -> None:
    stack = BuiltinStack(TargetSpec(admin_token=configured), tmp_path / "stack.log", seed=0)
    info = asyncio.run(stack.start())
    try:
        assert info.pid is not None and info.admin_token
        if configured:
            assert info.admin_token == configured
        cmdline = Path(f"/proc/{info.pid}/cmdline").read_bytes()
        assert info.admin_token.encode() not in cmdline, cmdline
        environ = Path(f"/proc/{info.pid}/environ")
        assert stat.S_IMODE(environ.stat().st_mode) == 0o400  # unlike cmdline, only its owner reads it
        assert f"STREAMCHAOS_ADMIN_TOKEN={info.admin_token}".encode() in environ.read_bytes().split(b"\0")
        assert info.admin_url is not None
        assert httpx.get(info.admin_url + "/state", timeout=5).status_code == 403
        headers = {"Authorization": f"Bearer {info.admin_token}"}
        assert httpx.get(info.admin_url + "/state", headers=headers, timeout=5).status_code == 200
    finally:
        asyncio.run(stack.stop())


def test_each_run_gets_its_own_token(tmp_path: Path) -> None:
    tokens = []
    for i in range(2):
        stack = BuiltinStack(TargetSpec(), tmp_path / f"stack{i}.log", seed=0)
        tokens.append(asyncio.run(stack.start()).admin_token)
        asyncio.run(stack.stop())
    assert tokens[0] and tokens[1] and tokens[0] != tokens[1]


# -- a remote target is sent the token only after it proved it holds it ------------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    """An OpenAI-looking server that is not a streamchaos stack; it records what it is sent."""

    seen: list[dict[str, Any]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.seen.append({"path": self.path, "headers": dict(self.headers)})
        if self.path.startswith("/v1/models"):
            body = json.dumps({"data": [{"id": "m"}]}).encode()
        elif self.path.startswith("/health"):
            body = b'{"status": "ok", "server": "not-streamchaos"}'
        else:
            body = b'{"kv_blocks_total": 1}'  # answers anything, as a careless gateway would
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def foreign() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _Recorder.seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_foreign_server_never_receives_the_token(foreign: tuple[str, list[dict[str, Any]]],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    url, seen = foreign
    monkeypatch.setenv("STREAMCHAOS_ADMIN_TOKEN", TOKEN)
    info = asyncio.run(RemoteTarget(TargetSpec(kind="openai"), url + "/v1").start())
    assert info.admin_url is None and info.admin_token is None and info.kind == "openai"
    assert seen, "the target was not contacted at all"
    assert all(TOKEN not in json.dumps(request["headers"]) for request in seen), seen


def test_a_stack_is_recognised_only_with_its_own_token(tmp_path: Path) -> None:
    with StackProcess.start() as stack:
        other = asyncio.run(RemoteTarget(TargetSpec(admin_token="another-token-" + "y" * 20), stack.url).start())
        assert other.admin_url is None and other.admin_token is None
        none = asyncio.run(RemoteTarget(TargetSpec(), stack.url).start())
        assert none.admin_url is None
        own = asyncio.run(RemoteTarget(TargetSpec(admin_token=stack.admin_token), stack.url + "/v1").start())
        assert own.kind == "builtin" and own.admin_url == stack.admin_url and own.admin_token == stack.admin_token
        token_file = tmp_path / "token"
        token_file.write_text(stack.admin_token + "\n")
        token_file.chmod(0o600)
        by_file = asyncio.run(RemoteTarget(TargetSpec(admin_token_file=str(token_file)), stack.url).start())
        assert by_file.admin_url == stack.admin_url
