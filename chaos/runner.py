"""The experiment runner: target → proxy → scraper → load, faults on the phase timeline, verdicts.

Revert is guaranteed: every injected fault is reverted at its phase's end, and from ``finally`` on
exceptions, on SIGINT and on SIGTERM (the signal handlers cancel the run, the ``finally`` reverts).
Each plan, inject and revert is appended to the journal, plans and reverts fsync'd, before and
after the change, so ``streamchaos rollback RUN_DIR`` can undo what a killed run left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chaos.errors import ChaosError, FaultError, FaultRevertFailed
from chaos.journal import Journal
from chaos.load import make_load
from chaos.observations import FaultEvent, Note, Observations, PhaseWindow
from chaos.scraper import MetricScraper
from chaos.targets import start_target
from faults.base import ClientPolicy, Fault, FaultEnv, ProxyInfo, TargetInfo
from sla.base import Verdict

__all__ = ["Result", "Runner", "run", "run_async"]

REVERT_TIMEOUT_S = 20.0  # one revert may not hold the run hostage
LEASE_PERIOD_S = 1.0  # how often the runner renews the watchdog's lease


@dataclass
class Result:
    """What one run produced: verdicts, observations, where the files are, the exit code."""

    experiment: Any
    verdicts: list[Verdict]
    observations: Observations
    out_dir: Path
    status: str  # completed | interrupted | failed
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


def default_out_dir(name: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name) or "run"
    return Path("runs") / f"{stamp}-{safe}-{os.getpid()}"


class Runner:
    """Runs one experiment once. Use ``await Runner(exp).run()`` or the ``run``/``run_async`` helpers."""

    def __init__(
        self,
        experiment: Any,
        *,
        target_url: str | None = None,
        out_dir: str | Path | None = None,
        progress: Callable[[str], None] | None = None,
        handle_signals: bool = True,
    ) -> None:
        self.experiment = experiment
        self.target_url = target_url
        self.out_dir = Path(out_dir) if out_dir else default_out_dir(experiment.name)
        self.progress = progress or (lambda message: None)
        self.handle_signals = handle_signals
        self.interrupted: str | None = None
        self.cleaning = False
        self.active: list[tuple[Fault, str]] = []  # injected and not yet reverted, in order
        self.env: FaultEnv | None = None
        self.journal: Journal | None = None

    # -- the run -----------------------------------------------------------------------------
    async def run(self) -> Result:
        exp = self.experiment
        self.out_dir.mkdir(parents=True, exist_ok=True)
        _save_experiment(exp, self.out_dir)
        t0, wall_t0 = time.monotonic_ns(), time.time()
        self.journal = journal = Journal(self.out_dir / "journal.jsonl", exp.name, t0, wall_t0)
        started = time.time()
        status, error, exit_code = "completed", None, 0
        run_deadline: asyncio.Timeout | None = None
        target = proxy = scraper = generator = watchdog = None
        lease_task: asyncio.Task[None] | None = None
        telemetry_task: asyncio.Task[None] | None = None
        main_task = asyncio.current_task()
        assert main_task is not None
        installed = self._install_signal_handlers(main_task)
        try:
            async with asyncio.timeout(exp.safety.max_duration + exp.target.startup_timeout) as run_deadline:
                self.progress(f"starting target ({exp.target.kind})")
                target = start_target(exp.target, target_url=self.target_url, run_dir=self.out_dir, seed=exp.seed)
                info = await target.start()
                journal.append(Note(topic="target", t=time.monotonic_ns(), data=_target_facts(info)))
                journal.append(Note(topic="warmup", t=time.monotonic_ns(), data=await _warm_up(info, exp.target.api_key)))
                load_url = info.base_url
                if exp.proxy.enabled:
                    from chaos.proxy import start_proxy  # network faults only; keeps plain runs light

                    proxy = await start_proxy(exp, info, self.out_dir)
                    journal.append(Note(topic="proxy", t=time.monotonic_ns(), data=proxy.facts()))
                    load_url = proxy.client_base_url
                policy = ClientPolicy()
                self.env = env = FaultEnv(
                    seed=exp.seed, target=info, run_dir=self.out_dir, clients=policy,
                    proxy=proxy.info if proxy else None,
                    extras={"allow_gpu_clock_changes": exp.safety.allow_gpu_clock_changes, "experiment": exp},
                )

                async def restart_target() -> None:
                    assert target is not None
                    await target.restart()
                    env.target = target.info
                    journal.append(Note(topic="target", t=time.monotonic_ns(), data={"restarted": True, **_target_facts(target.info)}))

                env.restart_target = restart_target
                generator = make_load(exp.load, base_url=load_url, model=exp.load.model or info.model, seed=exp.seed,
                                      policy=policy, sink=self._sink, api_key=exp.target.api_key)
                env.background = generator  # before the checks: kv.pressure hog needs it
                for phase in exp.phases:
                    for fault in phase.faults:
                        fault.check(env)
                if any(getattr(f, "outlives_runner", False) for p in exp.phases for f in p.faults):
                    watchdog = _start_watchdog(self.out_dir, exp.safety.max_duration)
                    lease_task = asyncio.create_task(_renew_lease(self.out_dir), name="lease")

                scraper = MetricScraper(info.metrics_url, exp.safety.scrape_interval, self._sink)
                scraper.start()
                telemetry_task = await _start_gpu_telemetry(self._sink)
                await asyncio.sleep(max(0.5, 3 * exp.safety.scrape_interval))  # the pre-load baseline

                if hasattr(generator, "ready"):  # worker processes take about a second to start
                    await generator.ready()
                loads: list[asyncio.Task[None]] = []  # the load starts once the first phase's faults are in force
                try:
                    await self._timeline(exp, env, generator, loads)
                    await asyncio.gather(*loads)
                finally:
                    for load_task in loads:
                        if not load_task.done():
                            load_task.cancel()
                            with contextlib.suppress(asyncio.CancelledError, Exception):
                                await load_task
                self.progress("draining in-flight streams")
                cancelled = await generator.drain(exp.safety.drain_timeout)
                if cancelled:
                    journal.append(Note(topic="drain", t=time.monotonic_ns(), data={"cancelled_streams": cancelled}))
                self.progress(f"cleanup window {exp.safety.cleanup_window:g}s")
                await asyncio.sleep(exp.safety.cleanup_window)
        except asyncio.CancelledError:
            main_task.uncancel()
            if self.interrupted is None:
                raise
            status, error, exit_code = "interrupted", f"interrupted by {self.interrupted}", 4
        except TimeoutError as exc:
            if run_deadline is not None and run_deadline.expired():
                error = f"the run exceeded safety.max_duration ({exp.safety.max_duration:g}s) plus the target's startup_timeout"
            else:
                error = f"a step of the run timed out: {exc!r}"
            status, exit_code = "failed", 4
        except ChaosError as exc:
            status, error, exit_code = "failed", str(exc), exc.exit_code
            journal.append(Note(topic="run_error", t=time.monotonic_ns(), data={"error": str(exc), "type": type(exc).__name__}))
        except Exception as exc:  # a bug of ours or of a library: still revert, record and report it
            import traceback

            (self.out_dir / "runner-error.txt").write_text(traceback.format_exc(), encoding="utf-8")
            status, error, exit_code = "failed", f"internal error {type(exc).__name__}: {exc} (traceback in runner-error.txt)", 4
            journal.append(Note(topic="run_error", t=time.monotonic_ns(), data={"error": error, "type": type(exc).__name__}))
        finally:
            self.cleaning = True  # from here a signal is noted, not acted on: every step below is bounded
            revert_errors = await self._revert_all()
            if generator is not None:
                with contextlib.suppress(Exception):
                    await generator.drain(0.0)
                with contextlib.suppress(Exception):
                    await generator.aclose()
            if scraper is not None:
                await scraper.stop()
            if proxy is not None:
                with contextlib.suppress(Exception):
                    await proxy.stop()
            if target is not None:
                with contextlib.suppress(Exception):
                    await target.stop()
            for task in (lease_task, telemetry_task):
                if task is not None:
                    task.cancel()
            self._restore_signal_handlers(installed)
        if revert_errors and exit_code == 0:
            status, exit_code = "failed", 4
            error = "; ".join(revert_errors)
        lag = generator.lag_stats() if generator is not None else {}
        if generator is not None and lag:  # per phase, the open loop's own send delay (empty in closed loop)
            lag["send_delay"] = generator.send_delay_stats()
        obs = journal.observations
        if lag:
            journal.append(Note(topic="client_lag", t=time.monotonic_ns(), data=lag))
        verdicts: list[Verdict] = []
        if status == "completed":
            from chaos.verify import judge_all

            verdicts = judge_all(exp, obs, client_lag=lag)
            exit_code = exit_code_for(verdicts)
        journal.close(status)
        if watchdog is not None:
            with contextlib.suppress(Exception):
                watchdog.wait(timeout=5)
        result = Result(
            experiment=exp, verdicts=verdicts, observations=obs, out_dir=self.out_dir, status=status,
            exit_code=exit_code, started=started, ended=time.time(), target=target.info if target else None,
            proxy=proxy.info if proxy else None, client_lag=lag, error=error,
        )
        from chaos.report import write_reports

        write_reports(result)
        return result

    async def _timeline(self, exp: Any, env: FaultEnv, generator: Any, loads: list[asyncio.Task[None]]) -> None:
        """Phases in order: inject, hold, revert. Streams join a phase as it begins, before its
        injects, so a stream the new phase's faults may touch is never counted in the phase before
        (a fault phase may hold a few streams sent while its faults were going in). The load itself
        starts only after the first phase's injects."""
        assert self.journal is not None
        t_first = time.monotonic_ns()
        for phase in exp.phases:
            t_start = time.monotonic_ns()
            end = t_start + int(phase.duration * 1e9)
            env.phase = phase.name
            generator.phase = phase.name
            self.journal.append(PhaseWindow(phase.name, t_start))
            self.progress(f"phase {phase.name} ({phase.duration:g}s, {len(phase.faults)} fault(s))")
            for fault in phase.faults:
                await self._inject(fault, phase.name, env)
            if not loads:
                loads.append(asyncio.create_task(generator.run(t_first + int(exp.duration * 1e9)), name="load"))
            await asyncio.sleep(max(0.0, (end - time.monotonic_ns()) / 1e9))
            errors = await self._revert_all()
            self.journal.append(PhaseWindow(phase.name, t_start, time.monotonic_ns()))
            if errors:
                raise FaultRevertFailed("; ".join(errors))

    async def _inject(self, fault: Fault, phase: str, env: FaultEnv) -> None:
        assert self.journal is not None
        undo = fault.plan(env)
        self.journal.append(FaultEvent(fault.name, fault.kind, "plan", time.monotonic_ns(), phase, undo=undo), durable=True)
        self.active.append((fault, phase))
        injecting = asyncio.ensure_future(fault.inject(env))
        try:
            evidence = await asyncio.shield(injecting)
        except asyncio.CancelledError:
            # Interrupted mid-inject: let the inject finish (a clock lock in a worker thread would
            # otherwise land after its revert), journal what it did, then go on unwinding.
            await asyncio.wait({injecting}, timeout=REVERT_TIMEOUT_S)
            if injecting.done() and not injecting.cancelled() and injecting.exception() is None:
                late = injecting.result()
                late_undo = late.pop("undo", {}) if isinstance(late, dict) else {}
                self.journal.append(FaultEvent(fault.name, fault.kind, "inject", time.monotonic_ns(), phase, evidence=late, undo=late_undo), durable=True)
            raise
        except (ChaosError, OSError) as exc:
            self.journal.append(FaultEvent(fault.name, fault.kind, "error", time.monotonic_ns(), phase, message=f"inject: {exc}"), durable=True)
            if isinstance(exc, ChaosError):
                raise
            raise FaultError(f"fault {fault.name} ({fault.kind}) could not be injected: {exc}") from exc
        extra_undo = evidence.pop("undo", {}) if isinstance(evidence, dict) else {}
        self.journal.append(FaultEvent(fault.name, fault.kind, "inject", time.monotonic_ns(), phase, evidence=evidence, undo=extra_undo), durable=True)

    async def _revert_all(self) -> list[str]:
        """Revert every active fault, newest first; never raises; returns the failures."""
        errors: list[str] = []
        while self.active:
            fault, phase = self.active.pop()
            assert self.env is not None and self.journal is not None
            try:
                async with asyncio.timeout(REVERT_TIMEOUT_S):
                    evidence = await asyncio.shield(fault.revert(self.env))
            except (Exception, asyncio.CancelledError) as exc:  # a revert must not stop the others
                message = f"revert of {fault.name} ({fault.kind}) failed: {exc!r}; run `streamchaos rollback {self.out_dir}`"
                errors.append(message)
                self.journal.append(FaultEvent(fault.name, fault.kind, "error", time.monotonic_ns(), phase, message=message), durable=True)
                continue
            self.journal.append(FaultEvent(fault.name, fault.kind, "revert", time.monotonic_ns(), phase, evidence=evidence), durable=True)
        return errors

    def _sink(self, record: Any) -> None:
        assert self.journal is not None
        self.journal.append(record)

    # -- signals --------------------------------------------------------------------------------
    def _install_signal_handlers(self, task: asyncio.Task[Any]) -> list[int]:
        if not self.handle_signals:
            return []
        loop = asyncio.get_running_loop()
        installed: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig, task)
                installed.append(sig)
            except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
                pass
        return installed

    def _on_signal(self, sig: int, task: asyncio.Task[Any]) -> None:
        if self.cleaning:
            self.progress(f"{signal.Signals(sig).name}: already reverting and stopping")
            return
        if self.interrupted is None:
            self.interrupted = signal.Signals(sig).name
            self.progress(f"{self.interrupted}: reverting faults and stopping")
            task.cancel()

    def _restore_signal_handlers(self, installed: list[int]) -> None:
        loop = asyncio.get_running_loop()
        for sig in installed:
            loop.remove_signal_handler(sig)


def exit_code_for(verdicts: list[Verdict]) -> int:
    """0 all as expected, 1 an SLA not as expected (decisively), 3 inconclusive (DESIGN.md)."""
    if any(v.status != "inconclusive" and not v.ok for v in verdicts):
        return 1
    if any(v.status == "inconclusive" for v in verdicts):
        return 3
    return 0


def _target_facts(info: TargetInfo) -> dict[str, Any]:
    return {
        "kind": info.kind, "base_url": info.base_url, "metrics_url": info.metrics_url, "admin_url": info.admin_url,
        "pid": info.pid, "device": info.device, "model": info.model, "metrics": bool(info.metrics_url),
    }


def _save_experiment(exp: Any, out_dir: Path) -> None:
    """Keep the experiment beside its journal so `verify` can re-judge the run later."""
    if exp.source and Path(exp.source).is_file():
        shutil.copyfile(exp.source, out_dir / "experiment.yaml")
    raw = getattr(exp, "raw", None)
    if raw is not None and not (out_dir / "experiment.yaml").exists():
        import yaml

        (out_dir / "experiment.yaml").write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")


def _start_watchdog(run_dir: Path, max_duration: float) -> subprocess.Popen[bytes]:
    (run_dir / "lease").touch()
    return subprocess.Popen(
        [sys.executable, "-m", "chaos.watchdog", str(run_dir), "--pid", str(os.getpid()), "--max-seconds", str(int(max_duration + 600))],
        start_new_session=True,  # it must outlive us if we are killed
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(run_dir / "watchdog.log", "ab"),
    )


async def _warm_up(info: TargetInfo, api_key: str | None) -> dict[str, Any]:
    """One small request before measuring, so first-request costs (lazy init, first kernels) do
    not land in the baseline phase as a fake stall."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    started = time.monotonic()
    try:
        async with httpx.AsyncClient(timeout=30.0, headers=headers) as client:
            response = await client.post(info.base_url + "/completions", json={"model": info.model, "prompt": "warm up", "max_tokens": 4})
        return {"status": response.status_code, "seconds": round(time.monotonic() - started, 4)}
    except httpx.HTTPError as exc:
        return {"error": repr(exc), "seconds": round(time.monotonic() - started, 4)}


GPU_TELEMETRY_PERIOD_S = 1.0


async def _start_gpu_telemetry(sink: Callable[[Any], None]) -> asyncio.Task[None] | None:
    """Sample SM clock, clock-event reasons, memory and power once a second when NVML answers."""
    from faults.gpu import GpuTelemetry

    telemetry = GpuTelemetry()
    if not await asyncio.to_thread(telemetry.available):
        return None

    async def poll() -> None:
        try:
            while True:
                try:
                    for sample in await asyncio.to_thread(telemetry.sample):
                        sink(sample)
                except ChaosError as exc:
                    sink(Note(topic="gpu_telemetry_error", t=time.monotonic_ns(), data={"error": str(exc)}))
                    return
                await asyncio.sleep(GPU_TELEMETRY_PERIOD_S)
        finally:
            telemetry.close()

    return asyncio.create_task(poll(), name="gpu-telemetry")


async def _renew_lease(run_dir: Path) -> None:
    lease = run_dir / "lease"
    while True:
        with contextlib.suppress(OSError):
            os.utime(lease)
        await asyncio.sleep(LEASE_PERIOD_S)


async def run_async(
    experiment: Any, *, target_url: str | None = None, out_dir: str | Path | None = None,
    seed: int | None = None, progress: Callable[[str], None] | None = None, handle_signals: bool = True,
) -> Result:
    """Run an experiment (an ``Experiment`` or a path to its YAML) and return the ``Result``."""
    if isinstance(experiment, (str, Path)):
        from chaos.experiment import load_experiment

        experiment = load_experiment(experiment)
    if seed is not None:
        experiment = replace(experiment, seed=seed)
    return await Runner(experiment, target_url=target_url, out_dir=out_dir, progress=progress, handle_signals=handle_signals).run()


def run(experiment: Any, **kwargs: Any) -> Result:
    """Synchronous twin of ``run_async``."""
    return asyncio.run(run_async(experiment, **kwargs))
