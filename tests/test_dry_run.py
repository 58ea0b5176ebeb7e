"""``streamchaos run --dry-run`` changes nothing: no process, no toxic, no file, and no request beyond
reading and the load's own request sent once (as the run's preflight sends it).

What the dry run does is watched from outside its code: a CPython audit hook records every process
it would start (``subprocess.Popen``), every socket it connects and every file it opens for writing;
the remote target is a real HTTP server that logs each request; the external Toxiproxy is the real
embedded server, whose proxies are listed before and after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from chaos.cli import main
from chaos.host.children import first_line

pytestmark = pytest.mark.timeout(60)

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_recording: list[tuple[str, str]] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _recording is None:
        return
    if event in ("subprocess.Popen", "os.system", "os.posix_spawn", "os.fork", "os.exec", "os.spawn"):
        _recording.append((event, repr(args[:2])))
    elif event == "socket.connect":
        _recording.append((event, repr(args[1])))
    elif event == "open":
        path, mode, flags = (list(args) + [None, None])[:3]
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) \
            or (isinstance(flags, int) and flags & _WRITE_FLAGS)
        if writes and not str(path).endswith(".pyc") and "__pycache__" not in str(path):  # imports may cache bytecode
            _recording.append((event, str(path)))


sys.addaudithook(_audit)  # hooks cannot be removed: it records only while a test sets _recording


@pytest.fixture
def recorded() -> Iterator[list[tuple[str, str]]]:
    global _recording
    _recording = []
    try:
        yield _recording
    finally:
        _recording = None


class _Recorder(BaseHTTPRequestHandler):
    """A remote OpenAI-compatible server that logs what it is asked: answers /v1/models, 404 to the rest."""

    log: list[tuple[str, str]] = []

    def _any(self) -> None:
        type(self).log.append((self.command, self.path))
        body = json.dumps({"data": [{"id": "served-model"}]} if self.path == "/v1/models" else {"error": "no"}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = do_PUT = _any

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def remote() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    _Recorder.log = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", _Recorder.log
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def toxiproxy(tmp_path: Path) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "chaos.toxiproxy.server", "--host", "127.0.0.1", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        line = first_line(proc, 20)
        assert line.startswith("toxiproxy listening on "), line
        yield line.removeprefix("toxiproxy listening on ").strip()
    finally:
        proc.kill()
        proc.wait(10)


CHAOS_PHASE = """\
  - name: chaos
    duration: 2s
    faults:
      - {kind: network.latency, name: lag, latency: 100ms, jitter: 10ms, direction: both}
      - {kind: network.down, name: cut}
      - {kind: client.disconnect, name: hangups, fraction: 30%, after_tokens: [1, 4]}
"""


def _write(tmp_path: Path, head: str, extra_faults: str = "") -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(f"name: dry\n{head}load: {{concurrency: 2, max_tokens: 8}}\n"
                    f"phases:\n  - {{name: base, duration: 1s}}\n"
                    f"{CHAOS_PHASE}{extra_faults}sla:\n  - {{kind: errors, budget: 0%}}\n", encoding="utf-8")
    return path


def test_a_builtin_dry_run_starts_connects_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str],
                                                              recorded: list[tuple[str, str]]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    path = _write(tmp_path, "proxy: {server: embedded}\n", """\
      - {kind: server.stall, name: stall, where: engine, duration: 200ms, every: 1s}
      - {kind: kv.pressure, name: squeeze, fraction: 50%}
      - {kind: process.kill, name: crash, at: 1s, restart: true}
      - {kind: gpu.throttle, name: slow, fraction_of_max: 50%}
""")
    recorded.clear()  # from here on: the dry run only
    code = main(["run", str(path), "--dry-run"])
    out = capsys.readouterr().out
    assert recorded == [], recorded  # no process, no socket, no file
    assert code == 0, out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml"]  # no run directory
    assert "the builtin stack, started as a child process" in out and "not started now" in out
    for name, changes, undone in (
        ("lag", "adds latency toxic(s) lag-downstream, lag-upstream (latency=100ms, jitter=10ms",
         "deletes toxic(s) lag-downstream, lag-upstream"),
        ("cut", "disables proxy 'streamchaos'", "enables the proxy again"),
        ("hangups", "installs a rule in the load generator's clients (fraction=30%, after_tokens=[1, 4])",
         "removes the rule"),
        ("stall", "installs hook fault 'stall' in the builtin stack", "lease lapses within"),
        ("squeeze", "reserves 50% of the KV-cache blocks", "releases the reservation"),
        ("crash", "sends SIGKILL to the serving process the runner starts 1s after the phase starts",
         "a kill cannot be undone"),
        ("slow", "picks its backend when the run starts: contention on the engine's GPU, "
         "or for a CPU engine a duty cycle",
         "cpu_duty: stops the duty cycle and SIGCONTs the engine"),
    ):
        block = out.split(f"fault {name!r}", 1)[1]
        assert changes in block.split("\n")[1] and undone in block.split("\n")[2], (name, block[:400])
    assert "phase 'base': +0s for 1s, no faults" in out and "phase 'chaos': +1s for 2s" in out
    assert "contacted: nothing" in out and "WOULD BE REFUSED" not in out


def test_a_remote_dry_run_reads_and_sends_the_loads_request_once(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 recorded: list[tuple[str, str]],
                                                                 remote: tuple[str, list[tuple[str, str]]],
                                                                 toxiproxy: str) -> None:
    url, log = remote
    before = httpx.get(toxiproxy + "/proxies").json()
    path = _write(tmp_path, f"target: {{kind: openai, url: '{url}'}}\n"
                  f"proxy: {{server: external, url: '{toxiproxy}'}}\n",
                  "      - {kind: server.stall, name: stall, where: engine, duration: 200ms, every: 1s}\n")
    recorded.clear()
    code = main(["run", str(path), "--dry-run"])
    events = list(recorded)
    out = capsys.readouterr().out
    # one read, then the load's own request once (the real run's preflight; this server answers it 404)
    assert log == [("GET", "/v1/models"), ("POST", "/v1/completions")]
    assert httpx.get(toxiproxy + "/proxies").json() == before == {}  # no proxy, no toxic
    ports = {url.rsplit(":", 1)[1].split("/")[0], toxiproxy.rsplit(":", 1)[1]}
    assert events and all(e == "socket.connect" for e, _ in events), events  # no process, no file
    assert {detail.split(",")[1].strip(" )") for _, detail in events} <= ports, events
    assert "answers GET /v1/models: serves served-model" in out and "answers GET /version" in out
    assert f"GET {url}/models -> 200" in out and f"GET {toxiproxy}/version -> 200" in out
    assert "REFUSES THE LOAD'S REQUEST" in out and "set `load.endpoint: chat`" in out
    # the target shows no admin API (no token configured), so the in-process fault would be refused
    assert "WOULD BE REFUSED: server.stall acts through the admin API of the builtin stack" in out
    assert code == 4


def test_a_refused_target_is_not_even_read(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           recorded: list[tuple[str, str]],
                                           remote: tuple[str, list[tuple[str, str]]]) -> None:
    url, log = remote
    outward = url.replace("127.0.0.1", "example.invalid")  # not loopback, not allowed; nothing may even resolve it
    path = _write(tmp_path, f"target: {{kind: openai, url: '{outward}'}}\nproxy: {{server: embedded}}\n")
    recorded.clear()
    code = main(["run", str(path), "--dry-run"])
    out = capsys.readouterr().out
    assert code == 2 and recorded == [] and log == []
    assert f"REFUSED: target {outward} is not on this host's loopback" in out and "not contacted: refused above" in out
    assert "the run would be refused (exit 2)" in out


@pytest.mark.parametrize(("server", "said"), [
    ("auto", "proxy: no proxy.url or TOXIPROXY_URL: the embedded server as a child process, its API answering only "
             "this run; stopped at the end"),
    ("binary", "ITS API IS UNGUARDED: any local user can redirect the run's proxy"),
])
def test_auto_means_the_embedded_server_even_with_a_binary_on_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        recorded: list[tuple[str, str]], server: str, said: str) -> None:
    """Issue 41 point 1: ``auto`` never starts a ``toxiproxy-server`` (its API answers every local user);
    the binary only when asked for by name, and then the dry run says its API is unguarded."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    monkeypatch.setenv("TOXIPROXY_SERVER_BIN", "/bin/true")
    path = _write(tmp_path, f"proxy: {{server: {server}}}\n")
    recorded.clear()
    code = main(["run", str(path), "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and recorded == [], (code, recorded, out)
    assert said in out, out
    assert ("toxiproxy-server binary /bin/true" in out) == (server == "binary"), out  # was: auto took the binary
