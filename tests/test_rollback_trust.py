"""Rollback treats the journal as data, never as authority (issue 11): each case is a crafted or
stale journal that the old code obeyed and the new one must not."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "nvml"))
from fakenvml import build_fake_nvml, gcc, read_state

from chaos.gpu import burner
from chaos.host.procs import proc_state

pytestmark = pytest.mark.timeout(120)


def write_journal(run_dir: Path, *plans: dict[str, Any], mode: int = 0o600) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "journal.jsonl"
    lines = [{"type": "run", "experiment": "crafted", "t0": 0, "wall_t0": 0.0, "pid": 1, "run_id": "0" * 16}]
    for i, plan in enumerate(plans):
        lines.append({"type": "fault", "fault": f"f{i}", "action": "plan", "t": i, "phase": "p", **plan})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    path.chmod(mode)
    return path


def rollback(run_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), environment.get("PYTHONPATH", "")])
    environment.pop("STREAMCHAOS_NVML_LIB", None)
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "chaos", "rollback", str(run_dir), *args], env=environment,
                          capture_output=True, text=True, timeout=60)


# ---- 1. a library named by the journal is never loaded ------------------------------------------


CONSTRUCTOR = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void pwned(void) {
    const char *path = getenv("PWNED_MARKER");
    FILE *f = fopen(path ? path : "/tmp/streamchaos-pwned", "w");
    if (f) { fputs("constructor ran\n", f); fclose(f); }
}
"""


def test_a_journal_naming_a_library_cannot_make_rollback_load_it(tmp_path: Path) -> None:
    if gcc() is None:
        pytest.skip("gcc is needed to build the hostile library")
    source = tmp_path / "evil.c"
    source.write_text(CONSTRUCTOR)
    evil = tmp_path / "libnvidia-ml.so.1"
    subprocess.run([str(gcc()), "-shared", "-fPIC", "-o", str(evil), str(source)], check=True, timeout=60)
    marker = tmp_path / "constructor-ran"
    run_dir = tmp_path / "run"
    write_journal(run_dir, {"kind": "gpu.throttle", "undo": {"backend": "nvml", "device": 0, "uuid": "GPU-x",
                                                             "nvml_lib": str(evil), "locked_mhz": 990}})
    done = rollback(run_dir, env={"PWNED_MARKER": str(marker)})
    assert not marker.exists(), "rollback loaded the library the journal named"
    assert done.returncode == 4 and "FAILED f0" in done.stdout  # no NVML configured here: it says so and stops


# ---- 2. URLs and credentials come from configuration ------------------------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str | None]] = []

    def do_DELETE(self) -> None:  # noqa: N802 - the http.server naming
        type(self).seen.append(("DELETE", self.path, self.headers.get("Authorization")))
        body = b'{"removed": true, "released": 0}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def listener() -> Iterator[str]:
    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_journal_pointing_at_a_foreign_url_gets_no_request_and_no_token(tmp_path: Path, listener: str) -> None:
    run_dir = tmp_path / "run"
    write_journal(run_dir,
                  {"kind": "server.timeout", "undo": {"admin_url": f"{listener}/admin", "fault_name": "x"}},
                  {"kind": "kv.pressure", "undo": {"method": "reserve", "admin_url": f"{listener}/admin"}},
                  {"kind": "network.latency", "undo": {"api_url": listener, "proxy": "p", "toxics": ["t"]}})
    done = rollback(run_dir, env={"STREAMCHAOS_ADMIN_TOKEN": "secret-token"})
    assert _Recorder.seen == [], "a request reached the URL the journal chose"
    assert done.returncode == 4 and done.stdout.count("configuration does not allow") == 3
    # named by configuration, the same origin is contacted, and only the admin API gets the configured token
    again = rollback(run_dir, "--target-url", listener + "/v1", env={"STREAMCHAOS_ADMIN_TOKEN": "secret-token"})
    assert again.returncode == 0, again.stdout + again.stderr
    assert sorted(p for _, p, _ in _Recorder.seen) == ["/admin/faults/x", "/admin/kv/reserve", "/proxies/p/toxics/t"]
    assert {p: auth for _, p, auth in _Recorder.seen}["/proxies/p/toxics/t"] is None
    assert {auth for _, p, auth in _Recorder.seen if p.startswith("/admin")} == {"Bearer secret-token"}


# ---- 3. the journal itself must be ours ---------------------------------------------------------


def test_a_journal_others_may_write_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    write_journal(run_dir, {"kind": "client.disconnect", "undo": {}}, mode=0o666)
    done = rollback(run_dir)
    assert done.returncode == 4 and "writable by others" in done.stderr


# ---- 4. live state must still be this run's change --------------------------------------------


def test_a_stale_rollback_leaves_someone_elses_clock_lock_alone(tmp_path: Path) -> None:
    if gcc() is None:
        pytest.skip("gcc is needed to build the fake NVML library")
    lib, state = build_fake_nvml(tmp_path), tmp_path / "nvml.state"
    env = {"STREAMCHAOS_NVML_LIB": str(lib), "FAKE_NVML_STATE": str(state)}
    lock = ("import sys; sys.path.insert(0, %r); from chaos.gpu.nvml import Nvml\n"
            "with Nvml() as nv: nv.lock_sm_clocks(0, int(sys.argv[1]), int(sys.argv[1])); "
            "print(nv.uuid(0))") % str(ROOT)
    environment = {**os.environ, **env}
    uuid = subprocess.run([sys.executable, "-c", lock, "990"], env=environment, capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()
    run_dir = tmp_path / "run"
    write_journal(run_dir, {"kind": "gpu.throttle",
                            "undo": {"backend": "nvml", "device": 0, "uuid": uuid, "locked_mhz": 990}},
                  {"kind": "gpu.power_cap",
                   "undo": {"device": 0, "uuid": uuid, "previous_watts": 700.0, "limit_watts": 300.0}})
    # the run died; since then an operator locked the clock at 1500 MHz (the power limit is untouched at 700 W)
    subprocess.run([sys.executable, "-c", lock, "1500"], env=environment, check=True, timeout=60)
    done = rollback(run_dir, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert read_state(state)["dev0.locked_max"] == 1500 and read_state(state).get("dev0.reset_calls", 0) == 0
    assert "left alone" in done.stdout and done.stdout.count("left alone") == 2


# ---- 5. processes: exact helper tags, and a pid proven by its start time -----------------------


def test_a_crafted_tag_cannot_make_rollback_kill_other_runs_helpers(tmp_path: Path) -> None:
    tag = burner.new_tag()
    helper = burner.spawn("cpu", ["--busy", "0.01", "--period", "0.1"], tag=tag, max_seconds=60)
    try:
        assert helper.stdout is not None and helper.stdout.readline().startswith(b"ready")
        run_dir = tmp_path / "run"
        write_journal(run_dir, {"kind": "gpu.throttle",
                                "undo": {"backend": "contention", "tag": "--tag", "helpers": []}},
                      {"kind": "gpu.throttle",
                       "undo": {"backend": "contention", "tag": "streamchaos", "helpers": []}})
        rollback(run_dir)
        time.sleep(0.2)
        assert helper.poll() is None and burner.find_burners(tag) == [helper.pid], "another run's helper was killed"
    finally:
        helper.kill()
        helper.wait(timeout=10)


def test_sigcont_needs_the_recorded_start_time(tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(sleeper.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while proc_state(sleeper.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        run_dir = tmp_path / "run"
        # a plan naming any pid without its start time: nothing proves the pid is still the engine
        write_journal(run_dir, {"kind": "gpu.throttle", "undo": {"backend": "cpu_duty", "tag": burner.new_tag(),
                                                                 "helpers": [], "target_pid": sleeper.pid}})
        done = rollback(run_dir)
        assert done.returncode == 0, done.stdout + done.stderr
        assert proc_state(sleeper.pid) == "T", "rollback resumed a process it could not identify"
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)


# ---- 6. a malformed journal entry fails alone (issue 23.6) -----------------------------------------


def test_a_malformed_port_in_a_journal_fails_that_entry_and_the_rest_is_rolled_back(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    write_journal(run_dir, {"kind": "client.disconnect", "undo": {}},
                  {"kind": "server.timeout",
                   "undo": {"admin_url": "http://127.0.0.1:99999999/admin", "fault_name": "x"}})
    done = rollback(run_dir)
    assert "Traceback" not in done.stderr and done.returncode == 4, done.stdout + done.stderr
    assert "FAILED f1 (server.timeout)" in done.stdout and "not a valid URL" in done.stdout
    assert "rolled back f0 (client.disconnect)" in done.stdout  # handled after the bad one


# ---- 7. servers that died with the runner are "gone", a reused pid is not theirs (issue 41.8) -------------------


def _journal_with_servers(run_dir: Path, notes: list[tuple[str, dict[str, Any]]],
                          plans: list[tuple[str, dict[str, Any]]]) -> None:
    """A killed run's journal as the runner writes it: its notes (the journal adds a ``server`` record
    for each process a note names) and its fault plans, and no ``end``."""
    from chaos.execution.journal import Journal
    from chaos.host.runfiles import prepare_private_dir, release_dir
    from chaos.model.observations import FaultEvent, Note

    prepare_private_dir(run_dir)
    journal = Journal(run_dir / "journal.jsonl", "killed", 0, 0.0)
    for topic, data in notes:
        journal.on_event(Note(topic=topic, t=1, data=data))
    for i, (kind, undo) in enumerate(plans):
        journal.append(FaultEvent(fault=f"f{i}", kind=kind, action="plan", t=2 + i, phase="p", undo=undo))
    journal._file.close()  # killed: no end record
    release_dir(run_dir)


def test_faults_on_servers_that_died_with_the_runner_are_gone_not_failures(tmp_path: Path) -> None:
    stack = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    toxiproxy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    admin, api = "http://127.0.0.1:1/admin", "http://127.0.0.1:2"
    hop = {"name": "net", "kind": "toxiproxy", "listen": "127.0.0.1:3", "base_url": "http://127.0.0.1:3/v1",
           "pid": toxiproxy.pid, "config": json.dumps({"api_url": api, "server": "embedded"})}
    _journal_with_servers(
        tmp_path / "run",
        [("target", {"kind": "builtin", "pid": stack.pid, "base_url": "http://127.0.0.1:1/v1", "admin_url": admin}),
         ("path", {"hops": [hop]})],
        [("server.timeout", {"admin_url": admin, "fault_name": "slow"}),
         ("kv.pressure", {"method": "reserve", "admin_url": admin}),
         ("network.latency", {"api_url": api, "proxy": "p", "toxics": ["t"]})])
    for process in (stack, toxiproxy):  # they die with the runner
        process.kill()
        process.wait(timeout=10)
    done = rollback(tmp_path / "run")  # no --target-url: before, 3 x "configuration does not allow", exit 4
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("gone f") == 3 and "FAILED" not in done.stdout, done.stdout
    assert f"(pid {stack.pid}) exited" in done.stdout and f"(pid {toxiproxy.pid}) exited" in done.stdout
    assert "nothing to roll back" in rollback(tmp_path / "run").stdout  # journaled as rolled back


def test_a_reused_pid_is_gone_and_gets_nothing_while_a_live_server_is_still_asked(tmp_path: Path,
                                                                                   listener: str) -> None:
    from chaos.host.procs import start_time

    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        admin = f"{listener}/admin"
        _journal_with_servers(tmp_path / "run", [("target", {"pid": ours.pid, "admin_url": admin})],
                              [("server.timeout", {"admin_url": admin, "fault_name": "live"})])
        journal = tmp_path / "run" / "journal.jsonl"
        # the same journal, but the stack's pid now belongs to another process (its start time differs)
        reused = tmp_path / "reused"
        reused.mkdir(mode=0o700)
        server = {"type": "server", "role": "target", "pid": stranger.pid,
                  "start_time": (start_time(stranger.pid) or 1) - 1, "urls": [admin]}
        lines = [line for line in journal.read_text().splitlines() if json.loads(line)["type"] != "server"]
        (reused / "journal.jsonl").write_text("\n".join([lines[0], json.dumps(server), *lines[1:]]) + "\n")
        (reused / "journal.jsonl").chmod(0o600)
        done = rollback(reused, "--target-url", listener + "/v1")
        assert done.returncode == 0 and "is another process now (start time differs)" in done.stdout, done.stdout
        assert _Recorder.seen == [] and stranger.poll() is None  # not asked, not signalled
        live = rollback(tmp_path / "run", "--target-url", listener + "/v1")  # ours still runs: asked as before
        assert live.returncode == 0 and [p for _, p, _ in _Recorder.seen] == ["/admin/faults/live"], live.stdout
    finally:
        for process in (stranger, ours):
            process.kill()
            process.wait(timeout=10)
