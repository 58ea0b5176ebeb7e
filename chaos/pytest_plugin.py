"""pytest plugin (entry point `pytest11`): fixtures (chaos_run, chaos_capacity, chaos_stack), a marker,
and YAML experiments as test items.

- ``chaos_stack`` (session): a builtin stack started once, as a real child process; yields its URLs
  and its admin token (``admin_headers`` for a request to ``admin_url``).
- ``chaos_run``: runs an experiment (a path, a dict or an ``Experiment``) and returns the ``Result``;
  with ``check=True`` a failed run raises an AssertionError listing the failing verdicts and their
  evidence. Runs in its own thread and event loop, so it works inside pytest-asyncio tests too.
- ``chaos_capacity``: an experiment's ``capacity:`` search (``streamchaos capacity``); returns the
  ``CapacityResult`` (each case's interval, ``exit_code``), capacity.json/.html in its directory.
- ``@pytest.mark.chaos_experiment(path)``: the experiment ``chaos_run()`` runs when given none.
- ini ``streamchaos_experiments``: folders whose ``*.yaml`` experiments are collected as tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

__all__ = ["RunLog", "StackHandle", "failure_message"]

CTRL_C_FORWARDED = 3  # Ctrl-Cs handed to a run (the second forces its exit); one more stops waiting for it
STOP_WAIT_S = 120.0  # how long a run stopped by Ctrl-C is waited for (it reverts, then tears down)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("streamchaos_experiments", "folders whose *.yaml experiments are collected as tests", type="paths",
                  default=[])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos_experiment(path): the experiment the chaos_run fixture runs by default")


def failure_message(result: Any) -> str:
    """Why a run is not OK: its status and every verdict that was not as expected, with evidence."""
    from chaos.output.render import verdict_line

    lines = [f"experiment {result.experiment.name!r}: {result.status}, exit {result.exit_code} ({result.out_dir})"]
    if result.error:
        lines.append(f"  error: {result.error}")
    lines.extend("  " + verdict_line(v) for v in result.failing())
    return "\n".join(lines)


class RunLog:
    """Run listener: the run's progress lines, kept for the test report (shown when a test fails)."""

    def __init__(self) -> None:
        from chaos.output.progress import describe

        self._describe = describe
        self.lines: list[str] = []
        self._t0: int | None = None

    def on_event(self, event: Any) -> None:
        import time

        line = self._describe(event)
        if line is not None:
            now = time.monotonic_ns()
            self._t0 = self._t0 or now
            self.lines.append(f"[{(now - self._t0) / 1e9:6.1f}s] {line}")


def _in_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` (which calls asyncio.run) in a fresh thread: a pytest-asyncio loop may be running here."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="streamchaos-run")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _run_blocking(experiment: Any, *, out_dir: Path, target_url: str | None = None, seed: int | None = None,
                  log: RunLog | None = None) -> Any:
    """Run an experiment in its own thread and loop; Ctrl-C here interrupts it and still reverts.

    The run's own signal handlers need the main thread, where pytest is: while it runs, SIGINT here
    hands each Ctrl-C to the runner in its loop (``runner.interrupt``, as its handler would: the
    first reverts and stops the run, the second forces its exit once the faults are reverted), the
    run is waited for (``STOP_WAIT_S`` at most after a Ctrl-C), and then KeyboardInterrupt is raised
    as pytest expects. A Ctrl-C past ``CTRL_C_FORWARDED`` stops waiting at once.
    """
    from dataclasses import replace

    from chaos.api import runner as make_runner

    if seed is not None:
        experiment = replace(experiment, seed=seed)
    runner = make_runner(experiment, target_url=target_url, out_dir=out_dir, handle_signals=False,
                         listeners=[log] if log else [])
    box: dict[str, Any] = {}
    ctrl_c = _CtrlC(runner)
    ended = threading.Event()  # not Thread.join: on 3.11 a KeyboardInterrupt in join marks the thread ended

    async def main() -> Any:
        ctrl_c.attach(asyncio.get_running_loop())  # a Ctrl-C before this is handed on here
        return await runner.run()

    def target() -> None:
        try:
            box["value"] = asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc
        finally:
            ended.set()

    with _sigint(ctrl_c.on_sigint):
        threading.Thread(target=target, name="streamchaos-run").start()
        ctrl_c.wait(ended)
    if ctrl_c.heard:
        raise KeyboardInterrupt
    if "error" in box:
        raise box["error"]
    return box["value"]


class _CtrlC:
    """Each Ctrl-C of a run in another thread, handed to its runner in the run's loop."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.heard = 0
        self._sent = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.RLock()  # reentrant: the signal handler may run while this thread holds it

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The run's loop is up (called in it): the Ctrl-Cs heard so far go to the runner now."""
        with self._lock:
            self._loop = loop
            self._send()

    def on_sigint(self, signum: int, frame: Any) -> None:
        with self._lock:
            self.heard += 1
            self._send()
        if self.heard > CTRL_C_FORWARDED:
            raise KeyboardInterrupt

    def _send(self) -> None:
        while self._loop is not None and self._sent < min(self.heard, CTRL_C_FORWARDED):
            self._sent += 1
            with contextlib.suppress(RuntimeError):  # the loop closed: the run has ended
                self._loop.call_soon_threadsafe(self.runner.interrupt, "KeyboardInterrupt")

    def wait(self, ended: threading.Event) -> None:
        """Until the run has ended, or ``STOP_WAIT_S`` after the first Ctrl-C (a SIGINT handler runs
        between two waits)."""
        deadline = math.inf
        while not ended.wait(0.2):
            if self.heard and deadline == math.inf:
                deadline = time.monotonic() + STOP_WAIT_S
            if time.monotonic() >= deadline:
                return


@contextlib.contextmanager
def _sigint(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """``handler`` for SIGINT while entered, pytest's given back after (the main thread only: a Ctrl-C
    reaches no other)."""
    try:
        before = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before if before is not None else signal.SIG_DFL)


@dataclass(frozen=True)
class StackHandle:
    url: str  # http://127.0.0.1:PORT
    base_url: str  # .../v1
    metrics_url: str
    admin_url: str
    pid: int
    admin_token: str = field(default="", repr=False)  # the stack's own, random per session; a bearer token

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}


@pytest.fixture(scope="session")
def chaos_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackHandle]:
    """A builtin stack (tiny model, CPU unless CUDA is present) for the whole session."""
    from chaos.experiment import TargetSpec
    from chaos.targets.base import BuiltinStack

    log = tmp_path_factory.mktemp("chaos-stack") / "stack.log"
    stack = BuiltinStack(TargetSpec(), log, seed=0)
    info = _in_thread(lambda: asyncio.run(stack.start()))
    try:
        yield StackHandle(
            url=info.base_url[: -len("/v1")], base_url=info.base_url, metrics_url=info.metrics_url or "",
            admin_url=info.admin_url or "", pid=info.pid or 0, admin_token=info.admin_token or "",
        )
    finally:
        _in_thread(lambda: asyncio.run(stack.stop()))


def _resolve(experiment: Any) -> Any:
    from chaos.experiment import experiment_from_dict, load_experiment

    if isinstance(experiment, (str, Path)):
        return load_experiment(experiment)
    if isinstance(experiment, Mapping):
        return experiment_from_dict(experiment)
    return experiment


@pytest.fixture
def chaos_run(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Any]:
    """``chaos_run(experiment=None, *, target_url=None, check=False, seed=None) -> Result``."""
    marker = request.node.get_closest_marker("chaos_experiment")
    counter = iter(range(1_000_000))

    def runner(experiment: Any = None, *, target_url: str | None = None, check: bool = False,
               seed: int | None = None) -> Any:
        if experiment is None:
            if marker is None:
                raise TypeError("chaos_run() needs an experiment, or mark the test with "
                                "@pytest.mark.chaos_experiment(path)")
            experiment = marker.args[0]
        exp = _resolve(experiment)
        out = tmp_path / f"run{next(counter)}-{exp.name}"
        log = RunLog()
        try:
            result = _run_blocking(exp, out_dir=out, target_url=target_url, seed=seed, log=log)
        finally:
            request.node.add_report_section("call", f"streamchaos run {exp.name}", "\n".join(log.lines))
        if check and not result.ok:
            raise AssertionError(failure_message(result))
        return result

    return runner


@pytest.fixture
def chaos_capacity(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Any]:
    """``chaos_capacity(experiment, *, target_url=None, budget_s=None) -> CapacityResult``: the
    experiment's ``capacity:`` search (``streamchaos capacity``), capacity.json and capacity.html
    written in its directory, one line per probe in the test's report."""
    counter = iter(range(1_000_000))

    def search(experiment: Any, *, target_url: str | None = None, budget_s: float | None = None) -> Any:
        from chaos.capacity.report import write_capacity_report
        from chaos.capacity.run import as_dict, search_capacity

        exp = _resolve(experiment)
        out = tmp_path / f"capacity{next(counter)}-{exp.name}"
        lines: list[str] = []
        try:
            found = _in_thread(lambda: asyncio.run(search_capacity(
                exp, out_dir=out, target_url=target_url, budget_s=budget_s, say=lines.append, handle_signals=False)))
        finally:
            request.node.add_report_section("call", f"streamchaos capacity {exp.name}", "\n".join(lines))
        write_capacity_report(as_dict(found), out)
        return found

    return search


def pytest_collect_file(parent: pytest.Collector, file_path: Path) -> pytest.Collector | None:
    if file_path.suffix not in (".yaml", ".yml"):
        return None
    folders = [Path(p).resolve() for p in parent.config.getini("streamchaos_experiments")]
    if any(file_path.resolve().is_relative_to(folder) for folder in folders):
        return ExperimentFile.from_parent(parent, path=file_path)
    return None


class ExperimentFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        yield ExperimentItem.from_parent(self, name=self.path.stem)


class ExperimentItem(pytest.Item):
    """One YAML experiment run against its own target; fails unless every verdict is as expected."""

    def runtest(self) -> None:
        from chaos.experiment import load_experiment

        exp = load_experiment(self.path)
        # pytest's own factory (private): the one that honours --basetemp and keeps the last runs
        out = self.config._tmp_path_factory.mktemp(f"exp-{self.path.stem}")  # type: ignore[attr-defined]
        log = RunLog()
        try:
            result = _run_blocking(exp, out_dir=out, log=log)
        finally:
            self.add_report_section("call", f"streamchaos run {exp.name}", "\n".join(log.lines))
        self.user_properties.extend((f"{v.name or v.sla}[{v.phase or 'run'}]", v.status) for v in result.verdicts)
        if not result.ok:
            raise ExperimentFailed(failure_message(result))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ExperimentFailed):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, f"experiment {self.path.name}"


class ExperimentFailed(Exception):
    """An experiment collected from YAML did not end as expected."""
