"""One probe: the experiment cut down to a warm-up and one judged window at one load level, the
case's faults in force in the window, run as a real experiment run (its own run directory,
journal, watchdog and rollback; a builtin target is a fresh stack each time), and its outcome."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from chaos.execution.result import Result
from chaos.experiment.loader import BASELINE_S
from chaos.host.capped import METRICS_LIMIT, get_capped
from chaos.host.tls import tls_context
from chaos.model.capacity import BASELINE_CASE, CapacitySpec, Probe, ProbeOutcome
from chaos.model.context import HaltSpec
from chaos.model.engines import PROFILES
from chaos.model.experiment import Experiment, Fault, PhaseSpec, SlaEntry
from chaos.model.observations import Observations
from chaos.targets.scraper import parse_exposition

__all__ = ["WARMUP", "WINDOW", "Case", "cases_of", "judged_entries", "outcome_of", "probe_dir", "probe_experiment",
           "pre_load_kv", "probe_halts", "probe_of", "settle", "shares_target"]

WARMUP, WINDOW = "warmup", "probe"  # the probe run's two phases
SETTLE_POLL_S = 0.5
SETTLE_READ_DEADLINE_S = 5.0  # one /metrics answer, read whole (byte-capped: chaos.host.capped)
# A probe's own halts (capacity.halt_factor) read every stream it has ended so far, warm-up included,
# and decide nothing before this many: a transient in the first seconds is not the window's quantile.
HALT_MIN_STREAMS = 20
KV_IDLE_TOLERANCE = 1e-6  # KV usage "back": at the idle level (blocks exact, a fraction to rounding)


@dataclass(frozen=True)
class Case:
    """What is in force during a probe's window: nothing (the baseline) or one phase's faults."""

    name: str
    faults: tuple[Fault, ...]


def cases_of(experiment: Experiment, spec: CapacitySpec) -> list[Case]:
    """The cases asked for, in order; default the baseline and every phase with faults. Pure."""
    faulted = {p.name: p.faults for p in experiment.phases if p.faults}
    names = list(spec.cases) or [BASELINE_CASE, *faulted]
    return [Case(name, () if name == BASELINE_CASE else faulted[name]) for name in dict.fromkeys(names)]


def judged_entries(experiment: Experiment, spec: CapacitySpec) -> tuple[SlaEntry, ...]:
    """The SLA entries every probe must pass: those named, else every entry that judges one window. Pure."""
    fit = [e for e in experiment.sla if e.expect == "pass" and e.spec.capacity_fit]
    return tuple(e for e in fit if not spec.slas or e.name in spec.slas)


def probe_experiment(experiment: Experiment, spec: CapacitySpec, case: Case, level: float,
                     window_s: float) -> Experiment:
    """The experiment a probe runs. Pure. It keeps the target, proxy, prompts and request shape; its
    load is the level (closed or open loop), its phases a warm-up and the window, its SLAs the judged
    entries scoped to the window, its hard stop what those need."""
    load = (replace(experiment.load, concurrency=int(level), rate=None, max_requests=None) if spec.integer
            else replace(experiment.load, rate=level, concurrency=None, max_requests=None))
    warmup = (PhaseSpec(WARMUP, spec.warmup),) if spec.warmup > 0 else ()
    phases = (*warmup, PhaseSpec(WINDOW, window_s, case.faults))
    sla = tuple(replace(e, phases=(WINDOW,)) for e in judged_entries(experiment, spec))
    safety = experiment.safety
    needed = BASELINE_S + spec.warmup + window_s + safety.drain_timeout + safety.cleanup_window
    halts = probe_halts(sla, spec, BASELINE_S + spec.warmup + window_s)
    safety = replace(safety, max_duration=max(safety.max_duration, needed + 30.0), halt_on=(*safety.halt_on, *halts))
    # never the whole experiment's text or source: the run keeps its text for `verify`, which would
    # judge the whole experiment; the probe's own text, when it reads back as this probe, instead
    probe = replace(experiment, name=f"{experiment.name} capacity {case.name} at {level:g}", load=load, phases=phases,
                    sla=sla, safety=safety, capacity=None, source=None, text=None)
    return replace(probe, text=probe_text(experiment, probe, case))


def probe_text(experiment: Experiment, probe: Experiment, case: Case) -> str | None:
    """The probe as experiment YAML, for its run directory (so `verify` can re-judge a probe): the
    experiment's own text with the load, phases, SLA scopes and safety the probe runs with. None when
    it would not read back as exactly ``probe`` (then the run keeps no experiment.yaml, as before)."""
    import yaml

    from chaos.experiment.loader import experiment_from_dict
    from chaos.model.errors import ExperimentInvalid

    if experiment.text is None:
        return None
    try:
        raw = yaml.safe_load(experiment.text)
    except yaml.YAMLError:
        return None
    if not isinstance(raw, dict):
        return None
    raw["name"] = probe.name
    raw.pop("capacity", None)
    load = dict(raw.get("load") or {})
    for key in ("concurrency", "rate", "max_requests"):
        load.pop(key, None)
    if probe.load.concurrency is not None:
        load["concurrency"] = probe.load.concurrency
    else:
        load["rate"] = probe.load.rate
    if isinstance(load.get("prompts"), dict) and probe.load.prompts.source != "synthetic":
        load["prompts"] = {**load["prompts"], "source": probe.load.prompts.source}  # resolved: read from anywhere
    raw["load"] = load
    phases = [p for p in raw.get("phases") or [] if isinstance(p, dict)]
    faults = next((p.get("faults") for p in phases if p.get("name") == case.name), None)
    raw["phases"] = [{"name": p.name, "duration": _seconds(p.duration),
                      **({"faults": faults} if p.faults and faults else {})} for p in probe.phases]
    kept = {e.name for e in probe.sla}
    # one parsed entry per written one, in order (a mismatch cannot read back as the probe: None below)
    raw["sla"] = [{**entry, "phases": [WINDOW]} for entry, parsed in zip(raw.get("sla") or [], experiment.sla,
                                                                         strict=False)
                  if isinstance(entry, dict) and parsed.name in kept]
    safety = dict(raw.get("safety") or {})
    safety["max_duration"] = _seconds(probe.safety.max_duration)
    own = probe.safety.halt_on[len(experiment.safety.halt_on):]
    safety["halt_on"] = [*(safety.get("halt_on") or []), *(_halt_dict(h) for h in own)]
    if not safety["halt_on"]:
        safety.pop("halt_on")
    raw["safety"] = safety
    try:
        again = experiment_from_dict(raw, "<probe>")
    except ExperimentInvalid:
        return None
    return again.text if again == probe else None


def _seconds(value: float) -> str:
    return f"{value!r}s"  # exact: the text must read back as the probe, to the last bit


def _halt_dict(halt: HaltSpec) -> dict[str, Any]:
    above: float | str = _seconds(halt.above) if halt.kind == "ttft" else halt.above  # a duration, or a share
    extra = {"quantile": halt.quantile} if halt.kind == "ttft" else {}
    return {"kind": halt.kind, "name": halt.name, "above": above, "window": _seconds(halt.window),
            "min_streams": halt.min_streams, **extra}


def probe_halts(entries: Sequence[SlaEntry], spec: CapacitySpec, span_s: float) -> tuple[HaltSpec, ...]:
    """The halts that stop a probe which has clearly failed, one per entry they can speak for. Pure.

    A probe over capacity queues: its TTFT grows through the window, correlated, and the interval
    of a p50 at 17x its budget can still be undecided (a lengthened rerun, then "not met"), while the
    run drains a long queue. Its halt reads every stream ended so far (``span_s``: the whole probe),
    so a short spike is diluted, and names the entry, which is what bound the probe."""
    if spec.halt_factor <= 0:
        return ()
    halts: list[HaltSpec] = []
    for entry in entries:  # each kind says what halt speaks for it (SlaSpec.probe_halt), if any
        halt = entry.spec.probe_halt(span_s, spec.halt_factor, HALT_MIN_STREAMS)
        if halt is not None:
            halts.append(replace(halt, name=entry.name))
    return tuple(halts)


def outcome_of(result: Result) -> tuple[ProbeOutcome, tuple[str, ...], dict[str, Any], str | None]:
    """(outcome, the entries that decided it, each entry's figures, an error) of a probe run. Pure."""
    figures = {v.name: {"status": v.status, "figure": v.figure, "budget": v.budget, "unit": v.unit,
                        "samples": v.samples} for v in result.verdicts}
    if result.status == "halted":  # a halt condition stopped it (exit 4 for a run): it did not hold the load
        # the reason starts with the halt's name; a probe's own halts are named after their SLA entry
        reason = (result.error or "").removeprefix("halted: ")
        named = reason.split(":", 1)[0].strip()
        entries = {e.name for e in result.experiment.sla}  # a halted run judges nothing: its verdicts are empty
        return "fail", (named if named in entries else "halt",), figures, None
    if result.error or result.exit_code == 4 or result.status in ("interrupted", "failed"):
        return "error", (), figures, result.error or f"the probe run ended {result.status} (exit {result.exit_code})"
    # (an unobservable verdict counts as its entry's when_unobservable says: tolerated, it decides nothing)
    failed = tuple(v.name for v in result.verdicts if v.counts_as == "fail")
    if failed:
        return "fail", failed, figures, None
    unsure = tuple(v.name for v in result.verdicts if v.counts_as == "inconclusive")
    if unsure:
        return "inconclusive", unsure, figures, None
    return "pass", (), figures, None


def probe_of(case: Case, level: float, window_s: float, result: Result, took_s: float) -> Probe:
    outcome, deciding, figures, error = outcome_of(result)
    return Probe(case.name, level, window_s, outcome, deciding, figures, str(result.out_dir), took_s, error)


def shares_target(experiment: Experiment, target_url: str | None) -> bool:
    """Whether the probes all reach one server, which must settle between them: one each probe run does not
    start afresh (``Target.started_by_run``; a URL makes any target remote). Pure."""
    from chaos.targets.registry import target_class

    return not target_class(experiment.target, target_url or experiment.target.url).started_by_run


async def settle(metrics_url: str | None, engine: str, timeout_s: float,
                 headers: dict[str, str] | None = None, idle_kv: float | None = None) -> dict[str, Any]:
    """Wait (up to ``timeout_s``) until a target the probes share is idle, as ``kv_cleanup`` reads idle:
    no request running and its KV usage back to ``idle_kv`` (the lowest an earlier settle saw; before
    any, until it stops falling). The next probe must not start on the last one's queue or blocks."""
    if not metrics_url or timeout_s <= 0:
        return {"waited_s": 0.0, "running": None, "kv_usage": None}
    running_names, usage_names = _running_series(engine), _usage_series(engine)
    started = time.monotonic()
    running: float | None = None
    usage: float | None = None
    before: float | None = None
    async with httpx.AsyncClient(timeout=2.0, trust_env=False, verify=tls_context(), headers=headers) as client:
        while time.monotonic() - started < timeout_s:
            try:
                answer = await get_capped(client, metrics_url, limit=METRICS_LIMIT, deadline=SETTLE_READ_DEADLINE_S)
                if answer.over:
                    raise ValueError(answer.too_large())
                samples = parse_exposition(answer.text, 0, (*running_names, *usage_names))
                running = sum(s.value for s in samples if s.name in running_names)
                usage = _first_present(samples, usage_names)
            except (httpx.HTTPError, ValueError):
                running = usage = None
            if running is not None and running <= 0 and _kv_idle(usage, before, idle_kv):
                break
            before = usage
            await asyncio.sleep(SETTLE_POLL_S)
    return {"waited_s": round(time.monotonic() - started, 3), "running": running, "kv_usage": usage}


def _kv_idle(usage: float | None, before: float | None, idle_kv: float | None) -> bool:
    """KV usage at rest: no series to read, at or under the idle level, or (no idle level yet) no
    longer falling since the last poll. Pure."""
    if usage is None:
        return True
    if idle_kv is not None:
        return usage <= idle_kv + KV_IDLE_TOLERANCE
    return before is not None and usage >= before


def _first_present(samples: Sequence[Any], names: Sequence[str]) -> float | None:
    for name in names:  # the first series the target serves, as kv_cleanup picks it
        values = [s.value for s in samples if s.name == name]
        if values:
            return float(sum(values))
    return None


def pre_load_kv(observations: Observations, engine: str) -> float | None:
    """A probe run's KV usage before its first stream was sent (the first usage series it scraped, the
    lowest value per label set, summed): the shared target's idle level, as ``kv_cleanup`` takes its
    baseline. None without such a sample. Pure."""
    sent = [st.t_sent for st in observations.streams if st.t_sent is not None]
    if not sent:
        return None
    first = min(sent)
    for name in _usage_series(engine):
        lowest: dict[tuple[tuple[str, str], ...], float] = {}
        for m in observations.series(name):
            if m.t < first:
                key = tuple(sorted(m.labels.items()))
                lowest[key] = min(lowest.get(key, m.value), m.value)
        if lowest:
            return float(sum(lowest.values()))
    return None


def _usage_series(engine: str) -> tuple[str, ...]:
    profiles: Sequence[Any] = [PROFILES[engine]] if engine in PROFILES else list(PROFILES.values())
    return tuple(dict.fromkeys(name for p in profiles for name, _ in p.usage_series))


def _running_series(engine: str) -> tuple[str, ...]:
    profiles: Sequence[Any] = [PROFILES[engine]] if engine in PROFILES else list(PROFILES.values())
    return tuple(dict.fromkeys(name for p in profiles for name in p.running_series))


def probe_dir(root: Path, index: int, case: Case, level: float) -> Path:
    return root / "probes" / f"{index:03d}-{case.name}-{level:g}"
