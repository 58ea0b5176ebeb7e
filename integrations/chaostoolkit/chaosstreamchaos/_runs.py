"""What the activities share: one ``streamchaos run`` child process per run, the record of it in its
run directory (``chaostoolkit.json``), and the run's ``report.json`` read back.

A run is a child process, never an in-process ``chaos.run``: the Chaos Toolkit calls activities one at
a time on its own thread, and a run wants signal handlers and an event loop of its own. The child is
started in a session of its own, so a Ctrl-C at the terminal reaches the Chaos Toolkit alone, which
then stops the child with one SIGTERM (a second one would cut the run's teardown short), and with
``PR_SET_PDEATHSIG`` (``chaos.host.children.spawn``), so it gets SIGTERM when the process that started
it is gone, however it went, when the activity runs on the Chaos Toolkit's main thread (the kernel ties
that signal to the starting thread, so ``spawn`` sets it only there): an activity marked
``"background": true`` starts its run from a worker thread, and a Chaos Toolkit killed outright then
leaves it running to its own ``safety.max_duration``. A run this module had to kill is rolled back
(``streamchaos rollback``) at once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml
from chaoslib.exceptions import ActivityFailed

from chaos.host.children import spawn
from chaos.model.units import UnitError, parse_duration

__all__ = [
    "DEFAULT_SLA", "OUTCOMES", "Child", "forget", "generated_experiment", "outcome", "read_report", "run_dir_for",
    "start_child", "stop_child", "summary", "time_limit", "verdict_summary", "wait_child", "wait_for_load",
    "wait_run_dir",
]

logger = logging.getLogger("chaostoolkit")

RECORD = "chaostoolkit.json"  # in the run directory: the child's pid and start time, once its runner made it
API_KEY_ENV = "STREAMCHAOS_CTK_API_KEY"  # the child's copy of the `api_key` secret (never on its command line)
OUTCOMES = {0: "pass", 1: "fail", 2: "invalid", 3: "inconclusive", 4: "error"}  # docs/contracts.md's exit codes
VERDICT_KEYS = ("sla", "name", "phase", "status", "figure", "budget", "unit", "samples", "expect", "ok")
DEFAULT_MAX_DURATION_S = 600.0  # safety.max_duration's default (chaos.experiment.sections.SAFETY)
GRACE_S = 120.0  # beyond safety.max_duration: the target's start before it and the run's teardown after it
STOP_WAIT_S = 60.0  # after one SIGTERM, how long the run may take to revert its faults and write its report
POLL_S = 0.1
# a generated experiment's SLAs where the activity names none: no stream fails. Not kv_cleanup: the KV cache
# at rest after the load is another run's to judge where two share a target (start_load beside inject_fault)
DEFAULT_SLA: list[dict[str, Any]] = [{"kind": "errors", "budget": "0%"}]


@dataclass
class Child:
    """A ``streamchaos run`` this process started: the process and its output (stdout and stderr)."""

    proc: subprocess.Popen[bytes]
    output: IO[bytes]
    run_dir: Path
    limit_s: float
    started: float = field(default_factory=time.time)
    terminated: bool = False

    def tail(self, limit: int = 2000) -> str:
        """The end of what the run printed (its `streamchaos: ...` line, or the experiment's problems)."""
        try:
            self.output.flush()
            self.output.seek(0)
            text = self.output.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""
        return "\n".join(line for line in text.splitlines() if line.strip())[-limit:]


_children: dict[str, Child] = {}  # by run directory: the runs this process started and has not reaped
_lock = threading.Lock()


def run_dir_for(out_dir: str | None) -> Path:
    """The run directory: ``out_dir`` (absent or empty: the runner refuses one holding anything), else a
    new empty one under the temporary directory."""
    if out_dir:
        return Path(out_dir).expanduser().absolute()
    return Path(tempfile.mkdtemp(prefix="streamchaos-ctk-"))


def _key(run_dir: str | Path) -> str:
    return os.path.abspath(os.path.expanduser(str(run_dir)))


def _command(experiment: Path, run_dir: Path, target_url: str | None,
             secrets: Mapping[str, Any] | None) -> tuple[list[str], dict[str, str]]:
    # -P: not the working directory first on sys.path, where a folder named chaos/ (of Chaos Toolkit
    # experiments, say) would shadow streamchaos's package
    argv = [sys.executable, "-P", "-m", "chaos", "run", str(experiment), "--out", str(run_dir), "--quiet"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if target_url:
        argv += ["--target-url", target_url]
    api_key = (secrets or {}).get("api_key")
    if api_key:
        env[API_KEY_ENV] = str(api_key)
        argv += ["--api-key-env", API_KEY_ENV]
    return argv, env


def time_limit(experiment: Mapping[str, Any] | Path) -> float:
    """How long a run of this experiment may take in all: its ``safety.max_duration`` and ``GRACE_S``.
    An experiment that cannot be read gets the default: the run itself then says what is wrong with it."""
    data: Any = experiment
    if isinstance(experiment, Path):
        try:
            data = yaml.safe_load(experiment.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            data = None
    safety = data.get("safety") if isinstance(data, Mapping) else None
    raw = safety.get("max_duration") if isinstance(safety, Mapping) else None
    try:
        limit = parse_duration(raw) if raw is not None else DEFAULT_MAX_DURATION_S
    except UnitError:
        limit = DEFAULT_MAX_DURATION_S
    return limit + GRACE_S


def start_child(experiment: Path, run_dir: Path, target_url: str | None, secrets: Mapping[str, Any] | None,
                limit_s: float) -> Child:
    argv, env = _command(experiment, run_dir, target_url, secrets)
    output = tempfile.TemporaryFile()  # noqa: SIM115  (closed by forget, when the child is reaped)
    try:
        proc = spawn(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, env=env,
                     start_new_session=True)
    except OSError as exc:
        output.close()
        raise ActivityFailed(f"could not start streamchaos: {exc}") from None
    child = Child(proc, output, run_dir, limit_s)
    with _lock:
        _children[_key(run_dir)] = child
    return child


def forget(child: Child) -> None:
    """Let go of a run this process started, once it has ended: its output is closed."""
    with _lock:
        if _children.get(_key(child.run_dir)) is child:
            del _children[_key(child.run_dir)]
    child.output.close()


def _terminate(child: Child, wait_s: float) -> bool:
    """One SIGTERM (the runner reverts every fault and writes its report), then SIGKILL after ``wait_s``
    and ``streamchaos rollback``. True when it had to be killed."""
    if child.proc.poll() is not None:
        return False
    if not child.terminated:
        child.terminated = True
        child.proc.send_signal(signal.SIGTERM)
    try:
        child.proc.wait(wait_s)
        return False
    except subprocess.TimeoutExpired:
        child.proc.kill()
        child.proc.wait(10)
        _rollback(child.run_dir)  # killed mid-revert perhaps: what it left in force is undone from its journal
        return True


def wait_child(child: Child, timeout_s: float) -> int:
    """The exit code of a run this process started, waiting at most ``timeout_s``; past it the run is
    stopped (SIGTERM, then SIGKILL) and ``ActivityFailed`` raised. An interruption of the wait (Ctrl-C)
    stops the run too before it goes on."""
    try:
        return child.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        killed = _terminate(child, STOP_WAIT_S)
        tail = child.tail()
        forget(child)
        how = "killed it" if killed else "stopped it (SIGTERM)"
        raise ActivityFailed(f"streamchaos run {child.run_dir} still ran after {timeout_s:g}s; {how}\n{tail}") from None
    except BaseException:
        _terminate(child, STOP_WAIT_S)
        forget(child)
        raise


def read_report(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's ``report.json``, or None where there is none (yet) or it cannot be read."""
    try:
        data = json.loads((Path(run_dir) / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def verdict_summary(verdict: Mapping[str, Any]) -> dict[str, Any]:
    """A verdict of report.json without its evidence (large), but with the reason an undecided one gives."""
    out = {key: verdict.get(key) for key in VERDICT_KEYS}
    evidence = verdict.get("evidence")
    if isinstance(evidence, Mapping) and isinstance(evidence.get("reason"), str):
        out["reason"] = evidence["reason"]
    return out


def summary(run_dir: Path, exit_code: int | None, report: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a finished run's activity returns: exit code, its outcome word, run directory, how the run
    ended (report.json's ``status``: ``completed``, ``interrupted``, ``halted``, ``failed``), verdicts."""
    verdicts = report.get("verdicts") if report else None
    return {
        "exit_code": exit_code,
        "status": OUTCOMES.get(exit_code, "killed") if exit_code is not None else "unknown",
        "run_dir": str(run_dir),
        "run_status": report.get("status") if report else None,
        "verdicts": [verdict_summary(v) for v in verdicts or [] if isinstance(v, Mapping)],
    }


def outcome(run_dir: Path, exit_code: int, output: str) -> dict[str, Any]:
    """``summary`` of a run that ended with ``exit_code``: 0, 1 and 3 are returned (the probes and their
    tolerances judge them); 2, 4 or a signal raise ``ActivityFailed`` with why."""
    report = read_report(run_dir)
    if exit_code in (0, 1, 3):
        return summary(run_dir, exit_code, report)
    what = OUTCOMES.get(exit_code, f"killed by signal {-exit_code}" if exit_code < 0 else "unknown")
    why = (report or {}).get("error") or output or "(no output)"
    raise ActivityFailed(f"streamchaos run {run_dir} exited {exit_code} ({what}): {why}")


def _journal_records(run_dir: Path) -> list[dict[str, Any]]:
    try:
        with open(run_dir / "journal.jsonl", "rb") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # the line being written
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def _proc_start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (clock ticks since boot): a pid reused by another process differs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[19]) if len(fields) > 19 and fields[0] != "Z" else None


def wait_for_load(child: Child, ready_timeout_s: float) -> dict[str, Any]:
    """Wait until the run's first phase has begun (its load is running), then write ``chaostoolkit.json``
    into the run directory and say so. A run that ends first is returned as it ended (``outcome``); one
    that has not begun a phase within ``ready_timeout_s`` is stopped and ``ActivityFailed`` raised."""
    deadline = time.monotonic() + ready_timeout_s
    try:
        while not any(r.get("type") == "phase" for r in _journal_records(child.run_dir)):
            code = child.proc.poll()
            if code is not None:
                tail = child.tail()
                forget(child)
                return {**outcome(child.run_dir, code, tail), "pid": child.proc.pid, "running": False}
            if time.monotonic() > deadline:
                _terminate(child, STOP_WAIT_S)
                tail = child.tail()
                forget(child)
                raise ActivityFailed(f"streamchaos run {child.run_dir} began no phase within {ready_timeout_s:g}s; "
                                     f"stopped it\n{tail}")
            time.sleep(POLL_S)
    except BaseException:
        if _children.get(_key(child.run_dir)) is child:
            _terminate(child, STOP_WAIT_S)
            forget(child)
        raise
    pid = child.proc.pid
    _write_record(child.run_dir, {"pid": pid, "start_time": _proc_start_time(pid), "argv": child.proc.args,
                                  "started_at": child.started, "limit_s": child.limit_s})
    return {"run_dir": str(child.run_dir), "pid": pid, "running": True}


def _write_record(run_dir: Path, record: Mapping[str, Any]) -> None:
    fd = os.open(run_dir / RECORD, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(record, f, default=str)


def _read_record(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((run_dir / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("pid"), int) else None


class _Handle:
    """A background run, as this process (its child) or only its record (another process started it) knows it."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.child = _children.get(_key(run_dir))
        self.record = _read_record(run_dir)
        self.pid = self.child.proc.pid if self.child else self.record["pid"] if self.record else None
        facts: Mapping[str, Any] = self.record or {}
        self.limit_s = self.child.limit_s if self.child else float(facts.get("limit_s", GRACE_S))
        self.started = self.child.started if self.child else float(facts.get("started_at", 0.0))

    def running(self) -> bool:
        if self.child is not None:
            return self.child.proc.poll() is None
        if self.record is None:
            return False
        start = _proc_start_time(self.record["pid"])
        return start is not None and start == self.record.get("start_time")

    def wait_gone(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.running():
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
        return True

    def exit_code(self) -> int | None:
        if self.child is not None and self.child.proc.returncode is not None:
            return self.child.proc.returncode
        report = read_report(self.run_dir)
        code = report.get("exit_code") if report else None
        return code if isinstance(code, int) else None


def wait_run_dir(run_dir: Path, timeout_s: float | None) -> dict[str, Any]:
    handle = _Handle(run_dir)
    if handle.pid is None:
        code = handle.exit_code()
        if code is None:
            raise ActivityFailed(f"{run_dir}: no streamchaos run was started there, and it holds no report.json")
        return outcome(run_dir, code, "")
    if timeout_s is None:  # what is left of the run's own bound
        timeout_s = max(0.0, handle.limit_s - (time.time() - handle.started))
    if not handle.wait_gone(timeout_s):
        raise ActivityFailed(f"streamchaos run {run_dir} (pid {handle.pid}) still runs after {timeout_s:g}s; "
                             "stop_run ends it")
    tail = handle.child.tail() if handle.child else ""
    if handle.child is not None:
        forget(handle.child)
    code = handle.exit_code()
    if code is None:
        raise ActivityFailed(f"streamchaos run {run_dir} ended without a report.json\n{tail}")
    return outcome(run_dir, code, tail)


def stop_child(run_dir: Path, timeout_s: float) -> dict[str, Any]:
    """One SIGTERM to the run, if it still runs and none was sent; wait ``timeout_s`` for it to revert its
    faults and end; SIGKILL past that, and ``streamchaos rollback`` on its journal. Idempotent."""
    handle = _Handle(run_dir)
    signalled = killed = False
    rollback: int | None = None
    if handle.pid is not None and handle.running():
        already = handle.child.terminated if handle.child else bool(handle.record and handle.record.get("terminated"))
        if not already:
            os.kill(handle.pid, signal.SIGTERM)
            signalled = True
            if handle.child is not None:
                handle.child.terminated = True
            if handle.record is not None:
                _write_record(run_dir, {**handle.record, "terminated": time.time()})
        if not handle.wait_gone(timeout_s):
            logger.warning("streamchaos run %s (pid %d) still ran %gs after SIGTERM: killing it", run_dir,
                           handle.pid, timeout_s)
            os.kill(handle.pid, signal.SIGKILL)
            killed = True
            handle.wait_gone(10.0)
            rollback = _rollback(run_dir)
    if handle.child is not None:
        handle.child.proc.wait(10)
        forget(handle.child)
    result = summary(run_dir, handle.exit_code(), read_report(run_dir))
    return {**result, "pid": handle.pid, "stopped": signalled, "killed": killed,
            **({"rollback_exit_code": rollback} if killed else {})}


def _rollback(run_dir: Path) -> int | None:
    """``streamchaos rollback RUN_DIR``: what a killed run could not revert itself, undone from its journal."""
    try:
        done = subprocess.run([sys.executable, "-P", "-m", "chaos", "rollback", str(run_dir)], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=STOP_WAIT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.error("streamchaos rollback %s did not finish: %s", run_dir, exc)
        return None
    if done.returncode != 0:
        logger.error("streamchaos rollback %s exited %d: %s", run_dir, done.returncode,
                     done.stdout.decode(errors="replace")[-2000:])
    return done.returncode


def generated_experiment(name: str, target_url: str | None, load: Mapping[str, Any] | None,
                         phases: list[dict[str, Any]], sla: list[Any] | None) -> dict[str, Any]:
    """An experiment from an activity's arguments: against ``target_url`` (an OpenAI-compatible server),
    else a builtin stack the run starts itself; its ``safety.max_duration`` the phases' length and a minute."""
    try:
        total = sum(parse_duration(phase["duration"]) for phase in phases)
    except UnitError as exc:
        raise ActivityFailed(f"duration: {exc}") from None
    return {
        "name": name,
        "description": "generated by chaostoolkit-streamchaos",
        "target": {"kind": "openai"} if target_url else {"kind": "builtin", "model": "tiny"},
        "load": {"concurrency": 4, "max_tokens": 64, **(load or {})},
        "phases": phases,
        "sla": DEFAULT_SLA if sla is None else list(sla),
        "safety": {"max_duration": f"{total + 60:g}s"},
    }
