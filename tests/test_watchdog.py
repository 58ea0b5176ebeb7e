"""The watchdog acts on its own run only: another run's end record in the journal does not stand it down."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos.execution.watchdog import _run_ended

ROOT = Path(__file__).resolve().parent.parent


def journal(path: Path, *lines: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    path.chmod(0o600)
    return path


def test_only_its_own_end_record_counts(tmp_path: Path) -> None:
    path = journal(tmp_path / "journal.jsonl", {"type": "run", "run_id": "old"}, {"type": "end", "run_id": "old"})
    assert _run_ended(path, "old") and not _run_ended(path, "new")


@pytest.mark.timeout(60)
def test_a_dead_runner_is_rolled_back_even_after_an_older_end_record(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=10)
    path = journal(
        tmp_path / "journal.jsonl",
        {"type": "run", "run_id": "old"}, {"type": "end", "status": "completed", "run_id": "old"},
        {"type": "run", "run_id": "new"},
        {"type": "fault", "fault": "hangups", "kind": "client.disconnect", "action": "plan", "t": 1, "phase": "p",
         "undo": {}},
    )
    done = subprocess.run([sys.executable, "-m", "chaos.execution.watchdog", str(tmp_path), "--pid", str(dead.pid),
                           "--run-id", "new", "--poll", "0.05"], cwd=ROOT, capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    actions = [json.loads(line).get("action") for line in path.read_text().splitlines()]
    assert actions[-1] == "rollback", done.stderr


@pytest.mark.timeout(60)
def test_a_second_rollback_of_one_journal_stands_aside_naming_the_first(tmp_path: Path) -> None:
    """Issue 41.8: two watchdogs (or a watchdog and `streamchaos rollback`) rolled one journal back at
    once. The first holds RUN_DIR/rollback.lock; the others, real processes, do nothing and name its pid."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=10)
    path = journal(tmp_path / "journal.jsonl", {"type": "run", "run_id": "r"},
                   {"type": "fault", "fault": "hangups", "kind": "client.disconnect", "action": "plan", "t": 1,
                    "phase": "p", "undo": {}})
    hold = ("import sys\nfrom pathlib import Path\nfrom chaos.execution.rollback import rollback_lock\n"
            f"with rollback_lock(Path({str(tmp_path)!r})):\n    print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", hold], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        watchdog = subprocess.run([sys.executable, "-m", "chaos.execution.watchdog", str(tmp_path), "--pid",
                                   str(dead.pid), "--run-id", "r", "--poll", "0.05"],
                                  cwd=ROOT, capture_output=True, text=True, timeout=50)
        assert watchdog.returncode == 0, watchdog.stderr
        assert f"rollback already in progress by pid {holder.pid}; standing down" in watchdog.stderr
        cli = subprocess.run([sys.executable, "-m", "chaos", "rollback", str(tmp_path), "--wait", "0"], cwd=ROOT,
                             capture_output=True, text=True, timeout=50)
        assert cli.returncode == 4 and f"rollback already in progress by pid {holder.pid}" in cli.stderr, cli.stderr
        assert cli.stderr.count("\n") == 1 and "Traceback" not in cli.stderr
        # a user who waits a little (as the default 60s does) is refused only after the wait, naming it
        t0 = time.monotonic()
        waited = subprocess.run([sys.executable, "-m", "chaos", "rollback", str(tmp_path), "--wait", "500ms"],
                                cwd=ROOT, capture_output=True, text=True, timeout=50)
        assert waited.returncode == 4 and "after waiting 0.5s" in waited.stderr, waited.stderr
        assert time.monotonic() - t0 >= 0.5
        assert len(path.read_text().splitlines()) == 2  # none wrote a record
        # one that waits while the holder ends goes on and rolls back what that one left outstanding
        patient = subprocess.Popen([sys.executable, "-m", "chaos", "rollback", str(tmp_path), "--wait", "30s"],
                                   cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert patient.stderr is not None
        assert f"rollback in progress by pid {holder.pid}; waiting up to 30s" in patient.stderr.readline()
    finally:
        holder.communicate(timeout=10)  # closes its stdin: it lets go
    out, err = patient.communicate(timeout=50)
    assert patient.returncode == 0 and "rolled back hangups" in out, out + err
    after = subprocess.run([sys.executable, "-m", "chaos", "rollback", str(tmp_path)], cwd=ROOT,
                           capture_output=True, text=True, timeout=50)
    assert after.returncode == 0 and "nothing to roll back" in after.stdout, after.stdout + after.stderr
