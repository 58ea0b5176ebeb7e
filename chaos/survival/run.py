"""``streamchaos survival``: the target and the path brought up once, a baseline stream, each
dimension searched by bisection within one time budget, everything torn down, and the run directory
written (``survival.json``, ``report.html``, ``journal.jsonl`` with the hops' processes and taps).

The rules act on the innermost stream hop (the one nearest the target), so every hop between it and
the load is under test: the path must end with a stream hop, and nothing else is needed of it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.model.context import HopInfo
from chaos.model.errors import ChaosError, SetupFailed, UsageError
from chaos.model.experiment import Experiment, HopSpec
from chaos.survival.probe import DIMENSIONS, Dimension, Prober
from chaos.survival.search import Budget, SearchResult, Trial, bisect, result_of

__all__ = ["PROBE_MAX_TOKENS", "SurvivalResult", "SurvivalSettings", "as_dict", "check_path", "search_survival",
           "summary_lines"]

PROBE_MAX_TOKENS = 16  # a probe's stream is short: its length is not what is measured, the hold or silence is


@dataclass(frozen=True)
class SurvivalSettings:
    """What the command line asked for: durations in seconds."""

    dimensions: tuple[str, ...] = tuple(DIMENSIONS)
    max_s: float = 120.0
    resolution_s: float = 1.0
    budget_s: float = 600.0
    keepalive_s: float = 2.0

    def problems(self) -> list[str]:
        """What is wrong with these settings, as usage errors."""
        found = [f"--dimensions: unknown dimension {d!r}; known: {', '.join(DIMENSIONS)}"
                 for d in self.dimensions if d not in DIMENSIONS]
        if not self.dimensions:
            found.append(f"--dimensions: name at least one of {', '.join(DIMENSIONS)}")
        for flag, value in (("--max", self.max_s), ("--resolution", self.resolution_s), ("--budget", self.budget_s),
                            ("--keepalive", self.keepalive_s)):
            if not value > 0:
                found.append(f"{flag}: must be a positive duration, found {value:g}s")
        if self.resolution_s >= self.max_s > 0:
            found.append(f"--resolution ({self.resolution_s:g}s) must be below --max ({self.max_s:g}s)")
        return found


@dataclass
class SurvivalResult:
    """Each dimension's search, the baseline stream, the path as it ran, and the exit code."""

    experiment: Experiment
    settings: SurvivalSettings
    out_dir: Path
    started: float
    ended: float = 0.0
    path: list[dict[str, Any]] = field(default_factory=list)  # name, kind, version per hop, load side first
    rule_hop: str = ""
    baseline: Trial | None = None
    results: dict[str, SearchResult] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    interrupted: bool = False

    @property
    def not_finished(self) -> list[str]:
        return [d for d in self.settings.dimensions if d not in self.results or not self.results[d].finished]

    @property
    def exit_code(self) -> int:
        """4 the search could not be carried out, 3 a dimension was not finished (the budget), else 0."""
        if self.errors or self.interrupted:
            return 4
        return 3 if self.not_finished else 0


def check_path(experiment: Experiment) -> HopSpec:
    """The innermost hop, a stream hop; else a usage error (exit 2) naming the ``path:`` item to add."""
    where = experiment.source or experiment.name
    add = "{kind: stream, name: inner}"
    if not experiment.path:
        raise UsageError(f"{where}: survival needs a path ending with a stream hop (the rules act on it); add "
                         f"`path: [{add}]` (with the gateways under test before it, load side first)")
    last = experiment.path[-1]
    if last.kind != "stream":
        raise UsageError(f"{where}: path ends with {last.name!r} ({last.kind}); survival sets its rules on a stream "
                         f"hop nearest the target: add `- {add}` as the last item of path:")
    if not last.tap:
        raise UsageError(f"{where}: path hop {last.name!r} has tap: false; survival names the hop that cut from the "
                         "stream hops' taps: remove `tap: false`")
    return last


async def search_survival(experiment: Experiment, *, out_dir: Path, settings: SurvivalSettings,
                          target_url: str | None = None, api_key_env: str | None = None,
                          say: Callable[[str], None] = print, handle_signals: bool = True) -> SurvivalResult:
    """Search every dimension of ``settings`` on the experiment's path; the run directory is ``out_dir``.
    ``handle_signals``: SIGINT and SIGTERM stop the search (``_stopped_by_signals``)."""
    from chaos.execution.credentials import resolve as resolve_credentials
    from chaos.execution.journal import prepare_run_dir
    from chaos.model.allowlist import enforce as enforce_allowed_targets

    problems = settings.problems()
    if problems:
        raise UsageError("; ".join(problems))
    check_path(experiment)
    spec = experiment.target
    credentials = resolve_credentials(spec.api_key, spec.api_key_env, spec.metrics_auth, cli_api_key_env=api_key_env)
    enforce_allowed_targets(experiment, target_url=target_url)
    prepare_run_dir(out_dir)
    budget = Budget(settings.budget_s)
    result = SurvivalResult(experiment, settings, out_dir, time.time())
    with _stopped_by_signals(handle_signals) as stopped:
        try:
            async with _brought_up(experiment, out_dir, target_url, credentials.api_key, settings, say) as prober:
                result.path = [{"name": h.name, "kind": h.kind, "version": h.version} for h in prober.path]
                result.rule_hop = prober.path[-1].name
                await _search(prober, result, budget, say)
        except ChaosError as exc:
            result.errors.append(str(exc))
        except (KeyboardInterrupt, asyncio.CancelledError):  # SIGINT/SIGTERM: everything is down; say what was found
            result.interrupted = True
            task = asyncio.current_task()
            if stopped and task is not None:
                task.uncancel()  # our own cancel, handled here: the report is still written after it
    result.ended = time.time()
    return result


@contextlib.contextmanager
def _stopped_by_signals(enabled: bool) -> Iterator[list[signal.Signals]]:
    """While entered, SIGINT and SIGTERM cancel the search's task (the first one; later ones are noted):
    it unwinds, the target and the path are stopped, and what was found is written, as ``run`` and
    ``capacity`` do. Without this SIGTERM (``timeout``, a CI cancel, a service manager) killed the
    process outright, and SIGINT did nothing where it started ignored (``cmd &`` in a script). Off
    where the loop cannot take signal handlers (not the main thread) or ``enabled`` is False."""
    got: list[signal.Signals] = []
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        got.append(sig)
        if len(got) == 1 and task is not None:
            task.cancel(f"{sig.name}: stopping the search")

    for sig in (signal.SIGINT, signal.SIGTERM) if enabled else ():
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except (RuntimeError, ValueError, NotImplementedError):  # not the main thread, or no signals here
            continue
        installed.append(sig)
    try:
        yield got
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


@contextlib.asynccontextmanager
async def _brought_up(experiment: Experiment, out_dir: Path, target_url: str | None, api_key: str | None,
                      settings: SurvivalSettings, say: Callable[[str], None]) -> AsyncIterator[Prober]:
    """The target and the path, up while entered (journaled in ``out_dir``), and a prober for them."""
    from dataclasses import replace

    from chaos.execution.journal import JOURNAL_NAME, Journal
    from chaos.execution.path import running_path
    from chaos.execution.preflight import learn_engine
    from chaos.execution.proxy import RunOwner
    from chaos.targets.base import BuiltinStack
    from chaos.targets.registry import start_target, started

    journal = Journal(out_dir / JOURNAL_NAME, experiment.name, time.monotonic_ns(), time.time())
    status = "failed"
    try:
        say(f"starting target ({target_url or experiment.target.url or experiment.target.kind})")
        made = start_target(replace(experiment.target, api_key=api_key), target_url=target_url, run_dir=out_dir,
                            seed=experiment.seed, run_id=journal.run_id, record=journal.resource)
        async with started(made) as target:
            info = target.info
            found = await learn_engine(experiment.load, base_url=info.base_url, metrics_url=info.metrics_url,
                                       model=experiment.load.model or info.model, seed=experiment.seed,
                                       api_key=api_key, metrics_headers=None, engine=experiment.target.engine,
                                       started_builtin=isinstance(target, BuiltinStack))
            say(f"starting the path ({' -> '.join(h.name for h in experiment.path)})")
            owner = RunOwner(run_id=journal.run_id, run_dir=out_dir, record=journal.resource)
            async with running_path(experiment, info, out_dir, journal.resource, owner=owner,
                                    emit=journal.append) as handle:
                prober = _prober(experiment, handle, found, experiment.load.model or info.model, api_key, settings,
                                 out_dir)
                prober.sink = journal.append
                yield prober
        status = "finished"
    except (KeyboardInterrupt, asyncio.CancelledError):
        status = "interrupted"
        raise
    finally:
        journal.close(status)


def _prober(experiment: Experiment, handle: Any, found: Any, model: str, api_key: str | None,
            settings: SurvivalSettings, out_dir: Path) -> Prober:
    """Probes of the path as it came up: the load's request (as the preflight settled it, its stream
    kept short) sent through the first hop, the rules set on the innermost stream hop."""
    from dataclasses import replace

    from chaos.hops.client import StreamHopAPI
    from chaos.load.workload import Workload, endpoint_url

    hops = handle.hops
    inner = hops[-1]
    if inner.control_url is None or inner.control_token is None:
        raise SetupFailed(f"path hop {inner.name!r} came up without a control API: no rule can be set on it")
    load = found.preflight.load
    lo, hi = load.max_tokens
    load = replace(load, max_tokens=(min(lo, PROBE_MAX_TOKENS), min(hi, PROBE_MAX_TOKENS)))
    body, _ = Workload(load, model=model, seed=experiment.seed).request(0)
    return Prober(path=hops, api=StreamHopAPI(inner.control_url, inner.control_token),
                  url=endpoint_url(handle.load_base_url, load.endpoint), body=body,
                  taps=_taps_files(hops, out_dir), api_key=api_key, end_rule=found.profile.end,
                  keepalive_s=settings.keepalive_s, resolution_s=settings.resolution_s, seed=experiment.seed,
                  request_ids=load.request_ids)


def _taps_files(hops: Sequence[HopInfo], out_dir: Path) -> dict[str, Path]:
    """Each tapping stream hop's taps file, by hop name: where ``chaos.hops.process.start_stream_hop``
    puts it (``run_dir/hops/<name>.taps.jsonl``), read while the path runs, probe by probe."""
    return {h.name: out_dir / "hops" / f"{h.name}.taps.jsonl" for h in hops if h.kind == "stream" and h.taps}


async def _search(prober: Prober, result: SurvivalResult, budget: Budget, say: Callable[[str], None]) -> None:
    """The baseline stream, then each dimension in turn, as far as the budget goes."""
    settings = result.settings
    result.baseline = base = await prober.baseline()
    if base.outcome != "whole":
        raise SetupFailed(f"the path does not deliver a whole stream with no rule set: {base.detail.get('client_saw')}"
                          f" (cut by {base.detail.get('cut_by', 'unknown')}); fix the path before measuring it")
    say(f"baseline: whole in {base.wall_s:.2f}s")
    for name in settings.dimensions:
        dim = DIMENSIONS[name]
        say(f"{name}: {dim.what}")
        seen: list[Trial] = []

        async def probe(duration_s: float, dim: Dimension = dim, seen: list[Trial] = seen) -> Trial:
            trial = await prober(dim, duration_s)
            seen.append(trial)
            say(f"  {duration_s:g}s: {_line(trial)}")
            return trial

        try:
            found = await bisect(probe, max_s=settings.max_s, resolution_s=settings.resolution_s, budget=budget)
        except (KeyboardInterrupt, asyncio.CancelledError):  # keep what this dimension had found
            result.results[name] = result_of(seen, False, "not finished: interrupted", settings.resolution_s)
            raise
        result.results[name] = found
        say(f"  -> {_summary(found)}")


def _line(trial: Trial) -> str:
    if trial.outcome == "whole":
        return f"whole [{trial.wall_s:.1f}s]"
    if trial.outcome == "error":
        return f"could not run: {trial.detail.get('error')}"
    return f"cut by {trial.detail.get('cut_by')}: {trial.detail.get('client_saw')} [{trial.wall_s:.1f}s]"


def _cut_trial(found: SearchResult) -> Trial | None:
    cut = found.boundary.shortest_cut
    return next((t for t in found.trials if t.outcome == "cut" and t.duration_s == cut), None)


def _summary(found: SearchResult) -> str:
    b = found.boundary
    at = _cut_trial(found)
    by = "" if at is None else f", cut by {at.detail.get('cut_by')} ({at.detail.get('client_saw')})"
    return f"longest whole {_s(b.longest_whole)}, shortest cut {_s(b.shortest_cut)}{by}: {found.why}"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:g}s"


def summary_lines(result: SurvivalResult) -> list[str]:
    lines = [f"{name}: {_summary(found)}" for name, found in result.results.items()]
    lines += [f"{name}: not searched (the search stopped before it)" for name in result.settings.dimensions
              if name not in result.results]
    return lines + [f"error: {e}" for e in result.errors]


def _probe_dict(trial: Trial) -> dict[str, Any]:
    detail = dict(trial.detail)
    return {"duration_s": trial.duration_s, "outcome": trial.outcome, "wall_s": round(trial.wall_s, 3),
            "hint_s": None if trial.hint_s is None else round(trial.hint_s, 3), "cut_by": detail.get("cut_by"),
            "client_saw": detail.get("client_saw"), "how": detail.get("how"), "request_id": detail.get("request_id"),
            "wire_id": detail.get("wire_id"), "error": detail.get("error"), "taps": detail.get("taps")}


def _dimension_dict(name: str, found: SearchResult | None) -> dict[str, Any]:
    dim = DIMENSIONS[name]
    if found is None:
        return {"dimension": name, "what": dim.what, "finished": False, "why": "not searched: the search stopped "
                "before it", "longest_whole_s": None, "shortest_cut_s": None, "resolution_s": None,
                "survives_max": False, "cut_by": None, "client_saw": None, "non_monotonic": [], "probes": []}
    b, at = found.boundary, _cut_trial(found)
    return {"dimension": name, "what": dim.what, "finished": found.finished, "why": found.why,
            "longest_whole_s": b.longest_whole, "shortest_cut_s": b.shortest_cut,
            "resolution_s": None if b.gap_s is None else round(b.gap_s, 3), "survives_max": found.survives_max,
            "cut_by": None if at is None else at.detail.get("cut_by"),
            "client_saw": None if at is None else at.detail.get("client_saw"),
            "how": None if at is None else at.detail.get("how"),
            "non_monotonic": list(b.non_monotonic), "probes": [_probe_dict(t) for t in found.trials]}


def as_dict(result: SurvivalResult) -> dict[str, Any]:
    """What survival.json holds."""
    s = result.settings
    return {"kind": "survival", "experiment": result.experiment.name, "path": result.path,
            "rule_hop": result.rule_hop, "max_s": s.max_s, "resolution_s": s.resolution_s,
            "keepalive_s": s.keepalive_s, "budget_s": s.budget_s,
            "took_s": round((result.ended or time.time()) - result.started, 2),
            "baseline": None if result.baseline is None else _probe_dict(result.baseline),
            "dimensions": [_dimension_dict(name, result.results.get(name)) for name in s.dimensions],
            "not_finished": result.not_finished, "errors": list(result.errors), "interrupted": result.interrupted,
            "exit_code": result.exit_code}


def write_survival_report(body: dict[str, Any], out_dir: Path) -> list[Path]:
    """survival.json and report.html in ``out_dir`` (0600, never through a link)."""
    from chaos.host.runfiles import write_new
    from chaos.output.reports.survival import render_survival

    json_path, html_path = out_dir / "survival.json", out_dir / "report.html"
    write_new(json_path, json.dumps(body, indent=2, default=str) + "\n")
    write_new(html_path, render_survival(body))
    return [json_path, html_path]


def dimensions_of(text: str) -> tuple[str, ...]:
    """``hold,hold_keepalive`` or ``all`` → the dimension names, in the order given."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    return tuple(DIMENSIONS) if names in ((), ("all",)) else names


def summary_text(body: dict[str, Any], out_dir: Path) -> str:
    """The terminal's summary of a finished search, from its ``survival.json`` body."""
    lines = []
    for dim in body["dimensions"]:
        by = f", cut by {dim['cut_by']} ({dim['client_saw']})" if dim.get("cut_by") else ""
        lines.append(f"{dim['dimension']}: longest whole {_s(dim['longest_whole_s'])}, shortest cut "
                     f"{_s(dim['shortest_cut_s'])}{by}: {dim['why']}")
    lines += [f"error: {e}" for e in body["errors"]]
    if body["interrupted"]:
        lines.append("interrupted: the target and the path were stopped; what was found is above")
    unfinished = f"; not finished: {', '.join(body['not_finished'])}" if body["not_finished"] else ""
    probes = sum(len(d["probes"]) for d in body["dimensions"])
    lines.append(f"probes: {probes} in {body['took_s']:.0f}s (budget {body['budget_s']:.0f}s){unfinished}; "
                 f"report: {out_dir / 'report.html'}")
    return "\n".join(lines)
