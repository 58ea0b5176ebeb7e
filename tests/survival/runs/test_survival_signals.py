"""`streamchaos survival` stopped by a signal, as `run` and `capacity` are: SIGTERM (what `timeout`, a
CI cancel or a service manager sends) and SIGINT, even where it starts ignored (a background job of a
non-interactive shell), end the search at once; the target and the path are stopped, the journal is
closed as interrupted, survival.json says what was found, the exit code is 4, and no process is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

EXPERIMENT = """
name: survival-signals
seed: 1
target: {kind: builtin, model: tiny}
load: {max_tokens: [8, 8]}
path:
  - {kind: stream, name: inner}
phases:
  - {name: steady, duration: 1s}
"""


def _ignore_sigint() -> None:  # runs in the child before exec, as `cmd &` in a script does
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _left_behind(out: Path) -> list[str]:
    """Command lines of processes still naming the run directory (the stack, the hop)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(out) in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


def _wait_for(line: str, stream: Path, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while line not in stream.read_text(encoding="utf-8", errors="replace"):
        assert time.monotonic() < deadline, f"no {line!r} within {within_s:g}s: {stream.read_text()}"
        time.sleep(0.1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT-ignored-at-start"])
def test_a_signal_stops_the_search_and_leaves_its_account(sig: signal.Signals, tmp_path: Path) -> None:
    experiment = tmp_path / "survival-signals.yaml"
    experiment.write_text(EXPERIMENT, encoding="utf-8")
    out, err = tmp_path / "run", tmp_path / "stderr.txt"
    with open(err, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "chaos", "survival", str(experiment), "--dimensions", "hold", "--max", "40s",
             "--out", str(out)], stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
            preexec_fn=_ignore_sigint if sig == signal.SIGINT else None)
        try:
            _wait_for("hold: first event held", err, 60.0)  # the 40 s probe is under way
            time.sleep(0.5)
            began = time.monotonic()
            process.send_signal(sig)
            printed, _ = process.communicate(timeout=30)
            took = time.monotonic() - began
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 4, (process.returncode, err.read_text())
    assert took < 15, took  # not the 40 s probe run out
    body = json.loads((out / "survival.json").read_text(encoding="utf-8"))
    assert body["interrupted"] and body["exit_code"] == 4 and body["not_finished"] == ["hold"], body
    assert body["baseline"]["outcome"] == "whole"  # what was found before the signal is kept
    assert (out / "report.html").is_file()
    assert "interrupted" in printed.decode()
    last = json.loads((out / "journal.jsonl").read_text(encoding="utf-8").splitlines()[-1])
    assert last["type"] == "end" and last["status"] == "interrupted", last
    journal = [json.loads(line) for line in (out / "journal.jsonl").read_text(encoding="utf-8").splitlines()]
    released = [r["name"] for r in journal if r.get("type") == "resource" and r.get("action") == "release"]
    assert "hop:inner" in released  # stopped by the search, not left to the parent-death signal
    time.sleep(0.5)
    assert _left_behind(out) == []
