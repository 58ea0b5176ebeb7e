"""One phase's streams by outcome and the per-request figures of its successful ones: what the result
formats other tools read are laid out from (``vllm_bench``, ``llmd_report``, ``aiperf_export``), computed
once, here, from our stamps (``sla.definitions``).

Successful streams are the complete ones by the run's end rule that carried a token of any kind (vLLM
bench times every chunk, reasoning and tool-call chunks included); the others are hung up by a client
fault, failed (an HTTP error, a transport error or an error event) or cut (ended without their end and no
error). The duration runs from the first request sent to the last successful request's last token.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from chaos.model.observations import NS, Observations, StreamRecord
from sla.definitions import e2e_ns, output_tokens, tpot_ns, ttst_ns

__all__ = ["PhaseFigures", "phase_figures"]


@dataclass
class PhaseFigures:
    """One phase's streams, sorted by outcome, and their per-request figures (ns, tokens)."""

    phase: str | None
    total: int
    ok: list[StreamRecord]
    failed: list[StreamRecord]  # an HTTP error, a transport error or an error event
    hung_up: list[StreamRecord]  # a client fault hung up on purpose
    cut: list[StreamRecord]  # ended without its end (no finish_reason/[DONE]) and no error
    duration_s: float
    t_first_sent: int | None  # monotonic ns
    t_last_token: int | None
    faults: list[tuple[str, str]] = field(default_factory=list)  # (name, kind) injected in the phase
    ttft: list[float] = field(default_factory=list)
    ttst: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    ntpot: list[float] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    input_tokens: list[int] = field(default_factory=list)  # where the server reported usage.prompt_tokens
    errors: Counter[tuple[int | None, str, str]] = field(default_factory=Counter)  # (code, type, message)

    @property
    def not_completed(self) -> int:
        return len(self.hung_up) + len(self.cut)


def _failed(st: StreamRecord) -> bool:
    return st.error is not None or st.in_band_error is not None or (st.status is not None and st.status >= 400)


def _error_key(st: StreamRecord) -> tuple[int | None, str, str]:
    if st.error is not None:
        return st.error.status or st.status, st.error.kind, st.error.message
    if st.in_band_error is not None:
        return st.status, "in_band_error", st.in_band_error
    return st.status, "http_status", f"HTTP {st.status}"


def _prompt_tokens(st: StreamRecord) -> int | None:
    reported = (st.usage or {}).get("prompt_tokens")
    if isinstance(reported, int) and not isinstance(reported, bool):
        return reported
    return st.prompt_tokens


def phase_figures(obs: Observations, phase: str | None = None) -> PhaseFigures:
    """The run's (or one phase's) streams by outcome, with the figures of the successful ones."""
    population = obs.population(phase)
    # a token of any kind: as vLLM bench (and vllm_bench here) time every chunk
    ok = [st for st in population if obs.complete(st) and st.t_sent is not None and st.token_events]
    done = {id(st) for st in ok}
    hung_up = [st for st in population if id(st) not in done and st.hangup is not None]
    rest = [st for st in population if id(st) not in done and st.hangup is None]
    failed = [st for st in rest if _failed(st)]
    cut = [st for st in rest if not _failed(st)]
    starts = [st.t_sent for st in population if st.t_sent is not None]
    ends = [st.t_tokens[-1] for st in ok]
    duration_s = (max(ends) - min(starts)) / NS if starts and ends else 0.0
    injected = [f for f in obs.faults if f.action == "inject" and (phase is None or f.phase == phase)]
    faults = sorted({(f.fault, f.kind) for f in injected})
    figures = PhaseFigures(phase=phase, total=len(population), ok=ok, failed=failed, hung_up=hung_up, cut=cut,
                           duration_s=duration_s, t_first_sent=min(starts) if starts else None,
                           t_last_token=max(ends) if ends else None, faults=faults)
    for st in ok:
        tokens = output_tokens(st)
        figures.output_tokens.append(tokens)
        figures.gaps.extend(st.gaps_ns)
        for values, value in ((figures.ttft, st.ttft_ns), (figures.ttst, ttst_ns(st)), (figures.tpot, tpot_ns(st)),
                              (figures.e2e, e2e_ns(st))):
            if value is not None:
                values.append(float(value))
        e2e = e2e_ns(st)
        if e2e is not None and tokens:
            figures.ntpot.append(e2e / tokens)
        prompt = _prompt_tokens(st)
        if prompt is not None:
            figures.input_tokens.append(prompt)
    for st in failed:
        figures.errors[_error_key(st)] += 1
    return figures
