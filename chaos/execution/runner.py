"""The experiment runner: target → proxy → load → scraper, faults on the phase timeline, verdicts.

A run is a stack of resources, each an async context manager that undoes itself on every exit
path — normal end, exception, SIGINT/SIGTERM, timeout — newest first: target, proxy, load driver,
watchdog (when a fault outlives the process), metric scraper, GPU telemetry; inside them each
phase is ``async with`` its faults, so a phase's faults are reverted when the phase ends however it
ends. Everything that happens is a run event (``chaos.execution.events``); the journal, the console, the
report writer and the pytest plugin are listeners. Each plan, inject and revert is journaled (plans
and reverts fsync'd) before and after the change, so ``streamchaos rollback RUN_DIR`` can undo what
a killed run left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import traceback
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos.execution.coverage import fault_times, shortfalls
from chaos.execution.credentials import Credentials
from chaos.execution.credentials import resolve as resolve_credentials
from chaos.execution.deadline import START_GRACE_S, RunDeadline
from chaos.execution.events import EventBus, RunFinished, RunListener, RunStarted, Stage, VerdictsReady
from chaos.execution.halt import HaltWatcher
from chaos.execution.journal import JOURNAL_NAME, Journal, prepare_run_dir
from chaos.execution.path import start_allowance_s
from chaos.execution.preflight import EngineFindings, learn_engine
from chaos.execution.result import Result, exit_code_for  # re-exported: the run's result is a leaf
from chaos.execution.sequential import LookState, run_looks
from chaos.execution.telemetry import gpu_telemetry
from chaos.execution.watchdog import WatchdogHandle, watchdog
from chaos.host.contention import host_contention
from chaos.host.hostinfo import environment_facts
from chaos.host.redact import redact, strip_userinfo
from chaos.host.runfiles import open_append, release_dir, write_new
from chaos.host.tls import trusted
from chaos.load import LoadDriver, LoadTarget, running_load
from chaos.model.allowlist import credentials_allowed, enforce_cluster
from chaos.model.allowlist import enforce as enforce_allowed_targets
from chaos.model.context import ClientPolicy, HopInfo, ProxyInfo, Reach, RunContext, TargetInfo
from chaos.model.errors import ChaosError, FaultError, FaultRevertFailed
from chaos.model.experiment import Experiment, LoadSpec, PhaseSpec
from chaos.model.observations import FaultEvent, Note, PhaseWindow
from chaos.model.request_ids import run_tag
from chaos.model.trace_ids import trace_id_of
from chaos.model.verdict import Verdict
from chaos.targets.base import BuiltinStack, Target, target_facts
from chaos.targets.registry import start_target, started, target_class
from faults.base import Injection

__all__ = ["Result", "Runner", "exit_code_for"]

STOP_REDELIVERY_S = 1.0  # a stop (signal, halt) is cancelled into the run again this often until teardown
FORCE_GRACE_S = 5.0  # after a forcing signal, teardown's steps still running are cut one a second, this long
FORCE_CUT_EVERY_S = 0.1  # past that grace, each step still to come is cut this soon after it begins
FORCE_CUTS_MAX = 50  # ... this many times at most (a step that swallows cancellations is left)
BASELINE_MIN_S = 0.5  # metrics scraped before the load starts

if TYPE_CHECKING:
    from chaos.fleet.stop_when import StopWhenWatch


class ForcedExit(ChaosError):
    """A second SIGINT/SIGTERM forced the exit during teardown (after the faults were reverted)."""

    exit_code = 4


@dataclass
class _Outcome:
    status: str = "completed"
    exit_code: int = 0
    error: str | None = None


def default_out_dir(name: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name) or "run"
    return Path("runs") / f"{stamp}-{safe}-{os.getpid()}"


class Runner:
    """Runs one experiment once. Use ``await Runner(exp).run()`` or the ``run``/``run_async`` helpers."""

    def __init__(
        self,
        experiment: Experiment,
        *,
        target_url: str | None = None,
        out_dir: str | Path | None = None,
        listeners: Sequence[RunListener] = (),
        handle_signals: bool = True,
        api_key_env: str | None = None,
        traceparent: bool = False,
    ) -> None:
        self.experiment = experiment
        # each load request sends a W3C traceparent under the run's trace (chaos.model.trace_ids; ``--otlp``)
        self.traceparent = traceparent
        self.target_url = target_url
        self.api_key_env = api_key_env  # --api-key-env: the variable holding the target's API key
        self.out_dir = Path(out_dir) if out_dir else default_out_dir(experiment.name)
        self.listeners = list(listeners)
        self.handle_signals = handle_signals
        self.interrupted: str | None = None  # the signal that interrupted the run (``interrupt``)
        self.signals: list[str] = []  # every SIGINT/SIGTERM the run heard, in order
        self.forced: str | None = None  # the signal that forced the exit (the second one)
        self._forcing: asyncio.Event | None = None  # set when teardown is to stop waiting (``_force_exit``)
        self._installed: list[signal.Signals] = []  # the signal handlers the run holds
        self.halted: str | None = None  # why a safety condition stopped the run early (``halt``)
        self._main_task: asyncio.Task[Any] | None = None
        self.cleaning = False  # past the work: a signal is noted, not acted on
        self.revert_errors: list[str] = []
        self.fault_failure: ChaosError | None = None  # a fault that could not act (at inject, or its scheduled action)
        self.completed_phases: list[str] = []  # phases that ran to their end: judged even when a later one failed
        self.events = EventBus()
        self.target: Target | None = None
        self.proxy: ProxyInfo | None = None
        self.hops: tuple[HopInfo, ...] = ()  # the path as started, load side first
        self.load: LoadDriver | None = None
        self.journal: Journal | None = None
        self.injections: dict[str, Injection] = {}
        self.watchdogs: list[WatchdogHandle] = []
        self._deadline: asyncio.Timeout | None = None
        self._clock: RunDeadline | None = None  # the deadline's stages: start-up, then max_duration from ready
        # the load while it sends until the run's hard stop (before the last phase sets its real end): a
        # restart's pause moves that stop, and the load with it (``_follow_hard_stop``)
        self._load_on_hard_stop: LoadDriver | None = None
        self.credentials = Credentials()
        self._withheld_noted = False
        self._stop_when: StopWhenWatch | None = None  # safety.stop_when's reads (chaos.fleet.stop_when)

    # -- the run -----------------------------------------------------------------------------
    async def run(self) -> Result:
        exp = self.experiment
        spec = exp.target
        # before anything is touched: a named variable or file that is missing is a usage error (exit 2)
        self.credentials = resolve_credentials(spec.api_key, spec.api_key_env, spec.metrics_auth,
                                               cli_api_key_env=self.api_key_env)
        prepare_run_dir(self.out_dir)
        try:
            return await self._run_in_dir()
        finally:  # the run's last file is written (a report writer's too, on RunFinished): let the directory go
            release_dir(self.out_dir)

    async def _run_in_dir(self) -> Result:
        """The run, once its directory is taken (``prepare_run_dir``)."""
        exp = self.experiment
        save_experiment(exp, self.out_dir)
        t0, started = time.monotonic_ns(), time.time()
        journal = self.journal = Journal(self.out_dir / JOURNAL_NAME, exp.name, t0, started)
        self.events = EventBus([journal, *self.listeners])
        # last, so a stream has reached every other listener before a condition may halt the run
        self.halt_watcher = HaltWatcher(exp.safety, self.halt, self.events.emit)
        self.events.subscribe(self.halt_watcher)
        self.events.emit(RunStarted(exp.name, str(self.out_dir), t0, started,
                                    tuple((p.name, p.duration) for p in exp.phases),
                                    tuple((p.name, p.max_duration) for p in exp.phases if p.max_duration is not None)))
        self._note("environment", environment_facts())  # versions and host, for the report
        outcome = await self._attempt()
        lag = self.load.lag_stats() if self.load is not None else {}
        if self.load is not None and lag:  # per phase, the open loop's own send delay (empty in closed loop)
            lag["send_delay"] = self.load.send_delay_stats()
        if lag:
            self._note("client_lag", lag)
        if self.load is not None:  # where the load ran: its processes, their event loop, the uplink's backlog
            self._note("load_process", self.load.stats())
        verdicts: list[Verdict] = []
        if outcome.status == "completed":
            from chaos.execution.verify import judge_all

            verdicts = judge_all(exp, journal.observations, client_lag=lag)
            outcome.exit_code = exit_code_for(verdicts)
        elif self.fault_failure is not None and self.completed_phases:
            from chaos.execution.verify import judge_all

            # a fault failed where it acted: the phases before it ran as planned and keep their verdicts
            # (the run still ends with the fault's error, exit 4; entries over the whole run are not judged)
            verdicts = judge_all(exp, journal.observations, client_lag=lag, phases=self.completed_phases)
        outcome = self._covered(outcome)
        self.events.emit(VerdictsReady(tuple(verdicts)))
        journal.close(outcome.status)
        for handle in self.watchdogs:
            handle.wait_stood_down()
        result = Result(
            experiment=exp, verdicts=verdicts, observations=journal.observations, out_dir=self.out_dir,
            status=outcome.status, exit_code=outcome.exit_code, started=started, ended=time.time(),
            target=self.target.info if self.target else None, proxy=self.proxy, client_lag=lag, error=outcome.error,
        )
        self.events.emit(RunFinished(result))
        return result

    async def _attempt(self) -> _Outcome:
        """Carry the run out and classify how it ended; every resource is released by then."""
        main_task = self._main_task = asyncio.current_task()
        assert main_task is not None
        self._forcing = asyncio.Event()  # a forcing signal comes through the handlers installed below
        try:
            with self._signals():
                if self._stopped() is None:  # a stop that came before the run had a task to cancel
                    await self._execute()
            outcome = _Outcome()
        except asyncio.CancelledError:
            if self._stopped() is None and self.fault_failure is None:
                raise
            outcome = _Outcome()
        except Exception as exc:  # noqa: BLE001 - every failure is classified, recorded and reported
            outcome = self._failure(exc)
        # a scheduled action's
        if self.fault_failure is not None and self._stopped() is None and outcome.status == "completed":
            while main_task.cancelling():
                main_task.uncancel()
            outcome = self._failure(self.fault_failure)
        stopped = self._stopped()
        if stopped is not None:
            while main_task.cancelling():  # the stop was ours to deliver, and it is handled
                main_task.uncancel()
            status, why = stopped
            outcome = _Outcome(status, 4, why if outcome.status == "completed" else f"{why}; then: {outcome.error}")
        if self.revert_errors and outcome.exit_code == 0:
            outcome = _Outcome("failed", 4, "; ".join(self.revert_errors))
        return outcome

    def halt(self, reason: str) -> bool:
        """Stop the run early because a safety condition tripped: revert, tear down, end ``halted``.

        For run listeners that watch the run (halt conditions); safe to call more than once. False when
        it came too late to act (the run already stopping, or in teardown): a watcher then records no halt.
        """
        if self.cleaning or self._stopped() is not None:
            return False
        self.halted = reason
        self._stage("halt", f"halting: {reason}")
        self._stop_work()
        return True

    def interrupt(self, name: str) -> None:
        """Stop the run as a signal would (``interrupted``); for a caller that owns the signal itself
        (the pytest plugin, where pytest owns SIGINT). Call it in the run's loop; safe more than once.

        A second one forces the exit (``_force_exit``): once the faults are reverted, teardown is not
        waited for beyond ``FORCE_GRACE_S``; what it leaves is journaled for ``streamchaos rollback``."""
        self.signals.append(name)
        if self.cleaning or self._stopped() is not None:
            if len(self.signals) >= 2:
                self._force_exit(name)
            else:
                self._stage("signal", f"{name}: already reverting and stopping (a second signal forces the exit)")
            return
        self.interrupted = name
        self._stage("signal", f"{name}: reverting faults and stopping")
        self._stop_work()

    def _force_exit(self, name: str) -> None:
        """The exit forced: at once in teardown, else when the faults are reverted and teardown begins.
        The run's signal handlers are given back, so a further signal acts as it would without the run."""
        if self.forced is not None:
            self._stage("signal", f"{name}: already forcing the exit")
            return
        self.forced = name
        self.interrupted = self.interrupted or self.signals[0]
        self._release_signals()
        when = "now" if self.cleaning else "once the faults are reverted"
        self._stage("signal", f"{name}: forcing the exit {when}: teardown gets {FORCE_GRACE_S:g}s, what it leaves is "
                              "journaled for `streamchaos rollback`")
        if self._forcing is not None:
            self._forcing.set()

    def _stop_work(self) -> None:
        """Cancel the run's work, and cancel it again each second until its teardown has begun.

        Once is not always enough on Python 3.11: a cancellation that arrives as an awaited call
        completes inside ``asyncio.wait_for`` (ours or a library's) is lost, and the run would go on
        to the end of its phase. A repeat lands in unwinding code at worst, which finishes every
        inject and revert it started (``_finish``) before passing the cancellation on.
        """
        task = self._main_task
        if task is None or task.done() or self.cleaning:
            return
        task.cancel()
        asyncio.get_running_loop().call_later(STOP_REDELIVERY_S, self._stop_work)

    def _stopped(self) -> tuple[str, str] | None:
        """``(status, why)`` when a signal or a halt condition stopped the run, else None."""
        if self.interrupted is not None:
            return "interrupted", f"interrupted by {self.interrupted}"
        if self.halted is not None:
            return "halted", f"halted: {self.halted}"
        return None

    def _covered(self, outcome: _Outcome) -> _Outcome:
        """A fault in force for less than ``safety.min_fault_coverage`` of its planned time is a run
        error (exit 4), whatever the verdicts said (they are kept); it adds to an error already there."""
        assert self.journal is not None
        exp = self.experiment
        short = shortfalls(fault_times(self.journal.observations, {p.name: p.duration for p in exp.phases}),
                           exp.safety.min_fault_coverage)
        if not short:
            return outcome
        why = "; ".join(short)
        self._note("fault_coverage", {"shortfalls": short, "min_fault_coverage": exp.safety.min_fault_coverage})
        if outcome.error is None:
            return _Outcome("failed", 4, why)
        return _Outcome(outcome.status, 4, f"{outcome.error}; {why}")

    def _failure(self, exc: Exception) -> _Outcome:
        """How a run that raised ``exc`` ended: a timeout, one of ours (its exit code), or a bug (traceback kept)."""
        if isinstance(exc, TimeoutError):
            if self._deadline is not None and self._deadline.expired() and self._clock is not None:
                return _Outcome("failed", 4, self._clock.exceeded())  # which bound: start-up or max_duration
            return _Outcome("failed", 4, f"a step of the run timed out: {exc!r}")
        if isinstance(exc, ChaosError):
            self._note("run_error", {"error": str(exc), "type": type(exc).__name__})
            return _Outcome("failed", exc.exit_code, str(exc))
        # a bug of ours or of a library: still reverted, recorded and reported
        with open_append(self.out_dir / "runner-error.txt", binary=False) as f:
            f.write(redact(traceback.format_exc()))
        error = f"internal error {type(exc).__name__}: {exc} (traceback in runner-error.txt)"
        self._note("run_error", {"error": error, "type": type(exc).__name__})
        return _Outcome("failed", 4, error)

    async def _execute(self) -> None:
        """The resources, nested; teardown (outside the deadline) is their exits, newest first."""
        exp = self.experiment
        resources = contextlib.AsyncExitStack()
        try:
            # start-up time is the target's own (vLLM's: up to 5 min), bounded by the allowance its
            # kind really grants; safety.max_duration counts from when it is ready (``_bring_up``)
            async with asyncio.timeout(None) as self._deadline:
                self._clock = RunDeadline(self._deadline, exp.safety.max_duration)
                self._clock.start_up(self._startup_allowance_s())
                ctx = await self._bring_up(resources)
                await self._drive(ctx)
        except BaseException as exc:  # noqa: BLE001 - handed to teardown as `async with` would, then re-raised
            if not await self._teardown(resources, exc):
                raise
        else:
            await self._teardown(resources, None)

    async def _teardown(self, resources: contextlib.AsyncExitStack, exc: BaseException | None) -> bool:
        """The resources' exits, newest first, as ``async with`` runs them (True: they suppressed ``exc``).

        The phases' faults are reverted by now. Teardown runs to its end (a cancellation meanwhile is
        passed on after it) unless a second signal forces the exit (``_force_exit``): then the step
        holding it is cut, the others get ``FORCE_GRACE_S``, then each still to come is cut too (``_cut``),
        and what is still up is journaled (``ForcedExit``)."""
        self.cleaning = True
        self._stage("teardown", "stopping load, proxy and target")
        assert self._forcing is not None
        exits = asyncio.ensure_future(resources.__aexit__(type(exc) if exc else None, exc,
                                                          exc.__traceback__ if exc else None))
        forcing = asyncio.ensure_future(self._forcing.wait())
        cancelled = False
        try:
            while not exits.done() and not forcing.done():
                try:
                    await asyncio.wait({exits, forcing}, return_when=asyncio.FIRST_COMPLETED)
                except asyncio.CancelledError:
                    cancelled = True  # teardown is finished, not abandoned, on a cancellation
        finally:
            forcing.cancel()
        if not exits.done():
            await _cut(exits, FORCE_GRACE_S)
            raise ForcedExit(self._left_behind(exits.done()))
        if cancelled:
            raise asyncio.CancelledError
        return bool(exits.result())

    def _left_behind(self, teardown_done: bool) -> str:
        """What a forced exit leaves: faults not reverted and resources not released, as the journal has
        them (``streamchaos rollback`` acts on exactly these); noted, and said in one line."""
        from chaos.execution.rollback import outstanding, outstanding_resources
        from chaos.model.observations import iter_journal

        assert self.journal is not None
        lines = list(iter_journal(self.journal.path))
        faults = [item["fault"] for item in outstanding(lines)]
        resources = [f"{item['kind']} {item['name']}" for item in outstanding_resources(lines)]
        self._note("forced_exit", {"signal": self.forced, "teardown_finished": teardown_done,
                                   "faults_not_reverted": faults, "resources_left": resources,
                                   "rollback": f"streamchaos rollback {self.out_dir}"})
        left = faults + resources
        where = (f"left {', '.join(left)}: run `streamchaos rollback {self.out_dir}`" if left
                 else "the journal names nothing left behind")
        return f"the exit was forced by a second signal ({self.forced}) during teardown; {where}"

    async def _bring_up(self, resources: contextlib.AsyncExitStack) -> RunContext:
        """Target, path (its hops, Toxiproxy among them), load, watchdog, scraper, telemetry; the faults
        activated (checked) against them.

        Each step enters its resource into ``resources`` in this order, so teardown undoes them
        newest first: telemetry, the scraper and the watchdog stop before the load, the load before
        the path (and its taps are journaled) and the path before the target.
        """
        self._check_allowed()
        await self._obey_fleet(resources)
        self._raise_open_files()
        target = await self._start_target(resources)
        assert self._clock is not None
        self._clock.ready()  # safety.max_duration counts from here
        found = await self._learn_engine(target)
        with self._clock.paused("path", start_allowance_s(self.experiment)):  # the path's start is not counted
            load_url = await self._start_path(resources, target)
        ctx = self._context(target)
        await self._start_load(resources, ctx, found, load_url)
        self._activate_faults(ctx)
        await self._start_watchdog(resources, target)
        await self._start_observers(resources, target, found)
        return ctx

    async def _obey_fleet(self, resources: contextlib.AsyncExitStack) -> None:
        """The fleet lever and ``safety.stop_when``, before anything is started: an engaged lever or a
        halting alert refuses the run (``RunRefused``, exit 4), a signal that cannot be read refuses it
        too; then both are watched until teardown, and either halts the run (``chaos.fleet``)."""
        from chaos.fleet.lever import refuse_if_engaged, watching_lever

        safety, emit = self.experiment.safety, self.events.emit
        levers = await refuse_if_engaged(safety.lever)
        self._note("lever", {"checked": [lever.where for lever in levers], "every_s": safety.lever.every})
        await resources.enter_async_context(watching_lever(safety.lever, self.halt, emit))
        if not safety.stop_when:
            return
        from chaos.fleet.stop_when import refuse_if_firing, tokens, watching_stop_when

        self._stage("fleet", "reading the fleet's stop signals: " + ", ".join(
            f"{s.name} ({s.url})" for s in safety.stop_when))
        toks = tokens(safety.stop_when)
        already = await refuse_if_firing(safety.stop_when, toks, emit)
        self._stop_when = await resources.enter_async_context(
            watching_stop_when(safety.stop_when, toks, self.halt, emit, already))

    def _raise_open_files(self) -> None:
        """The open-file limit the load needs, before the target, proxy and load processes start
        (they inherit it); a hard limit too low is a setup failure naming what to change."""
        from chaos.host.fd_limit import ensure_open_files, open_files_needed
        from chaos.load.generator import DEFAULT_INFLIGHT_CAP
        from chaos.load.workload import streams_at_most

        exp = self.experiment
        extra = max((sum(f.streams_opened() for f in phase.faults) for phase in exp.phases), default=0)
        limit = ensure_open_files(open_files_needed(streams_at_most(exp.load, DEFAULT_INFLIGHT_CAP) + extra))
        if limit.raised:
            self._note("open_files", limit.to_dict())

    def _check_allowed(self) -> None:
        """The blast-radius limit, before anything is started or contacted (TargetNotAllowed, exit 2)."""
        checked = enforce_allowed_targets(self.experiment, target_url=self.target_url)
        if checked:
            self._note("allowed_targets", {"checked": [_reach_facts(r) for r in checked]})

    async def _start_target(self, resources: contextlib.AsyncExitStack) -> Target:
        """The system under test, started or reached; a Kubernetes target's pods checked once resolved."""
        exp, creds = self.experiment, self.credentials
        remote = self.target_url or exp.target.url
        self._stage("target",
                    f"reaching target {remote} (remote)" if remote else f"starting target ({exp.target.kind})")
        target_spec = replace(exp.target, api_key=creds.api_key)  # the resolved key, never written anywhere
        assert self.journal is not None
        made = start_target(target_spec, target_url=self.target_url, run_dir=self.out_dir, seed=exp.seed,
                            run_id=self.journal.run_id, record=self.journal.resource, gate=_cluster_gate(exp))
        if made.outlives_runner:
            # guarded from the moment it exists: a runner killed while its container starts (up to
            # startup_timeout) leaves a journaled container that this watchdog removes
            await self._guard(resources, made, urls=(), token=None)
        target = self.target = await resources.enter_async_context(started(made))
        self._note("target", {**target_facts(target.info), "credentials": creds.describe()})
        if target.info.cluster is not None:  # the namespace and pods a Kubernetes target resolved to: allowed?
            self._note("allowed_targets",
                       {"cluster": [_reach_facts(r) for r in enforce_cluster(exp, target.info.cluster)]})
        return target

    async def _learn_engine(self, target: Target) -> EngineFindings:
        """The engine's profile and the load's request sent once (the preflight), timed as the warm-up."""
        exp, info = self.experiment, target.info
        self._stage("preflight", "detecting the engine and sending the load's request once")
        started = time.monotonic()
        found = await learn_engine(
            exp.load, base_url=info.base_url, metrics_url=info.metrics_url, model=self._model(info), seed=exp.seed,
            api_key=self.credentials.api_key, metrics_headers=self._metrics_headers(info.metrics_url),
            engine=exp.target.engine, started_builtin=isinstance(target, BuiltinStack),
            run=run_tag(exp.seed, self._run_id()))  # the preflight's id carries the run's tag too
        self._note("engine_profile", found.note())
        self._note("preflight", found.preflight.facts())
        self._note("warmup", {"status": found.preflight.record.status, "seconds": round(time.monotonic() - started, 4)})
        return found

    async def _start_path(self, resources: contextlib.AsyncExitStack, target: Target) -> str:
        """The hops between load and target (``path:``; the old ``proxy:`` is a path of one toxiproxy hop),
        started from the target outward; the base URL the load sends to."""
        exp = self.experiment
        if not exp.path:
            return target.info.base_url
        from chaos.execution.path import running_path
        from chaos.execution.proxy import RunOwner

        only_proxy = [h.kind for h in exp.path] == ["toxiproxy"]
        self._stage("proxy" if only_proxy else "path", "starting Toxiproxy" if only_proxy else
                    "starting the path: " + " -> ".join(f"{h.name} ({h.kind})" for h in exp.path) + " -> target")
        assert self.journal is not None
        # a container's labels and journal
        owner = RunOwner(run_id=self._run_id(), run_dir=self.out_dir, record=self.journal.resource)
        processes = any(h.kind not in ("toxiproxy", "url") for h in exp.path)
        if (processes or (exp.proxy.enabled and exp.proxy.server == "docker")) and not self.watchdogs:
            # guarded before they exist: a hop process (journaled as it starts) or a Toxiproxy container
            # (journaled before it is created) that a killed runner leaves is ended by this watchdog
            await self._guard_run(resources, target)
        handle = await resources.enter_async_context(running_path(
            exp, target.info, self.out_dir, self.journal.resource, owner=owner, emit=self.events.emit))
        self.proxy, self.hops = handle.proxy, handle.hops
        if handle.proxy_facts is not None:
            self._note("proxy", handle.proxy_facts)
        if handle.proxy is not None:  # its upstream and toxics are the run's alone: a change behind its back halts it
            from chaos.execution.proxy import watching_proxy

            await resources.enter_async_context(watching_proxy(handle.proxy, self.halt, self.events.emit))
        self._note("path", handle.facts)
        return handle.load_base_url

    def _context(self, target: Target) -> RunContext:
        """What the faults act through: the target (restartable), the proxy, the client policy."""
        exp = self.experiment
        ctx = RunContext(seed=exp.seed, target=target.info, run_dir=self.out_dir, safety=exp.safety,
                         clients=ClientPolicy(), proxy=self.proxy, hops=self.hops)
        ctx.restart_target = self._restarter(target, ctx)
        return ctx

    async def _start_load(self, resources: contextlib.AsyncExitStack, ctx: RunContext, found: EngineFindings,
                          load_url: str) -> None:
        """The load driver (its shards connected), sending the request the preflight settled on."""
        exp, emit = self.experiment, self.events.emit
        if exp.load.shards > 1:
            self._stage("load", f"waiting for {exp.load.shards} load shards ({exp.load.shard_launch})")
        tag = run_tag(exp.seed, self._run_id())  # the first 8 hex digits of every UUID-shaped request id
        load_target = LoadTarget(base_url=load_url, model=self._model(ctx.target), seed=exp.seed,
                                 api_key=self.credentials.api_key, ca_pems=trusted(), run_tag=tag,
                                 trace_id=trace_id_of(self._run_id()) if self.traceparent else None)
        self._note("request_ids", {"format": found.preflight.load.request_ids, "run_tag": f"{tag:08x}"})
        found.preflight.load = await self._settle_keep_alive(found.preflight.load, load_target, tag)
        load = self.load = await resources.enter_async_context(running_load(
            found.preflight.load, load_target, policy=ctx.clients, sink=emit,
            run_dir=self.out_dir, notes=emit, run_id=self._run_id(), lifetime_s=exp.safety.max_duration))
        ctx.background = load  # kv.pressure hog sends its own streams through it
        # a frozen target ends no stream until the request timeout: `target_down` reads the in-flight ones
        if self.halt_watcher.reads_in_flight:
            getattr(load, "report_activity", lambda: None)()
            self.halt_watcher.watch_in_flight(getattr(load, "last_activity", None))

    async def _settle_keep_alive(self, settings: LoadSpec, target: LoadTarget, tag: int) -> LoadSpec:
        """``load.http.keep_alive: auto`` over HTTP/1.1: one short streamed request through the path, before any
        fault; where the server (or the first hop) closes the connection after it, the load opens one
        connection per request, and the note and the console say so (``chaos.load.keepalive``)."""
        if settings.http.keep_alive != "auto" or settings.http.version == "2":
            return settings
        from chaos.load.keepalive import keep_alive_reuse, probe_keep_alive, undecided
        from chaos.load.sdk_headers import request_headers, request_id_header
        from chaos.load.workload import Workload, endpoint_url
        from chaos.model.request_ids import RequestIds

        url = endpoint_url(target.base_url, settings.endpoint)
        try:
            if settings.http.version == "auto":
                from chaos.load.http2 import negotiate

                if await negotiate(url) == "2":  # the load will speak HTTP/2: one connection carries it all
                    return settings
            # the load's own first request (the preflight sent it to the target), two tokens long
            body, _ = Workload(settings, model=target.model, seed=target.seed).request(0)
            body = {**body, "max_tokens": 2}
            headers = request_headers(settings.headers, settings.request_timeout)
            id_header = request_id_header(settings.headers)
            if id_header:  # named as the run's own: the stream hops' taps of it are left out (chaos.execution.path)
                headers[id_header] = RequestIds(settings.request_ids, tag).wire("keep_alive_probe")
            finding = await probe_keep_alive(url, body, api_key=target.api_key, headers=headers,
                                             timeout_s=min(30.0, settings.request_timeout))
        except OSError as exc:  # unreachable now: the load's own requests say what they meet
            finding = undecided(f"the probe could not connect: {type(exc).__name__}: {exc}")
        reuse = keep_alive_reuse("auto", finding)
        self._note("keep_alive", {**finding.to_dict(), "mode": "auto", "reuse": reuse})
        if reuse:
            return settings
        self._stage("preflight", f"keep-alive: the server {finding.detail}; the load opens one connection per "
                                 "request, so each stream's TTFT includes its connect (ttft_parts: connect, tls); "
                                 "load.http.keep_alive: on reuses them and counts what is lost")
        return replace(settings, http=replace(settings.http, keep_alive="off"))

    def _activate_faults(self, ctx: RunContext) -> None:
        """Every fault bound to the run's context and checked against it; none acts until its phase."""
        self.injections = {fault.name: fault.activate(ctx) for _, fault in self.experiment.faults()}

    async def _start_watchdog(self, resources: contextlib.AsyncExitStack, target: Target) -> None:
        """A watchdog process when a fault or a Toxiproxy container outlives this one (it reverts if we
        die); a target that outlives us has had its own since it was made (``_start_target``)."""
        proxy_container = self.proxy is not None and self.proxy.server == "docker"
        faults_outlive = any(i.outlives_runner for i in self.injections.values())
        if faults_outlive or (proxy_container and not self.watchdogs):
            await self._guard_run(resources, target)

    async def _guard_run(self, resources: contextlib.AsyncExitStack, target: Target) -> None:
        """A watchdog that knows the URLs this run's faults talk to (and the admin token)."""
        await self._guard(resources, target, urls=self._contacted_urls(target.info), token=target.info.admin_token)

    async def _guard(self, resources: contextlib.AsyncExitStack, target: Target, *, urls: Iterable[str],
                     token: str | None) -> None:
        self.watchdogs.append(await resources.enter_async_context(watchdog(
            self.out_dir, self._run_id(), self.experiment.safety.max_duration, urls, token,
            extra_env=target.watchdog_env())))

    async def _start_observers(self, resources: contextlib.AsyncExitStack, target: Target,
                               found: EngineFindings) -> None:
        """The target's metric scraper (and llama.cpp's slot states, for an engine whose profile reads
        them), GPU telemetry (off where NVML sees no GPU), and the host's CPU use by the run and by
        everything else (``chaos.host.contention``)."""
        emit, info = self.events.emit, target.info
        interval = self.experiment.safety.scrape_interval
        await resources.enter_async_context(target.observing(emit, interval,
                                                             headers=self._metrics_headers(info.metrics_url)))
        if found.profile.slots:
            from chaos.targets.slots import SlotScraper, slots_url

            key = self.credentials.api_key
            await resources.enter_async_context(SlotScraper(
                slots_url(info.base_url), interval, emit, headers={"Authorization": f"Bearer {key}"} if key else None))
        await resources.enter_async_context(gpu_telemetry(emit))
        known = target.host_processes() is not None
        runner_pid = os.getpid()
        await resources.enter_async_context(host_contention(
            emit, lambda: (runner_pid, *(target.host_processes() or ())), target_known=known,
            subscribe=self.events.subscribe))

    def _model(self, target: TargetInfo) -> str:
        """The model the load asks for: ``load.model``, else the one the target serves."""
        return self.experiment.load.model or target.model

    def _metrics_headers(self, metrics_url: str | None) -> dict[str, str]:
        """The metrics credential, only for a ``metrics_url`` whose host the allow-list allows (loopback or
        ``safety.allowed_targets.hosts``): a metrics_url elsewhere is scraped without it (noted once)."""
        headers = self.credentials.metrics_headers()
        if not headers or not metrics_url or credentials_allowed(metrics_url, self.experiment.safety.allowed_targets):
            return headers
        if not self._withheld_noted:
            self._withheld_noted = True
            self._note("metrics_auth", {"withheld": strip_userinfo(metrics_url),
                                        "why": "the host of target.metrics_url is not on this host's loopback nor "
                                               "allowed by safety.allowed_targets.hosts: its credential is not sent"})
        return {}

    async def _drive(self, ctx: RunContext) -> None:
        """Baseline scrape, the timeline with the load, drain, cleanup window."""
        exp = self.experiment
        assert self.load is not None
        await asyncio.sleep(max(BASELINE_MIN_S, 3 * exp.safety.scrape_interval))  # the pre-load baseline
        await self.load.ready()
        await self._timeline(ctx, self.load)
        self._stage("drain", "draining in-flight streams")
        cancelled = await self.load.drain(exp.safety.drain_timeout)
        if cancelled:
            self._note("drain", {"cancelled_streams": cancelled})
        self._stage("cleanup", f"cleanup window {exp.safety.cleanup_window:g}s")
        await asyncio.sleep(exp.safety.cleanup_window)
        if self._stop_when is not None:  # the fleet's last word on the run, before its teardown stops the target
            await self._stop_when.finish(last_read=True)

    async def _timeline(self, ctx: RunContext, load: LoadDriver) -> None:
        """Phases in order, each ``async with`` its faults. Streams join a phase as it begins, before
        its injects, so a stream the new phase's faults may touch is never counted in the phase
        before; the phase's clock starts once its last inject has returned, so a slow inject or a slow
        revert before it never shortens the time its faults are in force. The load starts once the
        first phase's faults are in force and sends until the last phase's planned end, as the real
        timeline puts it (the run's hard stop, ``safety.max_duration``, until that is known). A phase
        with ``max_duration`` runs until the verdicts judged on it decide (``_phase_time``)."""
        load_task: asyncio.Task[None] | None = None
        last = self.experiment.phases[-1] if self.experiment.phases else None
        try:
            for phase in self.experiment.phases:
                t_start = time.monotonic_ns()
                t_in_force: int | None = None
                ctx.phase, ctx.phase_duration_s, load.phase = phase.name, phase.duration, phase.name
                self.events.emit(PhaseWindow(phase.name, t_start))
                self._stage("phase", f"phase {phase.name} ({phase.length_text()}, {len(phase.faults)} fault(s))")
                looks = LookState()
                try:
                    async with self._phase_faults(phase):
                        t_in_force = time.monotonic_ns()
                        load_task = await self._phase_load(load, load_task, phase, t_in_force, phase is last)
                        await self._phase_time(load, phase, t_in_force, phase is last, looks)
                finally:  # a phase cut short (halt, signal, hard stop) is recorded as far as it got
                    self.events.emit(PhaseWindow(phase.name, t_start, time.monotonic_ns(), t_in_force,
                                                 looks.looks, looks.stopped_by, looks.t_decided))
                self.completed_phases.append(phase.name)
            if load_task is not None:
                await load_task
        finally:
            if load_task is not None and not load_task.done():
                load_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await load_task

    async def _phase_load(self, load: LoadDriver, load_task: asyncio.Task[None] | None, phase: PhaseSpec,
                          t_in_force: int, is_last: bool) -> asyncio.Task[None]:
        """The load, started with the first phase's faults in force; it sends until the last phase's end
        (for a phase that runs until decided: its max, moved to its real end once it decides)."""
        t_end = t_in_force + int(phase.longest * 1e9)
        self._load_on_hard_stop = None if is_last else load
        if load_task is None:
            return asyncio.create_task(load.run(t_end if is_last else self._hard_stop_ns()), name="load")
        if is_last:
            await load.move_deadline(t_end)
        else:  # a pause since (a restart) moved the hard stop: the load's moves with it
            await self._follow_hard_stop()
        return load_task

    async def _follow_hard_stop(self) -> None:
        """The load's deadline to the run's hard stop as it stands, while the load sends until it: a
        restart pauses the run's clock (``RunDeadline.paused``) and the phases after it need the load."""
        if self._load_on_hard_stop is not None and self._stopped() is None:
            await self._load_on_hard_stop.move_deadline(self._hard_stop_ns())

    async def _phase_time(self, load: LoadDriver, phase: PhaseSpec, t_in_force: int, is_last: bool,
                          looks: LookState) -> None:
        """The phase's own time: its fixed duration, or until its verdicts decide (``chaos.execution.sequential``:
        a look at min, then each time its elapsed time grows by 25%, at most max)."""
        if phase.max_duration is None:
            await asyncio.sleep(max(0.0, (t_in_force + int(phase.duration * 1e9) - time.monotonic_ns()) / 1e9))
            return
        from chaos.execution.verify import judge_entry

        journal = self.journal
        assert journal is not None
        await run_looks(self.experiment, phase, lambda: journal.observations, t_in_force,
                        lambda line: self._stage("look", line), looks, judge_entry)
        if is_last:  # the load stops with the phase, not at its max
            await load.move_deadline(time.monotonic_ns())

    def _hard_stop_ns(self) -> int:
        """The run's hard stop (its ``asyncio.timeout``, as ``RunDeadline`` has moved it) on the monotonic ns clock."""
        if self._clock is None:
            return time.monotonic_ns() + int(self.experiment.safety.max_duration * 1e9)
        return self._clock.hard_stop_ns()

    def _startup_allowance_s(self) -> float | None:
        """How long the target's start may take: its kind's own allowance (``startup_allowance_s``: vLLM's
        is at least 5 min, a server already running has none), the class ``start_target`` would make."""
        spec = self.experiment.target
        return target_class(spec, self.target_url or spec.url).startup_allowance_s(spec)

    @contextlib.asynccontextmanager
    async def _phase_faults(self, phase: PhaseSpec) -> AsyncIterator[None]:
        """Each of the phase's faults injected in order, reverted newest first however the phase ends."""
        async with contextlib.AsyncExitStack() as injected:
            for fault in phase.faults:
                await injected.enter_async_context(self._injected(self.injections[fault.name], phase.name))
            yield
        if self.revert_errors:
            raise FaultRevertFailed("; ".join(self.revert_errors))

    @contextlib.asynccontextmanager
    async def _injected(self, injection: Injection, phase: str) -> AsyncIterator[None]:
        """Plan (journaled first), inject, and on exit revert — the revert always runs to its end."""
        name, kind, emit = injection.name, injection.kind, self.events.emit
        emit(FaultEvent(name, kind, "plan", time.monotonic_ns(), phase, undo=injection.plan(),
                        scope=injection.fault.scope))
        t_started = time.monotonic_ns()
        try:
            done, interrupted = await _finish(injection.inject(), injection.step_timeout_s)
            evidence = done.result()
        except (ChaosError, OSError) as exc:
            emit(FaultEvent(name, kind, "error", time.monotonic_ns(), phase, message=f"inject: {exc}"))
            await self._revert(injection, phase)  # it may have changed something before failing
            failure = (exc if isinstance(exc, ChaosError)
                       else FaultError(f"fault {name} ({kind}) could not be injected: {exc}"))
            self.fault_failure = self.fault_failure or failure
            raise failure from (None if failure is exc else exc)
        except BaseException:
            await self._revert(injection, phase)
            raise
        undo = evidence.pop("undo", {}) if isinstance(evidence, dict) else {}
        emit(FaultEvent(name, kind, "inject", time.monotonic_ns(), phase, evidence=evidence, undo=undo,
                        t_started=t_started))
        scheduled = injection.scheduled()
        if scheduled is not None:  # an action later in the phase (``at``): its failure is reported when it happens
            scheduled.add_done_callback(lambda task: self._scheduled_done(injection, phase, task))
        try:
            if interrupted:  # the inject finished and is journaled; now unwind (and revert)
                raise asyncio.CancelledError
            yield
        finally:
            await self._revert(injection, phase)

    def _scheduled_done(self, injection: Injection, phase: str, task: asyncio.Future[Any]) -> None:
        """A fault's scheduled action ended: a failure is the fault's, in its phase (an ``error`` event
        now, the run failed with it), not a revert's (there is nothing to roll back)."""
        if task.cancelled() or task.exception() is None or self.cleaning:
            return
        exc = task.exception()
        failure = exc if isinstance(exc, ChaosError) else FaultError(f"{type(exc).__name__}: {exc}")
        message = f"fault {injection.name} ({injection.kind}) failed in phase {phase}: {failure}"
        self.events.emit(FaultEvent(injection.name, injection.kind, "error", time.monotonic_ns(), phase,
                                    message=f"inject: {failure}"))
        if self.fault_failure is None:
            self.fault_failure = type(failure)(message) if isinstance(failure, FaultError) else FaultError(message)
            self._stage("fault", f"{message}: reverting and stopping")
            self._stop_work()

    async def _revert(self, injection: Injection, phase: str) -> None:
        """Revert one fault; never raises (a failed revert must not stop the others): failures are kept."""
        name, kind = injection.name, injection.kind
        interrupted = False
        t_started = time.monotonic_ns()
        try:
            done, interrupted = await _finish(injection.revert(), injection.step_timeout_s)
            evidence = done.result()
        except Exception as exc:
            message = f"revert of {name} ({kind}) failed: {exc!r}; run `streamchaos rollback {self.out_dir}`"
            self.revert_errors.append(message)
            self.events.emit(FaultEvent(name, kind, "error", time.monotonic_ns(), phase, message=message))
        else:
            self.events.emit(FaultEvent(name, kind, "revert", time.monotonic_ns(), phase, evidence=evidence,
                                        t_started=t_started))
        if interrupted:
            raise asyncio.CancelledError

    # -- small helpers ---------------------------------------------------------------------------
    def _restarter(self, target: Target, ctx: RunContext) -> Any:
        async def restart_target() -> None:
            # a restart is a start again: bounded by the target's allowance, not counted in max_duration
            allowance = (type(target).startup_allowance_s(self.experiment.target) or 0.0) + START_GRACE_S
            with self._clock.paused("restart", allowance) if self._clock is not None else contextlib.nullcontext():
                await self._follow_hard_stop()  # the load must not stop at the old hard stop mid-restart
                await target.restart()
            await self._follow_hard_stop()  # ... nor run past the run's stop now the restart is over
            ctx.target = target.info
            self._note("target", {"restarted": True, **target_facts(target.info)})

        return restart_target

    def _contacted_urls(self, target: TargetInfo) -> list[str]:
        """The URLs this run's faults talk to, as configuration (not the journal) knows them."""
        urls = [target.base_url, target.admin_url or ""]
        if self.proxy is not None:
            urls.append(self.proxy.api_url)
        urls.extend(hop.control_url for hop in self.hops if hop.control_url)  # a stream fault's rules
        return [u for u in urls if u]

    def _run_id(self) -> str:
        assert self.journal is not None
        return self.journal.run_id

    def _note(self, topic: str, data: dict[str, Any]) -> None:
        self.events.emit(Note(topic=topic, t=time.monotonic_ns(), data=data))

    def _stage(self, what: str, detail: str) -> None:
        self.events.emit(Stage(what, detail, time.monotonic_ns()))

    # -- signals --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        """SIGINT/SIGTERM stop the run (it then unwinds and reverts); later ones are noted."""
        if not self.handle_signals:
            yield
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
                self._installed.append(sig)
            except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
                pass
        try:
            yield
        finally:
            self._release_signals()

    def _release_signals(self) -> None:
        """The process's SIGINT/SIGTERM back to what they were before the run (a third one, after a
        forced exit, then ends the process as it would have without us)."""
        if self._installed:
            loop = asyncio.get_running_loop()
            for sig in self._installed:
                loop.remove_signal_handler(sig)
            self._installed.clear()

    def _on_signal(self, sig: int) -> None:
        self.interrupt(signal.Signals(sig).name)


async def _cut(task: asyncio.Future[Any], grace_s: float) -> None:
    """Give ``task`` a second, then cancel it, again each second until it ends or ``grace_s`` has passed:
    each cancellation ends the one teardown step awaiting then, and the next steps run (an exit stack
    goes on past a failed exit), so a step that is merely slow still finishes.

    Past the grace every step still to come is cut as soon as it waits (``FORCE_CUT_EVERY_S``, at most
    ``FORCE_CUTS_MAX`` times): one left pending would be cancelled only once more, by ``asyncio.run``'s
    shutdown, which then waits on the next hung step for ever."""
    loop = asyncio.get_running_loop()
    end = loop.time() + grace_s
    while not task.done() and loop.time() < end:
        await asyncio.wait({task}, timeout=min(1.0, max(0.0, end - loop.time())))
        if not task.done():
            task.cancel()
    for _ in range(FORCE_CUTS_MAX):
        if task.done():
            break
        await asyncio.wait({task}, timeout=FORCE_CUT_EVERY_S)  # the last cancellation lands, the next step begins
        if not task.done():
            task.cancel()
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # its end, whenever, is not an error to log


async def _finish(work: Any, timeout: float) -> tuple[asyncio.Future[Any], bool]:
    """Await ``work`` to its end even if this task is cancelled meanwhile; ``(done, was_cancelled)``.

    A fault half-applied is worse than a late stop: an inject or revert is never abandoned midway
    (a clock lock in a worker thread would otherwise land after its revert). The caller reads the
    outcome from ``done`` and re-raises the cancellation itself. ``timeout`` bounds the wait: past
    it the work is cancelled and ``done.result()`` raises ``TimeoutError``.
    """
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    cancelled = False
    while not task.done():
        remaining = deadline - loop.time()
        if remaining <= 0:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            failed: asyncio.Future[Any] = loop.create_future()
            failed.set_exception(TimeoutError(f"did not finish within {timeout:g}s"))
            return failed, cancelled
        try:
            await asyncio.wait({task}, timeout=remaining)
        except asyncio.CancelledError:
            cancelled = True
    return task, cancelled


def _cluster_gate(experiment: Experiment) -> Any:
    """The allow-list a Kubernetes target applies while it resolves itself (None for other kinds)."""
    if experiment.target.kind != "kubernetes" or experiment.target.kubernetes is None:
        return None
    from chaos.k8s.gate import ClusterGate

    return ClusterGate(experiment)


def _reach_facts(reach: Reach) -> dict[str, Any]:
    return {k: v for k, v in vars(reach).items() if v is not None and v is not False}


def save_experiment(exp: Experiment, out_dir: Path) -> None:
    """Keep the experiment beside its journal (0600: it may hold credentials) so `verify` can re-judge it:
    the text it was validated from (a file's as written, a dict's as given), never a resolved key."""
    text = exp.text
    if text is None and exp.source and Path(exp.source).is_file():  # built by hand, naming its file
        text = Path(exp.source).read_text(encoding="utf-8")
    if text is not None:
        write_new(out_dir / "experiment.yaml", _prompts_absolute(text, exp))


def _prompts_absolute(text: str, exp: Experiment) -> str:
    """The kept text with a prompt file and each gateway's configuration file named by its resolved
    path: the copy is read from the run directory, where a path relative to the experiment's own file
    would name nothing."""
    edits: dict[tuple[str | int, ...], str] = {}
    if exp.load.prompts.source != "synthetic":
        edits[("load", "prompts", "source")] = json.dumps(exp.load.prompts.source)
    for i, hop in enumerate(exp.path):
        if hop.config is not None:
            edits[("path", i, "config")] = json.dumps(hop.config)
    if not edits:
        return text
    from chaos.experiment.yamledit import apply_edits
    from chaos.model.errors import UsageError

    try:
        return apply_edits(text, edits)
    except UsageError:  # a text whose values the loader found elsewhere (an alias): keep it as written
        return text
