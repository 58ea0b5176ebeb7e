"""Real runs with a path between load and target: the load goes through every hop, each stream hop's
taps land in the journal (one per stream), report.json names each hop (its version, its effective
configuration, its log), nothing of the path is left running after; the old ``proxy:`` still runs
(with its note); a SIGKILLed runner's hops are ended, and ``streamchaos rollback`` ends a hop group
that outlived its runner.

One builtin stack serves every run (started here, so each run starts only its path); each run is the
CLI in a child process, as a user runs it."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaos.execution.rollback import rollback_run
from chaos.experiment import load_experiment
from chaos.host.journal_file import JOURNAL_NAME, JournalFile
from chaos.host.procguard import group_members
from chaos.model.observations import iter_journal
from chaos.model.request_ids import is_uuid4, record_id_of
from chaos.output.replay import replay
from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(120)

SLA = [{"kind": "errors", "budget": "0%"}, {"kind": "early_close", "budget": "0%"}, {"kind": "integrity"}]


@pytest.fixture(scope="module")
def stack() -> Iterator[str]:
    process = StackProcess.start("--port", "0")
    try:
        yield process.url
    finally:
        process.close()


def _experiment(tmp_path: Path, stack: str, extra: dict[str, Any], seconds: str = "2s") -> Path:
    body = {"name": "path-run", "seed": 1, "target": {"kind": "builtin", "url": stack},
            "load": {"concurrency": 4, "max_tokens": 16, "request_timeout": "20s"},
            "phases": [{"name": "steady", "duration": seconds}], "sla": SLA,
            "safety": {"max_duration": "90s", "drain_timeout": "5s", "cleanup_window": "200ms"}, **extra}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
    return path


def _run(exp: Path, run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chaos", "run", str(exp), "--out", str(run_dir), "--quiet"],
                          capture_output=True, text=True, timeout=100)


def _journal(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / JOURNAL_NAME
    return list(iter_journal(path)) if path.exists() else []


def _report(run_dir: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    return report


def _gone(pid: int) -> bool:
    return not group_members(pid)


def _streams_and_taps(lines: list[dict[str, Any]], hop: str) -> tuple[set[str], list[dict[str, Any]]]:
    streams = {line["id"] for line in lines if line.get("type") == "stream"}
    return streams, [line for line in lines if line.get("type") == "tap" and line["hop"] == hop]


def test_the_load_goes_through_a_stream_hop_and_its_taps_are_journaled(tmp_path: Path, stack: str) -> None:
    run_dir = tmp_path / "run"
    done = _run(_experiment(tmp_path, stack, {"path": [{"kind": "stream"}]}), run_dir)
    assert done.returncode == 0, done.stderr
    lines = _journal(run_dir)
    streams, taps = _streams_and_taps(lines, "stream")
    assert len(streams) >= 8 and len(taps) == len(streams)  # one tap per stream: the load went through it
    assert {t["request_id"] for t in taps} == streams
    # each went out UUID-shaped (load.request_ids: uuid), its tap read back to the stream's own id, the id as sent
    # beside it, every one with the run's tag from the journal's note
    (ids,) = [n["data"] for n in lines if n.get("type") == "note" and n["topic"] == "request_ids"]
    assert all(is_uuid4(t["wire_id"]) and record_id_of(t["wire_id"]) == t["request_id"]
               and t["wire_id"].startswith(ids["run_tag"] + "-") for t in taps), taps[:2]
    assert all(t["up_end"] == "done" and t["down_end"] == "done" and t["up"] and t["down"] for t in taps)
    (hop,) = _report(run_dir)["path"]
    assert hop["kind"] == "stream" and hop["name"] == "stream" and hop["version"]
    assert hop["listen"].startswith("127.0.0.1:") and hop["upstream"] == stack.removesuffix("/v1")
    assert Path(hop["log"]) == run_dir / "hops" / "stream.log" and Path(hop["log"]).is_file()
    assert (Path(hop["log"]).stat().st_mode & 0o777) == 0o600
    assert _gone(hop["pid"])
    resources = [(r["name"], r["action"]) for r in lines if r.get("type") == "resource"]
    assert resources == [("hop:stream", "plan"), ("hop:stream", "release")]
    note = next(n for n in lines if n.get("type") == "note" and n["topic"] == "taps")
    assert note["data"]["records"] == len(taps) and note["data"]["over_cap"] == 0
    # `streamchaos verify` re-judges from the journal alone: the taps are in it
    replayed = replay(load_experiment(run_dir / "experiment.yaml"), run_dir).observations
    assert len(replayed.taps_at("stream")) == len(taps)


def test_a_gateway_between_two_stream_hops(tmp_path: Path, stack: str) -> None:
    run_dir = tmp_path / "run"
    path = [{"kind": "stream", "name": "outer"}, {"kind": "nginx"}, {"kind": "stream", "name": "inner"}]
    done = _run(_experiment(tmp_path, stack, {"path": path}), run_dir)
    assert done.returncode == 0, done.stderr
    lines = _journal(run_dir)
    streams, outer = _streams_and_taps(lines, "outer")
    _, inner = _streams_and_taps(lines, "inner")
    assert len(outer) == len(inner) == len(streams) >= 8  # every stream through all three hops
    outer_hop, nginx, inner_hop = _report(run_dir)["path"]
    assert [h["name"] for h in (outer_hop, nginx, inner_hop)] == ["outer", "nginx", "inner"]  # load side first
    assert nginx["version"] and nginx["version"][0].isdigit()  # e.g. 1.22.1
    assert "proxy_buffering off;" in nginx["config"] and f"listen {nginx['listen']};" in nginx["config"]
    assert outer_hop["upstream"] == "http://" + nginx["listen"] and nginx["upstream"] == "http://" + inner_hop["listen"]
    assert Path(nginx["log"]) == run_dir / "hops" / "nginx.log" and Path(nginx["log"]).is_file()
    for hop in (outer_hop, nginx, inner_hop):
        assert _gone(hop["pid"]), hop  # nothing of the path is left running (nginx's worker included)


def test_the_old_proxy_section_still_runs_with_its_note(tmp_path: Path, stack: str) -> None:
    run_dir = tmp_path / "run"
    exp = _experiment(tmp_path, stack, {"proxy": {"server": "embedded"}}, seconds="1s")
    done = _run(exp, run_dir)
    assert done.returncode == 0, done.stderr
    assert f"{exp}:" in done.stderr and "note: `proxy:` is deprecated: write path: [{kind: toxiproxy, server: " \
        "embedded}] instead" in done.stderr
    report = _report(run_dir)
    assert report["proxy"]["server"] == "embedded" and report["environment"]["proxy"]["why"]
    (hop,) = report["path"]
    assert hop["kind"] == "toxiproxy" and hop["upstream"] == stack and hop["listen"] == report["proxy"]["listen"]


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_sigkilled_runner_leaves_no_hop_running(tmp_path: Path, stack: str) -> None:
    run_dir = tmp_path / "run"
    held = [{"name": "steady", "duration": "60s", "faults": [{"kind": "stream.hold", "seconds": "1s"}]}]
    exp = _experiment(tmp_path, stack, {"path": [{"kind": "stream"}, {"kind": "nginx"}], "phases": held})
    runner = subprocess.Popen([sys.executable, "-m", "chaos", "run", str(exp), "--out", str(run_dir), "--quiet"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: any(line.get("type") == "fault" and line.get("action") == "inject"
                          for line in _journal(run_dir)), 60, "the stream fault to be in force")
        plans = [r for r in _journal(run_dir) if r.get("type") == "resource" and r["action"] == "plan"]
        pgids = {r["name"]: r["undo"]["pgid"] for r in plans}
        assert set(pgids) == {"hop:stream", "hop:nginx"} and not any(_gone(p) for p in pgids.values())
    finally:
        runner.kill()
        runner.wait()
    # the hops die with their runner (the parent-death signal), and its watchdog rolls the run back
    _wait(lambda: all(_gone(p) for p in pgids.values()), 20, "the hops to end")
    rollback = subprocess.run([sys.executable, "-m", "chaos", "rollback", str(run_dir)], capture_output=True,
                              text=True, timeout=60)
    assert rollback.returncode == 0, rollback.stderr
    ends = {r["name"]: r["action"] for r in _journal(run_dir) if r.get("type") == "resource"}
    assert ends == {"hop:stream": "rollback", "hop:nginx": "rollback"}  # none outstanding
    # the stream fault's rule died with its hop, and rolling it back says so: no URL refused, no error
    undone = [r for r in _journal(run_dir) if r.get("type") == "fault" and r.get("action") in ("rollback", "error")
              and r.get("fault") == "stream.hold"]
    assert undone and all(r["action"] == "rollback" for r in undone), undone
    assert "does not allow" not in rollback.stdout + rollback.stderr


def test_rollback_ends_a_hop_group_that_outlived_its_runner(tmp_path: Path, stack: str) -> None:
    """A hop started off the main thread has no parent-death signal (as in the pytest plugin's runs):
    when its runner dies without stopping it, the journal's ``process.group`` is what ends it."""
    from chaos.hops.process import start_stream_hop

    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    journal = JournalFile(run_dir / JOURNAL_NAME, create=True)
    journal.write({"type": "run", "experiment": "orphan", "t0": 0, "wall_t0": 0.0, "pid": 0, "run_id": "r1"},
                  durable=True)

    def record(body: dict[str, Any]) -> None:
        journal.write({"type": "resource", "t": 0, "run_id": "r1", **body}, durable=True)

    started: list[Any] = []
    worker = threading.Thread(target=lambda: started.append(asyncio.run(start_stream_hop(
        "orphan", stack.removesuffix("/v1"), run_dir, taps=False, record=record))))
    worker.start()
    worker.join(60)
    journal.close()
    info, _ = started[0]
    assert info.pid is not None and not _gone(info.pid)
    done = rollback_run(run_dir)
    assert [(d["fault"], d["kind"]) for d in done] == [("hop:orphan", "process.group")]
    assert info.pid in done[0]["evidence"]["ended"]
    _wait(lambda: _gone(info.pid), 15, "the orphaned hop to end")
    assert rollback_run(run_dir) == []  # journaled as rolled back: a second rollback has nothing to do
    assert started[0][1].process.wait(timeout=5) in (0, -signal.SIGTERM, -signal.SIGKILL)  # reaped: it ended
