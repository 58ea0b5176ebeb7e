"""Helpers for the third-party tests: ports, processes, nginx configurations, the CLI in a child process.

Every process is started in its own session, so ``stop`` can end its whole group.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"
VENV_BIN = Path(sys.executable).parent
LITELLM_KEY = "sk-streamchaos-test-0123456789"  # a test-only master key for a proxy on loopback

# nginx in front of an SSE upstream (measured with nginx 1.22, reference "Measured against real servers"):
# - BUFFERING: nginx's defaults (proxy_buffering on, HTTP/1.0 to the upstream) and the upstream's
#   X-Accel-Buffering: no ignored: each response is held until it ends, then sent whole.
# - STREAMING: proxy_buffering off and HTTP/1.1 with keep-alive to the upstream: chunk by chunk.
# - GZIP: nginx's default proxy_buffering, HTTP/1.1 to the upstream (which alone streams: 52 reads
#   for 64 tokens, measured), the upstream's X-Accel-Buffering: no not honoured (as for an upstream
#   that sends none), and gzip for event streams: a client that sends Accept-Encoding (the OpenAI
#   SDK) gets each 64-token stream in one read; one that sends none still gets it chunk by chunk.
NGINX_MODES = {
    "buffering": "proxy_buffering on; proxy_http_version 1.0; proxy_ignore_headers X-Accel-Buffering;",
    "streaming": 'proxy_buffering off; proxy_http_version 1.1; proxy_set_header Connection "";',
    "gzip": 'proxy_http_version 1.1; proxy_set_header Connection ""; proxy_ignore_headers X-Accel-Buffering; '
            "gzip on; gzip_types text/event-stream;",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float, log: Path,
              headers: dict[str, str] | None = None) -> None:
    """Poll ``url`` until it answers below 500; fail with the log's tail when the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{proc.args!r} exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx.get(url, timeout=2.0, headers=headers or {}, trust_env=False).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    stop(proc)
    pytest.fail(f"{url} did not answer within {timeout:g}s:\n{log.read_text(errors='replace')[-3000:]}")


def stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM the process group, wait, then SIGKILL it: nothing is left running."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    else:  # the leader is gone; its group may not be
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def spawn(command: list[str], log: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True)


def nginx_conf(directory: Path, port: int, upstream: str, mode: str) -> Path:
    """An nginx.conf that proxies 127.0.0.1:``port`` to ``upstream`` in ``mode`` (see NGINX_MODES)."""
    user = "user root;\n" if os.geteuid() == 0 else ""  # workers may write the temp paths under a 0700 tmp dir
    temp = "".join(f"  {k}_temp_path {directory / k};\n" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    conf = directory / "nginx.conf"
    conf.write_text(
        f"{user}worker_processes 1;\ndaemon off;\npid {directory / 'nginx.pid'};\n"
        f"error_log {directory / 'error.log'} warn;\n"
        f"events {{ worker_connections 512; }}\n"
        f"http {{\n  access_log off;\n{temp}"
        f"  server {{\n    listen 127.0.0.1:{port};\n"
        f"    location / {{\n      proxy_pass {upstream};\n      {NGINX_MODES[mode]}\n"
        f"      proxy_read_timeout 60s;\n    }}\n"
        f"  }}\n}}\n", encoding="utf-8")
    return conf


def haproxy_conf(directory: Path, port: int, upstream: str) -> Path:
    """An haproxy.cfg with HAProxy's defaults (no option http-no-delay) proxying 127.0.0.1:``port``
    to ``upstream`` (``http://host:port``): it delivers an SSE stream in ~200 ms bursts."""
    conf = directory / "haproxy.cfg"
    conf.write_text(
        "global\n  log stdout format raw local0 warning\n"
        "defaults\n  mode http\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n"
        f"frontend front\n  bind 127.0.0.1:{port}\n  default_backend stack\n"
        f"backend stack\n  server upstream {upstream.split('://', 1)[-1].rstrip('/')}\n", encoding="utf-8")
    return conf


@dataclass
class Served:
    url: str  # the server's root
    log: Path


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    """``streamchaos ARGS`` in a child process, its output captured."""
    return subprocess.run([sys.executable, "-m", "chaos", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, **(env or {})})


# the causes a verdict gives when this box, not the server, left it undecided (chaos.host.contention,
# chaos.execution.verify): a run against a real server on two shared cores may meet them
BOX_CAUSES = ("host saturated", "load generator saturated", "host contention changed")


def box_noise_only(report: dict) -> bool:
    """Whether every verdict not as expected is an inconclusive the verdict code put down to this box
    (never a fail, never one for want of samples): such a run is run once more, and said so."""
    failing = [v for v in report.get("verdicts", []) if not v.get("ok")]
    return bool(failing) and all(v["status"] == "inconclusive"
                                 and v["evidence"].get("inconclusive_cause") in BOX_CAUSES for v in failing)
