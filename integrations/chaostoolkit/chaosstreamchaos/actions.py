"""Actions: run a streamchaos experiment, or start one in the background and stop it.

Every run is a ``streamchaos run`` child process writing its own run directory; the activities take
and return that directory (``run_dir``), and the probes (``chaosstreamchaos.probes``) read its
``report.json``. Give a later activity the same directory through the Chaos Toolkit's configuration:
``"out_dir": "${run_dir}"`` here and ``"run_dir": "${run_dir}"`` in the probe.

Each call is bounded: ``run_experiment`` and ``wait_run`` by the experiment's ``safety.max_duration``
and two minutes (or ``timeout_s``), ``start_load`` and ``inject_fault`` by ``ready_timeout_s``,
``stop_run`` by ``timeout_s``. A background run ends on ``stop_run`` (one SIGTERM: the runner reverts
every fault), at its own ``safety.max_duration``, or when the Chaos Toolkit process that started it
is gone.
"""

# No `from __future__ import annotations` here: the Chaos Toolkit's discovery reads each parameter's
# annotation as a type object (chaoslib.discovery.portable_type_name), and typing.Dict / typing.List
# are the spellings it names ("mapping", "list"); a string annotation would read as "object".
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml
from chaoslib.exceptions import ActivityFailed
from chaoslib.types import Configuration, Secrets

from chaos.model.units import UnitError, parse_duration
from chaosstreamchaos import _runs

__all__ = ["inject_fault", "run_experiment", "start_load", "stop_run", "wait_run"]


def run_experiment(path: str, target_url: Optional[str] = None, out_dir: Optional[str] = None,
                   timeout_s: Optional[float] = None, configuration: Configuration = None,
                   secrets: Secrets = None) -> Dict[str, Any]:
    """Run the streamchaos experiment at ``path`` to its end (``streamchaos run PATH --out OUT_DIR``).

    :param path: the experiment YAML file
    :param target_url: run against this OpenAI-compatible server instead of the experiment's target
    :param out_dir: the run directory, absent or empty (default: a new one under the temporary directory);
        give the probes the same directory
    :param timeout_s: the most the run may take (default: its ``safety.max_duration`` and two minutes);
        past it the run is stopped and the action fails
    :param secrets: ``api_key``: the target's API key (handed to the run in its environment)
    :returns: ``{"exit_code", "status", "run_dir", "run_status", "verdicts"}``: ``status`` is ``pass`` (0),
        ``fail`` (1) or ``inconclusive`` (3); ``run_status`` how the run ended (report.json's ``status``,
        ``completed`` here); each verdict ``{sla, name, phase, status, figure, budget, unit, samples,
        expect, ok}`` (and ``reason`` where the verifier gave one). An SLA that failed or could not be
        decided does not fail the action: the probes and their tolerances judge the verdicts.
    :raises ActivityFailed: the experiment is invalid (exit 2) or the run could not be carried out (4)
    """
    experiment = Path(path).expanduser()
    run_dir = _runs.run_dir_for(out_dir)
    limit = timeout_s if timeout_s is not None else _runs.time_limit(experiment)
    child = _runs.start_child(experiment, run_dir, target_url, secrets, limit)
    code = _runs.wait_child(child, limit)
    tail = child.tail()
    _runs.forget(child)
    return _runs.outcome(run_dir, code, tail)


def start_load(target_url: Optional[str] = None, out_dir: Optional[str] = None, duration: str = "60s",
               load: Optional[Dict[str, Any]] = None, sla: Optional[List[Any]] = None, path: Optional[str] = None,
               ready_timeout_s: float = 120.0, configuration: Configuration = None,
               secrets: Secrets = None) -> Dict[str, Any]:
    """Start streaming load in the background: a run of one phase, ``load``, of ``duration`` and no fault
    (or the experiment at ``path``, as it is), and return once its first phase has begun.

    :param target_url: the OpenAI-compatible server to load (default: a builtin stack the run starts)
    :param out_dir: the run directory, absent or empty (default: a new one under the temporary directory)
    :param duration: how long the load lasts, e.g. ``"60s"``; ``stop_run`` ends it sooner
    :param load: the experiment's ``load:`` section (default ``{"concurrency": 4, "max_tokens": 64}``,
        merged under what is given)
    :param sla: the experiment's ``sla:`` list (default: ``errors`` 0%)
    :param path: run this experiment file instead of one made from the arguments above
    :param ready_timeout_s: the most to wait for the first phase to begin (the target's start included)
    :param secrets: ``api_key``: the target's API key
    :returns: ``{"run_dir", "pid", "running": true}``; a run that ended before its load was seen running
        returns as ``run_experiment`` does, with ``"running": false``
    :raises ActivityFailed: the experiment is invalid (2), the run could not be carried out (4), or no
        phase began within ``ready_timeout_s`` (the run is stopped)
    """
    if path is not None:
        return _start(Path(path).expanduser(), None, target_url, out_dir, ready_timeout_s, secrets)
    experiment = _runs.generated_experiment("ctk-load", target_url, load, [{"name": "load", "duration": duration}], sla)
    return _start(None, experiment, target_url, out_dir, ready_timeout_s, secrets)


def inject_fault(fault: Dict[str, Any], duration: str = "10s", baseline: str = "5s", recovery: str = "5s",
                 target_url: Optional[str] = None, out_dir: Optional[str] = None,
                 load: Optional[Dict[str, Any]] = None, sla: Optional[List[Any]] = None,
                 ready_timeout_s: float = 120.0, configuration: Configuration = None,
                 secrets: Secrets = None) -> Dict[str, Any]:
    """Inject one fault in the background: a run of its own load with phases ``baseline`` (no fault),
    ``fault`` (the fault in force for ``duration``, then reverted) and ``recovery``; returns once the
    baseline has begun.

    The fault acts as it does in any streamchaos run: a client or stream fault on this run's own streams,
    a network fault on its own path to the target, a server or KV fault (``server.*``, ``kv.*``: a builtin
    stack's admin API) on the target itself, so on every other client's streams too, a ``start_load``
    run's among them.

    :param fault: ``{"kind": ..., **parameters}``, as in an experiment's ``faults:`` list
        (``streamchaos list faults``)
    :param duration: how long the fault is in force
    :param baseline: the phase before it (``"0s"``: none)
    :param recovery: the phase after it (``"0s"``: none)
    :param target_url: the OpenAI-compatible server (default: a builtin stack the run starts)
    :param out_dir: the run directory, absent or empty (default: a new one under the temporary directory)
    :param load: the experiment's ``load:`` section (default ``{"concurrency": 4, "max_tokens": 64}``)
    :param sla: the experiment's ``sla:`` list (default: ``errors`` 0%)
    :param ready_timeout_s: the most to wait for the first phase to begin
    :param secrets: ``api_key``: the target's API key
    :returns: ``{"run_dir", "pid", "running": true}`` (as ``start_load``)
    :raises ActivityFailed: as ``start_load``
    """
    if not isinstance(fault, dict) or not isinstance(fault.get("kind"), str):
        raise ActivityFailed(f"fault: a mapping with a kind, e.g. {{'kind': 'server.stall', ...}}; got {fault!r}")
    phases: List[Dict[str, Any]] = [{"name": "baseline", "duration": baseline},
              {"name": "fault", "duration": duration, "faults": [fault]},
              {"name": "recovery", "duration": recovery}]
    try:
        phases = [p for p in phases if p is phases[1] or parse_duration(p["duration"]) > 0]
    except UnitError as exc:
        raise ActivityFailed(f"duration: {exc}") from None
    name = "ctk-fault-" + fault["kind"].replace(".", "-").replace("_", "-")
    experiment = _runs.generated_experiment(name, target_url, load, phases, sla)
    return _start(None, experiment, target_url, out_dir, ready_timeout_s, secrets)


def wait_run(run_dir: str, timeout_s: Optional[float] = None) -> Dict[str, Any]:
    """Wait for a background run to end on its own (its phases done, its verdicts written).

    :param run_dir: what ``start_load`` or ``inject_fault`` returned as ``run_dir``
    :param timeout_s: the most to wait (default: what is left of the run's ``safety.max_duration`` and
        two minutes); past it the action fails and the run goes on (``stop_run`` ends it)
    :returns: as ``run_experiment``
    :raises ActivityFailed: as ``run_experiment``, or the run still runs after ``timeout_s``
    """
    return _runs.wait_run_dir(Path(run_dir).expanduser().absolute(), timeout_s)


def stop_run(run_dir: str, timeout_s: float = 60.0) -> Dict[str, Any]:
    """End a background run, for a rollback: one SIGTERM (the runner reverts every fault, judges what it
    saw and writes its report), then wait up to ``timeout_s``; past that SIGKILL, and ``streamchaos
    rollback RUN_DIR`` undoes what the journal says is still in force. Idempotent: a run that already
    ended, was stopped before, or never started is left as it is.

    :param run_dir: what ``start_load`` or ``inject_fault`` returned as ``run_dir``
    :param timeout_s: how long the run may take to revert and end after SIGTERM
    :returns: ``{"exit_code", "status", "run_dir", "run_status", "verdicts", "pid", "stopped", "killed"}``:
        ``stopped`` true when this call sent the SIGTERM; a run stopped so ends ``interrupted``, exit code 4
        (``status`` ``error``), no verdicts; one that had ended on its own as it ended; ``exit_code`` null
        where no report was written
    """
    return _runs.stop_child(Path(run_dir).expanduser().absolute(), timeout_s)


def _start(path: Optional[Path], experiment: Optional[Dict[str, Any]], target_url: Optional[str],
           out_dir: Optional[str], ready_timeout_s: float, secrets: Secrets) -> Dict[str, Any]:
    run_dir = _runs.run_dir_for(out_dir)
    written: Optional[str] = None
    if path is None:
        fd, written = tempfile.mkstemp(prefix="streamchaos-ctk-", suffix=".yaml")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yaml.safe_dump(experiment, f, sort_keys=False)
        path = Path(written)
    try:
        limit = _runs.time_limit(experiment if experiment is not None else path)
        child = _runs.start_child(path, run_dir, target_url, secrets, limit)
        return _runs.wait_for_load(child, ready_timeout_s)
    finally:
        if written is not None:  # read by now: the run began a phase, or ended
            os.unlink(written)
