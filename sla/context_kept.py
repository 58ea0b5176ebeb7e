"""`context_kept`: the server read each conversation's whole history, turn after turn.

A multi-turn session (``load.workload.kind: sessions``, or a ShareGPT replay) resends its history every
turn, so the prompt the server reports (``usage.prompt_tokens``) must grow turn over turn. A server, a
gateway or a cache that keeps only the last message (a truncating proxy, a broken prefix cache that
serves a stale prompt, a chat template that drops roles) answers on, fluently, about nothing before it:
no error, no slow token, only a prompt far shorter than what was sent. For every turn from 2 on that
carries usage:

- where the client counted its own prompt in the target's tokenizer (``StreamRecord.prompt_tokens``:
  its messages' text; a chat template's own tokens only add to what the server counts), the server's
  count must be at least ``min_share`` of it;
- the server's count must exceed its count for the turn before in the same session (where that one
  carried usage too).

A turn failing either dropped history. A turn with neither to hold it against (no client count, and the
turn before cut or without usage) is not judged (``uncompared``). Inconclusive when no turn from 2 on
could be judged: the server sent no usage (``load.include_usage`` off, or an engine that ignores
``stream_options``), none could be compared, or the load made no session turns at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chaos.model.context import HaltSpec
from chaos.model.observations import Observations, StreamRecord
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Status, Verdict, verifier
from sla.common import MAX_IDS, usage_count

__all__ = ["ContextKept", "server_prompt_tokens"]

SCHEMA = Schema((
    Param("min_share", "fraction", 0.9, min=0.01, max=1.0,
          doc="a turn's usage.prompt_tokens must be at least this share of the tokens the client sent (its own "
              "count, where the target's tokenizer is known)"),
))


def server_prompt_tokens(stream: StreamRecord) -> int | None:
    """The server's own count of the stream's prompt (``usage.prompt_tokens``), where it sent one."""
    return usage_count(stream, "prompt_tokens")


def _previous_counts(population: list[StreamRecord]) -> dict[tuple[str, int], int]:
    """(session, turn) → the server's prompt count of that turn's last attempt that carried one."""
    out: dict[tuple[str, int], int] = {}
    for st in sorted(population, key=lambda s: s.t_sent or 0):
        count = server_prompt_tokens(st)
        if st.session is not None and st.turn is not None and count is not None:
            out[(st.session, st.turn)] = count
    return out


@verifier
@dataclass(frozen=True, kw_only=True)
class ContextKept(SlaSpec):
    kind = "context_kept"
    summary = "each session turn's server-counted prompt holds its history (grows turn over turn)"
    schema = SCHEMA
    timing = False
    better = "lower"
    capacity_fit = True
    needs = ()
    sample_label = None

    min_share: float

    def samples(self, obs: Observations, phase: str | None) -> list[float] | None:
        return None  # a count of turns that lost their history

    def budget_rule(self) -> BudgetRule:
        return BudgetRule.policy("context_kept has no budget: a turn whose history the server dropped fails it")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return None

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        population = obs.population(phase)
        later = [st for st in population if st.session is not None and st.turn is not None and st.turn >= 2]
        # the turn before may have been sent in another phase: look for it among every stream of the run
        before = _previous_counts([st for st in obs.streams if st.session is not None])
        judged = shrunk = short = bad = 0
        offenders: list[dict[str, Any]] = []
        missing_usage = uncompared = 0
        for st in later:
            served = server_prompt_tokens(st)
            if served is None:
                missing_usage += 1
                continue
            assert st.session is not None and st.turn is not None  # ``later`` holds session turns only
            previous = before.get((st.session, st.turn - 1))
            if st.prompt_tokens is None and previous is None:
                uncompared += 1  # nothing to hold it against: no client count, no count for the turn before
                continue
            judged += 1
            under = st.prompt_tokens is not None and served < self.min_share * st.prompt_tokens
            no_growth = previous is not None and served <= previous
            short += under
            shrunk += no_growth
            bad += under or no_growth
            if (under or no_growth) and len(offenders) < MAX_IDS:
                offenders.append({"id": st.id, "session": st.session, "turn": st.turn, "usage_prompt_tokens": served,
                                  "client_prompt_tokens": st.prompt_tokens, "turn_before_prompt_tokens": previous})
        evidence: dict[str, Any] = {
            "session_turns": len(later),
            "judged_turns": judged,
            "without_usage": missing_usage,
            "uncompared": uncompared,
            "with_client_count": sum(1 for st in later if st.prompt_tokens is not None),
            "below_min_share": short,
            "not_grown": shrunk,
            "min_share": self.min_share,
            "offenders": offenders,
        }
        status: Status
        if bad:
            status = "fail"
            evidence["reason"] = (f"{bad} of {judged} turns from 2 on were served a prompt that lost its history: "
                                  f"{short} counted below {self.min_share:.0%} of what the client sent, {shrunk} no "
                                  "longer than the turn before (usage.prompt_tokens)")
        elif not later:
            status = "inconclusive"
            evidence["reason"] = ("no session turn from 2 on to judge: context_kept needs a multi-turn load "
                                  "(load.workload kind sessions, or a ShareGPT trace)")
        elif not judged and missing_usage == len(later):
            status = "inconclusive"
            evidence["reason"] = (f"none of the {len(later)} turns from 2 on carried usage.prompt_tokens: the server "
                                  "sent no usage (is load.include_usage on? does the engine honour stream_options?)")
        elif not judged:
            status = "inconclusive"
            evidence["reason"] = (f"none of the {len(later)} turns from 2 on could be compared: {uncompared} had no "
                                  "client count (the target's tokenizer is not known) and no count for the turn "
                                  f"before it (cut, or sent without usage); {missing_usage} carried no usage")
        else:
            status = "pass"
        return Verdict("context_kept", phase, status, float(bad), 0.0, "count", judged, evidence)
