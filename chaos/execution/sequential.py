"""Phases that run until their verdicts decide: the looks, and the confidence each verdict is judged at.

A phase with ``duration: {min, max}`` (or ``until: decided``) runs at least ``min``; then at each look
the SLA entries judged on it are judged on the streams that have ended by the look, and the phase ends at
the first look where every one of them is decided (pass or fail), or at ``max``. Looks come at
geometric times — at ``min``, then each time the phase's elapsed time has grown by ``GROWTH`` (25%),
the last one at ``max`` — so a phase that runs ten times its minimum looks about ten times, not once
a second: every look costs confidence.

Why it costs: a fixed-n interval checked again and again, stopping at the first decisive answer,
is wrong more often than its confidence says (each look adds its own chance of a wrong decision).
Look k spends α_k = α / (k (k + 1)) of the verdict's α = 1 - confidence (``sla.stats.spent_alpha``),
and a phase that made K looks has every verdict judged on it at confidence 1 - α_K
(``sequential_spec``): the α_k sum to less than α over any number of looks, so the verdict the run
stopped on is wrong with chance at most α, as a verdict of a fixed-length phase is.

Which entries count: those scoped to the phase (``phases: [it]``), and entries over the whole run
when the phase is the last one (they are judged on everything sent so far), of kinds that can decide
inside the phase (``SlaSpec.decides_in_phase``: not ``kv_cleanup``, ``abort_propagation``,
``abort_path``, ``capacity`` nor ``throughput``, which need what comes after it). An entry a look
decided is not judged again at later looks (the spending holds whatever rule picks the look to stop
at). The run's verdict of a phase a look stopped judges the streams that had ended by that look
(``PhaseWindow.t_decided``, ``sequential_view``) at 1 - α_K: the look's own data at the look's own
spending, so the run says what the look decided; the streams that ended later are counted in the
evidence (``ended_after_the_deciding_look``), and stay in the journal for every other verdict; an entry
over the whole run, judged at the last phase's looks, is cut at that phase's deciding look alike. The
last look, at max, judges nothing live: the phase ends there whatever it would say, and its verdicts
judge every stream of it at 1 - α_K, those drained after max too, as a fixed phase's do. A phase with
nothing it could wait on runs its min and spends nothing. Pure but for ``run_looks``, which the
runner's timeline awaits; a look judges in a thread, on a snapshot of the journal (it still holds
the GIL: an in-process load's stamps may run late while a look judges thousands of streams).

Left out: a look leaves out the streams still running when it is taken, and a long stream is more
likely to be one of them, so a look's TTFT and ITL quantiles lean short by up to the streams in
flight over those judged (4 of 400 at the shipped loads); the final verdict judges the same set.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar, cast

from chaos.load.uplink import FLUSH_EVERY_S
from chaos.model.observations import NS, Observations, PhaseWindow
from chaos.model.verdict import Verdict

if TYPE_CHECKING:
    from chaos.model.experiment import Experiment, PhaseSpec, SlaCheck, SlaEntry

__all__ = ["GROWTH", "Judge", "LookOutcome", "LookState", "counted_entries", "look", "look_offsets", "run_looks",
           "sequential_evidence", "sequential_spec", "sequential_view", "snapshot"]

GROWTH = 1.25  # a look each time the phase's elapsed time has grown by this factor
MERGE_WITHIN = 1.1  # a look this close to max (as a ratio) is max's
# A load process sends its records on a 0.5 s grid (``chaos.load.uplink``): a stream that ended just before
# a look reaches the journal up to FLUSH_EVERY_S later, and the run's verdict, judged on every stream that
# ended by the look, would count it where the look did not. The look judges the streams that ended by its
# time, on the journal as it stands this long after (the margin: the runner's own loop reading the pipe).
DELIVERY_S = FLUSH_EVERY_S + 0.25
DECIDED = ("pass", "fail", "unobservable")  # (unobservable: more load cannot bring evidence the target cannot show)

_Spec = TypeVar("_Spec", bound="SlaCheck")


def look_offsets(min_s: float, max_s: float) -> list[float]:
    """Seconds into the phase (from its faults in force) of each look: ``min_s``, then ×``GROWTH``
    each, the last at ``max_s`` (a look that would land within 10% of max is merged into it)."""
    if max_s <= min_s:
        return [min_s]
    offsets = [min_s]
    while offsets[-1] * GROWTH < max_s:
        offsets.append(offsets[-1] * GROWTH)
    if len(offsets) > 1 and max_s / offsets[-1] < MERGE_WITHIN:
        offsets[-1] = max_s  # a look just short of max would only spend confidence: max takes its place
    else:
        offsets.append(max_s)
    return offsets


def _window_of(obs: Observations, phase: str | None) -> PhaseWindow | None:
    """The window whose looks judge ``phase``'s verdicts: its own; over the whole run (None), the last
    phase's (whole-run entries count at the last phase's looks only: ``counted_entries``)."""
    if phase is None:
        return max(obs.phases, key=lambda w: w.t_start, default=None)
    return obs.phase(phase)


def _looks_of(obs: Observations, phase: str | None) -> int:
    """The looks the verdicts of ``phase`` were judged at (0: a phase of fixed length)."""
    window = _window_of(obs, phase)
    return window.looks if window is not None else 0


def sequential_view(spec: SlaCheck, obs: Observations, phase: str | None) -> Observations:
    """What a verdict of ``phase`` judges: for a phase a look stopped (``stopped_by`` "decided"), the streams
    that had ended by that look (``PhaseWindow.t_decided``) — the very data it decided on, so the run's
    verdict is the look's, at the look's spending; ``obs`` itself otherwise (a phase that ran to its max
    stopped whatever the data said: the streams drained after it count, as in a fixed phase). Over the whole
    run (None) the same cut at the last phase's deciding look, whose looks judged it (``counted_entries``):
    the streams in flight at that look, drained after it, once turned its decided fail inconclusive (20
    TTFTs where the look judged 16: the 4 later ones raised the autocorrelation, n_eff 7.1 → 4.9). Kinds
    that need what comes after the phase (``decides_in_phase`` false) are never judged at a look."""
    window = _window_of(obs, phase)
    if (window is None or window.looks <= 0 or window.stopped_by != "decided" or window.t_decided is None
            or not getattr(spec, "decides_in_phase", True)):
        return obs
    cut = window.t_decided
    return replace(obs, streams=[s for s in obs.streams if s.t_end is not None and s.t_end <= cut])


def sequential_spec(spec: _Spec, obs: Observations, phase: str | None) -> _Spec:
    """``spec`` as a phase that made K > 0 looks judges it: its ``confidence`` raised to 1 - α_K
    (``sla.stats.sequential_confidence``), a rank test's ``alpha`` lowered to α_K; unchanged for a
    fixed phase and for kinds with neither field (their figure is a count or a point figure)."""
    looks = _looks_of(obs, phase)
    if looks <= 0:
        return spec
    from sla.stats import sequential_confidence, spent_alpha

    frozen: Any = spec  # every SlaSpec is a frozen dataclass; the SlaCheck protocol does not say so
    names = {f.name for f in fields(frozen)}
    if "confidence" in names:
        return cast(_Spec, replace(frozen, confidence=sequential_confidence(float(frozen.confidence), looks)))
    if "alpha" in names:
        return cast(_Spec, replace(frozen, alpha=spent_alpha(float(frozen.alpha), looks)))
    return spec


def sequential_evidence(found: Verdict, obs: Observations, phase: str | None) -> Verdict:
    """``found`` with ``evidence["sequential"]`` (looks, the confidence one look judged at, what ended the
    phase) when its phase ran until decided; unchanged otherwise."""
    looks = _looks_of(obs, phase)
    if looks <= 0:
        return found
    window = _window_of(obs, phase)
    used = found.evidence.get("confidence")
    facts: dict[str, Any] = {
        "looks": looks, "confidence_per_look": used, "stopped_by": window.stopped_by if window else None,
        "method": "alpha spending: look k spends (1 - confidence) / (k (k + 1))"}
    if window is not None and window.stopped_by == "decided" and window.t_decided is not None:
        cut = window.t_decided
        facts["judged_streams_ended_by_s"] = round((cut - obs.t0) / NS, 3)
        facts["ended_after_the_deciding_look"] = sum(  # in the journal, not in this verdict
            1 for s in obs.population(phase) if s.t_end is None or s.t_end > cut)
    return replace(found, evidence={**found.evidence, "sequential": facts})


def counted_entries(experiment: Experiment, phase: PhaseSpec) -> list[tuple[SlaEntry, str | None]]:
    """The entries a look judges for ``phase``, each with the phase it is judged on (None: the whole run,
    only when ``phase`` is the last one); only kinds that can decide inside the phase."""
    last = experiment.phases[-1].name if experiment.phases else None
    out: list[tuple[SlaEntry, str | None]] = []
    for entry in experiment.sla:
        if not getattr(entry.spec, "decides_in_phase", True):
            continue
        if entry.phases is None:
            if phase.name == last:
                out.append((entry, None))
        elif phase.name in entry.phases:
            out.append((entry, phase.name))
    return out


def snapshot(obs: Observations, phase: str, looks: int, t_look: int | None = None) -> Observations:
    """A copy of ``obs`` as it stands (its lists copied, the records shared), with ``phase``'s window saying
    it made ``looks`` looks, the last, taken at ``t_look`` (monotonic ns; default: now), stopping it: what a
    look judges, off the event loop, while the journal goes on growing. So the look judges exactly what the
    run's verdict will if the phase stops here (``sequential_view``: the streams ended by ``t_look``)."""
    t_look = time.monotonic_ns() if t_look is None else t_look
    windows = [replace(w, looks=looks, stopped_by="decided", t_decided=t_look) if w.name == phase else w
               for w in obs.phases]
    if not any(w.name == phase for w in windows):
        windows.append(PhaseWindow(phase, obs.t0, looks=looks, stopped_by="decided", t_decided=t_look))
    return replace(obs, streams=list(obs.streams), metrics=list(obs.metrics), faults=list(obs.faults),
                   phases=windows, notes=list(obs.notes), taps=list(obs.taps))


@dataclass(frozen=True)
class LookOutcome:
    """One look: whether every counted verdict was decided, a line for the console, and what it cost."""

    decided: bool
    summary: str
    seconds: float  # CPU-bound time the look took to judge (the event loop is not blocked: a thread)
    statuses: tuple[str, ...] = ()  # each entry's status at this look, in the order given


def _verdict_text(verdict: Verdict) -> str:
    """``ttft 41 samples (needs ~60)`` or ``errors decided pass``."""
    name = verdict.name or verdict.sla
    if verdict.status in DECIDED:
        return f"{name} decided {verdict.status}"
    needed = verdict.evidence.get("samples_needed")
    if isinstance(needed, (int, float)) and math.isfinite(needed):
        return f"{name} {verdict.samples} samples (needs ~{int(needed)})"
    return f"{name} {verdict.samples} samples (undecided)"


# judges one entry on a phase as the run does (``chaos.execution.verify.judge_entry``, which imports this module)
Judge = Callable[["SlaEntry", Observations, "str | None"], Verdict]


def look(entries: Sequence[tuple[SlaEntry, str | None]], obs: Observations, judge: Judge,
         earlier: dict[int, str] | None = None) -> LookOutcome:
    """Judge ``entries`` on ``obs`` (a ``snapshot``) as the run will (``judge``, at this look's spending).
    ``earlier``: entry index → the status an earlier look decided it at; such an entry is not judged
    again (the spending holds whatever rule picks the look to stop at, and a look at 10k streams costs
    seconds of CPU: ``streaming`` alone 1.7 s)."""
    started = time.perf_counter()
    earlier = earlier or {}
    texts, statuses = [], []
    for i, (entry, phase) in enumerate(entries):
        if i in earlier:
            statuses.append(earlier[i])
            texts.append(f"{entry.name} decided {earlier[i]}")
            continue
        verdict = judge(entry, obs, phase)
        statuses.append(verdict.status)
        texts.append(_verdict_text(verdict))
    decided = all(status in DECIDED for status in statuses)
    summary = ", ".join(texts) or "nothing judged inside the phase"
    return LookOutcome(decided, summary, time.perf_counter() - started, tuple(statuses))


def _warm_up() -> None:
    """Load what judging loads on first use (scipy.stats, behind ``sla.stats``' bounds)."""
    from sla.stats import proportion_bounds

    proportion_bounds(1, 2)


@dataclass
class LookState:
    """How far a phase's looks got: what its ``PhaseWindow`` end record carries, however the phase ended."""

    looks: int = 0
    stopped_by: str | None = None  # "decided" | "max"; None while looking (or cut short: a halt, a signal)
    t_decided: int | None = None  # when the look that ended the phase was taken (monotonic ns)
    decided: dict[int, str] = field(default_factory=dict)  # counted entry index → the status a look decided


async def run_looks(experiment: Experiment, phase: PhaseSpec, obs: Callable[[], Observations], t_in_force: int,
                    stage: Callable[[str], None], state: LookState, judge: Judge) -> None:
    """Sleep to each look of ``phase`` (its clock started at ``t_in_force``, monotonic ns), judge its
    counted entries on the streams that ended by the look, ``DELIVERY_S`` after it (their records on their
    way from the load process), in a thread (judging 10k streams must not stall the run's event loop), and return
    at the first look where all are decided (``state.stopped_by`` "decided") or after the last ("max").
    ``stage`` gets one line per look: the samples each undecided verdict has and needs."""
    assert phase.max_duration is not None
    entries = counted_entries(experiment, phase)
    offsets = look_offsets(phase.duration, phase.max_duration)
    if not entries:  # nothing it could wait on: its min, no look, no confidence spent
        await _sleep_to(t_in_force, phase.duration)
        stage(f"phase {phase.name}: no verdict judged on it can decide inside it: it ran its min")
        return
    # scipy's import takes 1.1 s of CPU (3 s on a busy box): taken now, while the phase runs to its min
    warm = asyncio.create_task(asyncio.to_thread(_warm_up))
    max_offset = offsets[-1]

    async def judged(k: int, t_look: int) -> LookOutcome:
        await warm
        await _sleep_to(t_look, DELIVERY_S)  # the records of streams that ended by t_look, in the journal
        return await asyncio.to_thread(look, entries, snapshot(obs(), phase.name, k, t_look), judge,
                                       dict(state.decided))

    try:
        for k, offset in enumerate(offsets, start=1):
            await _sleep_to(t_in_force, offset)
            t_look = time.monotonic_ns()
            state.looks, state.t_decided = k, t_look
            if k == len(offsets):  # max: the phase ends whatever a look would say; the run's verdicts judge it
                state.stopped_by = "max"
                stage(f"phase {phase.name}: look {k} at {(t_look - t_in_force) / NS:.1f}s: its max")
                return
            try:  # a look never carries the phase past its max: on a starved box scipy's import and judging
                # took the phase 4.7 s past a 3 s max; the look that runs into it counts as the last, at max
                outcome = await asyncio.wait_for(
                    judged(k, t_look), max(0.0, (t_in_force + int(max_offset * NS) - time.monotonic_ns()) / NS))
            except TimeoutError:
                state.stopped_by, state.t_decided = "max", time.monotonic_ns()
                stage(f"phase {phase.name}: look {k} at {(t_look - t_in_force) / NS:.1f}s was still judging at "
                      f"its max ({max_offset:g}s): the phase ends there, undecided by its looks")
                return
            state.decided.update({i: st for i, st in enumerate(outcome.statuses) if st in DECIDED})
            stage(f"phase {phase.name}: look {k} at {(t_look - t_in_force) / NS:.1f}s: {outcome.summary}")
            if outcome.decided:
                state.stopped_by = "decided"
                return
    finally:
        warm.cancel()  # a phase cut short: the import finishes in its thread, unawaited


async def _sleep_to(t_from: int, offset_s: float) -> None:
    """Sleep until ``offset_s`` seconds after ``t_from`` (monotonic ns)."""
    await asyncio.sleep(max(0.0, (t_from + int(offset_s * NS) - time.monotonic_ns()) / NS))
