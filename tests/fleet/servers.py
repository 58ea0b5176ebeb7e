"""The fleet's monitoring as real processes on 127.0.0.1: Prometheus, Alertmanager and an nginx that asks
for a bearer token, for the tests of ``chaos.fleet`` and of ``safety.stop_when``.

Plain context managers (a pytest fixture wraps one in a ``with``). Each server gets its own folder under
``tmp``, a free port (a port taken between our probe and its bind is retried on another, up to three
times), a log file that every error names, readiness read from ``/-/ready`` within 20 s, and on exit a
SIGTERM to its process group, then a SIGKILL 3 s later: nothing is left running.

Imported as ``tests.fleet.servers``: tests/thirdparty has a ``servers`` module of its own, put on
``sys.path`` by its conftest, so a bare ``import servers`` could find either.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from tests.thirdparty.servers import free_port, spawn, stop

PROMETHEUS = "/usr/bin/prometheus"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
NGINX = "/usr/sbin/nginx"
READY_WITHIN_S = 20.0
STOP_GRACE_S = 3.0
BIND_TRIES = 3


class ServerFailed(RuntimeError):
    """A server did not come up: the message names its log and quotes the log's tail."""


@dataclass
class Server:
    url: str  # the server's root, http://127.0.0.1:PORT
    pid: int
    log: Path


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-2000:]
    except OSError:
        return "(no log)"


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, headers: dict[str, str]) -> bool:
    """Poll ``url`` until it answers 200: True. False when the process exited (the caller reads why);
    ``ServerFailed`` when it is still not ready after READY_WITHIN_S."""
    deadline = time.monotonic() + READY_WITHIN_S
    with httpx.Client(timeout=1.0, trust_env=False, headers=headers) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            try:
                if client.get(url).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    stop(proc, STOP_GRACE_S)
    raise ServerFailed(f"{url} was not ready within {READY_WITHIN_S:g}s; log {log}:\n{_tail(log)}")


@contextmanager
def _serve(name: str, folder: Path, command: Callable[[int], list[str]],
           headers: dict[str, str] | None = None) -> Iterator[Server]:
    """Start ``command(port)`` on a free port, wait for ``/-/ready``, yield it, stop it. A bind lost to
    another process (the port was free when probed) is tried again on another port."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"{name}.log"
    for attempt in range(1, BIND_TRIES + 1):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"--- attempt {attempt} on port {port}\n")
        proc = spawn(command(port), log, cwd=folder)
        try:
            if _wait_ready(f"{url}/-/ready", proc, log, headers or {}):
                break
        except BaseException:
            stop(proc, STOP_GRACE_S)
            raise
        if "address already in use" not in _tail(log).lower() or attempt == BIND_TRIES:
            raise ServerFailed(f"{name} exited with {proc.returncode} before it was ready; log {log}:\n{_tail(log)}")
    try:
        yield Server(url, proc.pid, log)
    finally:
        stop(proc, STOP_GRACE_S)


def _duration(seconds: float) -> str:
    """Prometheus's duration syntax, in whole milliseconds (it takes no fractions)."""
    return f"{max(1, round(seconds * 1000))}ms"


@contextmanager
def prometheus(tmp: Path, *, scrape_targets: Sequence[str] = (), metrics_path: str = "/metrics",
               rules_yaml: str | None = None, alertmanager_url: str | None = None,
               interval_s: float = 1.0) -> Iterator[Server]:
    """A Prometheus that scrapes ``scrape_targets`` (``host:port``) as job ``stack`` and evaluates
    ``rules_yaml`` (a rule file's text) every ``interval_s``, sending alerts to ``alertmanager_url``.

    ``--rules.alert.resend-delay`` is the interval, not 1 min: the first evaluations come before the
    notifier has discovered its Alertmanager (measured with 2.42), so a firing alert's first send goes
    nowhere and, by default, the next is a minute later (61 s from start to the Alertmanager)."""
    folder = tmp / "prometheus"
    folder.mkdir(parents=True, exist_ok=True)
    interval = _duration(interval_s)
    config: dict[str, object] = {"global": {"scrape_interval": interval, "evaluation_interval": interval,
                                            "scrape_timeout": _duration(interval_s * 0.8)}}
    if scrape_targets:
        config["scrape_configs"] = [{"job_name": "stack", "metrics_path": metrics_path,
                                     "static_configs": [{"targets": list(scrape_targets)}]}]
    if rules_yaml is not None:
        (folder / "rules.yml").write_text(rules_yaml, encoding="utf-8")
        config["rule_files"] = [str(folder / "rules.yml")]
    if alertmanager_url is not None:
        scheme, _, hostport = alertmanager_url.rstrip("/").partition("://")
        config["alerting"] = {"alertmanagers": [{"scheme": scheme, "static_configs": [{"targets": [hostport]}]}]}
    conf = folder / "prometheus.yml"
    conf.write_text(json.dumps(config, indent=2), encoding="utf-8")  # JSON is YAML
    with _serve("prometheus", folder, lambda port: [
        PROMETHEUS, f"--config.file={conf}", f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}", f"--rules.alert.resend-delay={interval}",
    ]) as server:
        yield server


@contextmanager
def alertmanager(tmp: Path) -> Iterator[Server]:
    """An Alertmanager that notifies nobody (one null receiver) and gossips with nobody: with no
    ``--cluster.listen-address=`` it binds 0.0.0.0:9094 and two of them on one host collide."""
    folder = tmp / "alertmanager"
    folder.mkdir(parents=True, exist_ok=True)
    config = {"route": {"receiver": "null", "group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h"},
              "receivers": [{"name": "null"}]}
    conf = folder / "alertmanager.yml"
    conf.write_text(json.dumps(config, indent=2), encoding="utf-8")
    with _serve("alertmanager", folder, lambda port: [
        ALERTMANAGER, f"--config.file={conf}", f"--storage.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
    ]) as server:
        yield server


def _nginx_conf(folder: Path, port: int, upstream_url: str, token: str) -> Path:
    temp = "".join(f"  {k}_temp_path {folder / k};\n" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    conf = folder / f"nginx-{port}.conf"
    user = "user root;\n" if os.geteuid() == 0 else ""  # workers may write the temp paths under a 0700 tmp dir
    conf.write_text(
        f"{user}worker_processes 1;\ndaemon off;\npid {folder / 'nginx.pid'};\n"
        f"error_log {folder / 'error.log'} warn;\n"
        f"events {{ worker_connections 64; }}\n"
        f"http {{\n  access_log {folder / 'access.log'};\n{temp}"
        f"  server {{\n    listen 127.0.0.1:{port};\n"
        f"    location / {{\n"
        f'      if ($http_authorization != "Bearer {token}") {{ return 401; }}\n'
        f"      proxy_pass {upstream_url.rstrip('/')};\n"
        f"    }}\n  }}\n}}\n", encoding="utf-8")
    return conf


@contextmanager
def bearer_proxy(tmp: Path, upstream_url: str, token: str) -> Iterator[Server]:
    """nginx in front of ``upstream_url``: 401 unless ``Authorization: Bearer <token>``, else proxied.
    As a fleet's Prometheus behind an auth proxy is. ``token``: letters, digits, ``._~+/=-`` only (it is
    written into nginx's config)."""
    if not re.fullmatch(r"[A-Za-z0-9._~+/=-]+", token):
        raise ValueError(f"token {token!r}: letters, digits and ._~+/=- only")
    folder = tmp / "bearer-proxy"
    folder.mkdir(parents=True, exist_ok=True)
    for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (folder / sub).mkdir(exist_ok=True)

    def command(port: int) -> list[str]:
        conf = _nginx_conf(folder, port, upstream_url, token)
        # -e: the startup error log, which is /var/log/nginx's until the config is read
        return [NGINX, "-p", str(folder), "-e", str(folder / "error.log"), "-c", str(conf)]

    with _serve("nginx", folder, command, headers={"Authorization": f"Bearer {token}"}) as server:
        yield server


def _post_alert(alertmanager_url: str, labels: dict[str, str], annotations: dict[str, str] | None,
                starts: datetime, ends: datetime) -> None:
    alert = {"labels": labels, "annotations": annotations or {},
             "startsAt": starts.isoformat(), "endsAt": ends.isoformat()}
    response = httpx.post(f"{alertmanager_url.rstrip('/')}/api/v2/alerts", json=[alert], timeout=5.0,
                          trust_env=False)
    if response.status_code != 200:
        raise RuntimeError(f"Alertmanager refused the alert {labels}: {response.status_code} {response.text}")


def push_alert(alertmanager_url: str, labels: dict[str, str], *, annotations: dict[str, str] | None = None,
               ends_in_s: float = 300) -> None:
    """Make an alert fire on the Alertmanager now, as Prometheus would, until ``ends_in_s`` from now."""
    now = datetime.now(UTC)
    _post_alert(alertmanager_url, labels, annotations, now, now + timedelta(seconds=ends_in_s))


def resolve_alert(alertmanager_url: str, labels: dict[str, str]) -> None:
    """Resolve the alert with ``labels`` (its identity): ends now. Its start is sent too, a second back:
    Alertmanager sets a missing start to its own now, which would be after this end (a 400)."""
    now = datetime.now(UTC)
    _post_alert(alertmanager_url, labels, None, now - timedelta(seconds=1), now)
