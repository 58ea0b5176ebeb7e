"""The experiment runner: target → proxy → load → scraper, faults on the phase timeline, verdicts.

A run is a stack of resources, each an async context manager that undoes itself on every exit
path — normal end, exception, SIGINT/SIGTERM, timeout — newest first: target, proxy, load driver,
watchdog (when a fault outlives the process), metric scraper, GPU telemetry; inside them each
phase is ``async with`` its faults, so a phase's faults are reverted when the phase ends however it
ends. Everything that happens is a run event (``chaos.events``); the journal, the console, the
report writer and the pytest plugin are listeners. Each plan, inject and revert is journaled (plans
and reverts fsync'd) before and after the change, so ``streamchaos rollback RUN_DIR`` can undo what
a killed run left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import traceback
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chaos.allowlist import enforce as enforce_allowed_targets
from chaos.allowlist import enforce_cluster
from chaos.context import ClientPolicy, ProxyInfo, Reach, RunContext, TargetInfo
from chaos.credentials import Credentials
from chaos.credentials import resolve as resolve_credentials
from chaos.errors import ChaosError, FaultError, FaultRevertFailed
from chaos.events import EventBus, RunFinished, RunListener, RunStarted, Stage, VerdictsReady
from chaos.experiment.model import Experiment, PhaseSpec
from chaos.halt import HaltWatcher
from chaos.hostinfo import environment_facts
from chaos.journal import JOURNAL_NAME, Journal, prepare_run_dir
from chaos.load import LoadDriver, LoadTarget, running_load
from chaos.observations import FaultEvent, Note, Observations, PhaseWindow
from chaos.preflight import learn_engine
from chaos.report import ReportWriter
from chaos.targets import BuiltinStack, Target, running_target, target_facts
from chaos.telemetry import gpu_telemetry
from chaos.watchdog import WatchdogHandle, watchdog
from faults.base import Injection
from sla.base import Verdict

__all__ = ["Result", "Runner", "exit_code_for", "run", "run_async"]

REVERT_TIMEOUT_S = 20.0  # one revert may not hold the run hostage
STOP_REDELIVERY_S = 1.0  # a stop (signal, halt) is cancelled into the run again this often until teardown
BASELINE_MIN_S = 0.5  # metrics scraped before the load starts


@dataclass
class Result:
    """What one run produced: verdicts, observations, where the files are, the exit code."""

    experiment: Experiment
    verdicts: list[Verdict]
    observations: Observations
    out_dir: Path
    status: str  # completed | interrupted | halted | failed
    exit_code: int
    started: float
    ended: float
    target: TargetInfo | None = None
    proxy: ProxyInfo | None = None
    client_lag: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def failing(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.ok]


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
    ) -> None:
        self.experiment = experiment
        self.target_url = target_url
        self.api_key_env = api_key_env  # --api-key-env: the variable holding the target's API key
        self.out_dir = Path(out_dir) if out_dir else default_out_dir(experiment.name)
        self.listeners = list(listeners)
        self.handle_signals = handle_signals
        self.interrupted: str | None = None  # the signal that interrupted the run (``interrupt``)
        self.halted: str | None = None  # why a safety condition stopped the run early (``halt``)
        self._main_task: asyncio.Task[Any] | None = None
        self.cleaning = False  # past the work: a signal is noted, not acted on
        self.revert_errors: list[str] = []
        self.events = EventBus()
        self.target: Target | None = None
        self.proxy: ProxyInfo | None = None
        self.load: LoadDriver | None = None
        self.journal: Journal | None = None
        self.injections: dict[str, Injection] = {}
        self.watchdogs: list[WatchdogHandle] = []
        self._deadline: asyncio.Timeout | None = None
        self.credentials = Credentials()

    # -- the run -----------------------------------------------------------------------------
    async def run(self) -> Result:
        exp = self.experiment
        spec = exp.target
        # before anything is touched: a named variable or file that is missing is a usage error (exit 2)
        self.credentials = resolve_credentials(spec.api_key, spec.api_key_env, spec.metrics_auth,
                                               cli_api_key_env=self.api_key_env)
        prepare_run_dir(self.out_dir)
        save_experiment(exp, self.out_dir)
        t0, started = time.monotonic_ns(), time.time()
        journal = self.journal = Journal(self.out_dir / JOURNAL_NAME, exp.name, t0, started)
        self.events = EventBus([journal, *self.listeners, ReportWriter()])
        # last, so a stream has reached every other listener before a condition may halt the run
        self.events.subscribe(HaltWatcher(exp.safety, self.halt, self.events.emit))
        self.events.emit(RunStarted(exp.name, str(self.out_dir), t0, started, tuple((p.name, p.duration) for p in exp.phases)))
        self._note("environment", environment_facts())  # versions and host, for the report
        outcome = await self._attempt()
        lag = self.load.lag_stats() if self.load is not None else {}
        if self.load is not None and lag:  # per phase, the open loop's own send delay (empty in closed loop)
            lag["send_delay"] = self.load.send_delay_stats()
        if lag:
            self._note("client_lag", lag)
        verdicts: list[Verdict] = []
        if outcome.status == "completed":
            from chaos.verify import judge_all

            verdicts = judge_all(exp, journal.observations, client_lag=lag)
            outcome.exit_code = exit_code_for(verdicts)
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
        try:
            with self._signals():
                if self._stopped() is None:  # a stop that came before the run had a task to cancel
                    await self._execute()
            outcome = _Outcome()
        except asyncio.CancelledError:
            if self._stopped() is None:
                raise
            outcome = _Outcome()
        except Exception as exc:  # noqa: BLE001 - every failure is classified, recorded and reported
            outcome = self._failure(exc)
        stopped = self._stopped()
        if stopped is not None:
            while main_task.cancelling():  # the stop was ours to deliver, and it is handled
                main_task.uncancel()
            status, why = stopped
            outcome = _Outcome(status, 4, why if outcome.status == "completed" else f"{why}; then: {outcome.error}")
        if self.revert_errors and outcome.exit_code == 0:
            outcome = _Outcome("failed", 4, "; ".join(self.revert_errors))
        return outcome

    def halt(self, reason: str) -> None:
        """Stop the run early because a safety condition tripped: revert, tear down, end ``halted``.

        For run listeners that watch the run (halt conditions); safe to call more than once.
        """
        if self.cleaning or self._stopped() is not None:
            return
        self.halted = reason
        self._stage("halt", f"halting: {reason}")
        self._stop_work()

    def interrupt(self, name: str) -> None:
        """Stop the run as a signal would (``interrupted``); for a caller that owns the signal itself
        (the pytest plugin, where pytest owns SIGINT). Call it in the run's loop; safe more than once."""
        if self.cleaning or self._stopped() is not None:
            self._stage("signal", f"{name}: already reverting and stopping")
            return
        self.interrupted = name
        self._stage("signal", f"{name}: reverting faults and stopping")
        self._stop_work()

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

    def _failure(self, exc: Exception) -> _Outcome:
        """How a run that raised ``exc`` ended: a timeout, one of ours (its exit code), or a bug (traceback kept)."""
        if isinstance(exc, TimeoutError):
            if self._deadline is not None and self._deadline.expired():
                return _Outcome("failed", 4, f"the run exceeded safety.max_duration ({self.experiment.safety.max_duration:g}s)"
                                             " plus the target's startup_timeout")
            return _Outcome("failed", 4, f"a step of the run timed out: {exc!r}")
        if isinstance(exc, ChaosError):
            self._note("run_error", {"error": str(exc), "type": type(exc).__name__})
            return _Outcome("failed", exc.exit_code, str(exc))
        # a bug of ours or of a library: still reverted, recorded and reported
        (self.out_dir / "runner-error.txt").write_text(traceback.format_exc(), encoding="utf-8")
        error = f"internal error {type(exc).__name__}: {exc} (traceback in runner-error.txt)"
        self._note("run_error", {"error": error, "type": type(exc).__name__})
        return _Outcome("failed", 4, error)

    async def _execute(self) -> None:
        """The resources, nested; teardown (outside the deadline) is their exits, newest first."""
        exp = self.experiment
        async with contextlib.AsyncExitStack() as resources:
            try:
                async with asyncio.timeout(exp.safety.max_duration + exp.target.startup_timeout) as self._deadline:
                    ctx = await self._bring_up(resources)
                    await self._drive(ctx)
            finally:
                self.cleaning = True
                self._stage("teardown", "stopping load, proxy and target")

    async def _bring_up(self, resources: contextlib.AsyncExitStack) -> RunContext:
        """Target, proxy, load, watchdog, scraper, telemetry; the faults activated (checked) against them."""
        exp, emit, creds = self.experiment, self.events.emit, self.credentials
        # the blast-radius limit, before anything is started or contacted (TargetNotAllowed, exit 2)
        checked = enforce_allowed_targets(exp, target_url=self.target_url)
        if checked:
            self._note("allowed_targets", {"checked": [_reach_facts(r) for r in checked]})
        remote = self.target_url or exp.target.url
        self._stage("target", f"reaching target {remote} (remote)" if remote else f"starting target ({exp.target.kind})")
        target_spec = replace(exp.target, api_key=creds.api_key)  # the resolved key, never written anywhere
        assert self.journal is not None
        target = self.target = await resources.enter_async_context(running_target(
            target_spec, target_url=self.target_url, run_dir=self.out_dir, seed=exp.seed, run_id=self.journal.run_id,
            record=self.journal.resource))
        self._note("target", {**target_facts(target.info), "credentials": creds.describe()})
        if target.info.cluster is not None:  # the namespace and pods a Kubernetes target resolved to: allowed?
            self._note("allowed_targets", {"cluster": [_reach_facts(r) for r in enforce_cluster(exp, target.info.cluster)]})
        model = exp.load.model or target.info.model
        self._stage("preflight", "detecting the engine and sending the load's request once")
        started = time.monotonic()
        found = await learn_engine(
            exp.load, base_url=target.info.base_url, metrics_url=target.info.metrics_url, model=model, seed=exp.seed,
            api_key=creds.api_key, metrics_headers=creds.metrics_headers(), engine=exp.target.engine,
            started_builtin=isinstance(target, BuiltinStack))
        self._note("engine_profile", found.note())
        self._note("preflight", found.preflight.facts())
        self._note("warmup", {"status": found.preflight.record.status, "seconds": round(time.monotonic() - started, 4)})
        load_url = target.info.base_url
        if exp.proxy.enabled:
            from chaos.proxy import running_proxy  # network faults only; keeps plain runs light

            self._stage("proxy", "starting Toxiproxy")
            handle = await resources.enter_async_context(running_proxy(exp, target.info, self.out_dir))
            self.proxy = handle.info
            self._note("proxy", handle.facts())
            load_url = handle.client_base_url
        ctx = RunContext(seed=exp.seed, target=target.info, run_dir=self.out_dir, safety=exp.safety,
                         clients=ClientPolicy(), proxy=self.proxy)
        ctx.restart_target = self._restarter(target, ctx)
        if exp.load.shards > 1:
            self._stage("load", f"waiting for {exp.load.shards} load shards ({exp.load.shard_launch})")
        load_target = LoadTarget(base_url=load_url, model=model, seed=exp.seed, api_key=creds.api_key)
        load = self.load = await resources.enter_async_context(running_load(
            found.preflight.load, load_target, policy=ctx.clients, sink=emit,
            run_dir=self.out_dir, notes=emit, run_id=self._run_id(), lifetime_s=exp.safety.max_duration))
        ctx.background = load  # kv.pressure hog sends its own streams through it
        self.injections = {fault.name: fault.activate(ctx) for _, fault in exp.faults()}
        if target.outlives_runner or any(injection.outlives_runner for injection in self.injections.values()):
            self.watchdogs.append(await resources.enter_async_context(watchdog(
                self.out_dir, self._run_id(), exp.safety.max_duration, self._contacted_urls(target.info), target.info.admin_token,
                extra_env=target.watchdog_env())))
        await resources.enter_async_context(target.observing(emit, exp.safety.scrape_interval, headers=creds.metrics_headers()))
        await resources.enter_async_context(gpu_telemetry(emit))
        return ctx

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

    async def _timeline(self, ctx: RunContext, load: LoadDriver) -> None:
        """Phases in order, each ``async with`` its faults. Streams join a phase as it begins, before
        its injects, so a stream the new phase's faults may touch is never counted in the phase
        before; the load itself starts once the first phase's faults are in force."""
        t_first = time.monotonic_ns()
        load_task: asyncio.Task[None] | None = None
        try:
            for phase in self.experiment.phases:
                t_start = time.monotonic_ns()
                ctx.phase, ctx.phase_duration_s, load.phase = phase.name, phase.duration, phase.name
                self.events.emit(PhaseWindow(phase.name, t_start))
                self._stage("phase", f"phase {phase.name} ({phase.duration:g}s, {len(phase.faults)} fault(s))")
                async with self._phase_faults(phase):
                    if load_task is None:
                        load_task = asyncio.create_task(load.run(t_first + int(self.experiment.duration * 1e9)), name="load")
                    await asyncio.sleep(max(0.0, (t_start + int(phase.duration * 1e9) - time.monotonic_ns()) / 1e9))
                self.events.emit(PhaseWindow(phase.name, t_start, time.monotonic_ns()))
            if load_task is not None:
                await load_task
        finally:
            if load_task is not None and not load_task.done():
                load_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await load_task

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
        emit(FaultEvent(name, kind, "plan", time.monotonic_ns(), phase, undo=injection.plan()))
        try:
            done, interrupted = await _finish(injection.inject(), REVERT_TIMEOUT_S)
            evidence = done.result()
        except (ChaosError, OSError) as exc:
            emit(FaultEvent(name, kind, "error", time.monotonic_ns(), phase, message=f"inject: {exc}"))
            await self._revert(injection, phase)  # it may have changed something before failing
            if isinstance(exc, ChaosError):
                raise
            raise FaultError(f"fault {name} ({kind}) could not be injected: {exc}") from exc
        except BaseException:
            await self._revert(injection, phase)
            raise
        undo = evidence.pop("undo", {}) if isinstance(evidence, dict) else {}
        emit(FaultEvent(name, kind, "inject", time.monotonic_ns(), phase, evidence=evidence, undo=undo))
        try:
            if interrupted:  # the inject finished and is journaled; now unwind (and revert)
                raise asyncio.CancelledError
            yield
        finally:
            await self._revert(injection, phase)

    async def _revert(self, injection: Injection, phase: str) -> None:
        """Revert one fault; never raises (a failed revert must not stop the others): failures are kept."""
        name, kind = injection.name, injection.kind
        interrupted = False
        try:
            done, interrupted = await _finish(injection.revert(), REVERT_TIMEOUT_S)
            evidence = done.result()
        except Exception as exc:
            message = f"revert of {name} ({kind}) failed: {exc!r}; run `streamchaos rollback {self.out_dir}`"
            self.revert_errors.append(message)
            self.events.emit(FaultEvent(name, kind, "error", time.monotonic_ns(), phase, message=message))
        else:
            self.events.emit(FaultEvent(name, kind, "revert", time.monotonic_ns(), phase, evidence=evidence))
        if interrupted:
            raise asyncio.CancelledError

    # -- small helpers ---------------------------------------------------------------------------
    def _restarter(self, target: Target, ctx: RunContext) -> Any:
        async def restart_target() -> None:
            await target.restart()
            ctx.target = target.info
            self._note("target", {"restarted": True, **target_facts(target.info)})

        return restart_target

    def _contacted_urls(self, target: TargetInfo) -> list[str]:
        """The URLs this run's faults talk to, as configuration (not the journal) knows them."""
        urls = [target.base_url, target.admin_url or ""]
        if self.proxy is not None:
            urls.append(self.proxy.api_url)
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
        installed: list[signal.Signals] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
                installed.append(sig)
            except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
                pass
        try:
            yield
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        self.interrupt(signal.Signals(sig).name)


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


def _reach_facts(reach: Reach) -> dict[str, Any]:
    return {k: v for k, v in vars(reach).items() if v is not None}


def exit_code_for(verdicts: list[Verdict]) -> int:
    """0 all as expected, 1 an SLA not as expected (decisively), 3 inconclusive (DESIGN.md)."""
    if any(v.status != "inconclusive" and not v.ok for v in verdicts):
        return 1
    if any(v.status == "inconclusive" for v in verdicts):
        return 3
    return 0


def save_experiment(exp: Experiment, out_dir: Path) -> None:
    """Keep the experiment beside its journal (0600: it may hold credentials) so `verify` can re-judge it."""
    dest = out_dir / "experiment.yaml"
    if exp.source and Path(exp.source).is_file():
        text = Path(exp.source).read_text(encoding="utf-8")
    else:
        raw = getattr(exp, "raw", None)
        if raw is None:
            return
        import yaml

        text = yaml.safe_dump(raw, sort_keys=False)
    with os.fdopen(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
        f.write(text)


async def run_async(
    experiment: Experiment | str | Path, *, target_url: str | None = None, out_dir: str | Path | None = None,
    seed: int | None = None, listeners: Sequence[RunListener] = (), handle_signals: bool = True,
    api_key_env: str | None = None,
) -> Result:
    """Run an experiment (an ``Experiment`` or a path to its YAML) and return the ``Result``."""
    if isinstance(experiment, (str, Path)):
        from chaos.experiment import load_experiment

        experiment = load_experiment(experiment)
    if seed is not None:
        experiment = replace(experiment, seed=seed)
    return await Runner(experiment, target_url=target_url, out_dir=out_dir, listeners=listeners, handle_signals=handle_signals,
                        api_key_env=api_key_env).run()


def run(experiment: Experiment | str | Path, **kwargs: Any) -> Result:
    """Synchronous twin of ``run_async``."""
    return asyncio.run(run_async(experiment, **kwargs))
