"""`tool_calls`: the share of streamed tool calls that did not assemble into calls a client can run.

A streamed tool call (``delta.tool_calls``, OpenAI's and vLLM's shape) comes as fragments: the call's
index, id, type and function name once, then its ``function.arguments`` in pieces that concatenate to a
JSON object. The load client assembles them per index (``StreamRecord.tool_calls``) and counts the
fragments that broke the protocol (``tool_call_errors``: a fragment without an index, an id or name
that changed mid-call, arguments that are not a string). A judged stream is bad when any of its calls
has arguments that are not a JSON object once joined (a fragment lost, truncated or corrupted on the
way), no id or no name, when a fragment broke the protocol, or when it finished with
``finish_reason: "tool_calls"`` and carried no call at all.

Judged: the complete streams (the run's end-of-stream rule) that carried a tool-call fragment or
finished with ``tool_calls``. A stream cut mid-call cannot have whole arguments: it is left out and
counted in the evidence, as ``early_close`` and ``errors`` judge it. No such stream: inconclusive.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from chaos.model.context import HaltSpec
from chaos.model.observations import Observations, StreamRecord
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Status, Verdict, verifier
from sla.common import MAX_IDS

__all__ = ["PROBLEMS", "ToolCalls", "carries_tool_calls", "tool_call_problems"]

SCHEMA = Schema((Param("budget", "fraction", default=0.0,
                       doc="the largest share of judged streams whose tool calls may be broken"),))

# the ways a stream's tool calls can be broken, in the order evidence lists them
PROBLEMS = ("invalid_json", "not_an_object", "missing_id", "missing_name", "protocol_errors", "no_call")
_SHOWN = 120  # characters of a bad call's arguments the evidence shows


def carries_tool_calls(stream: StreamRecord) -> bool:
    """Whether a stream carried a tool-call fragment or said it finished on tool calls. Pure."""
    return bool(stream.t_tool_calls or stream.tool_calls or stream.tool_call_errors
                or stream.finish_reason == "tool_calls")


def _arguments_problem(arguments: object) -> str | None:
    if not isinstance(arguments, str):
        return "invalid_json"
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the interpreter's stack
        return "invalid_json"
    return None if isinstance(value, dict) else "not_an_object"


def tool_call_problems(stream: StreamRecord) -> list[str]:
    """How a stream's tool calls are broken (``PROBLEMS``, each named once); empty when they are whole. Pure."""
    found: set[str] = set()
    calls = stream.tool_calls or {}
    for call in calls.values():
        if not isinstance(call, dict):
            found.add("invalid_json")
            continue
        problem = _arguments_problem(call.get("arguments"))
        if problem is not None:
            found.add(problem)
        if not call.get("id"):
            found.add("missing_id")
        if not call.get("name"):
            found.add("missing_name")
    if stream.tool_call_errors:
        found.add("protocol_errors")
    if not calls and stream.finish_reason == "tool_calls":
        found.add("no_call")
    return [p for p in PROBLEMS if p in found]


def _offender(stream: StreamRecord, problems: list[str]) -> dict[str, Any]:
    calls = stream.tool_calls or {}
    return {
        "id": stream.id,
        "problems": problems,
        "finish_reason": stream.finish_reason,
        "fragments": len(stream.t_tool_calls),
        "protocol_errors": stream.tool_call_errors,
        "calls": {index: {"id": call.get("id"), "name": call.get("name"),
                          "arguments": str(call.get("arguments", ""))[:_SHOWN]}
                  for index, call in list(calls.items())[:3] if isinstance(call, dict)},
    }


@verifier
@dataclass(frozen=True, kw_only=True)
class ToolCalls(SlaSpec):
    kind = "tool_calls"
    summary = ("share of streamed tool calls that do not assemble: arguments not a JSON object, no id or name, "
               "fragments that break the protocol")
    schema = SCHEMA
    timing = False
    better = "lower"
    capacity_fit = True
    needs = ()
    sample_label = None

    budget: float

    def samples(self, obs: Observations, phase: str | None) -> list[float] | None:
        return None  # a share of broken streams: counts, no sample of values

    def budget_rule(self) -> BudgetRule:
        return BudgetRule.policy("a ceiling on broken tool calls is a policy, not a measurement")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return None

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        carrying = [st for st in obs.population(phase) if carries_tool_calls(st)]
        judged = [st for st in carrying if obs.complete(st)]
        bad = [(st, problems) for st in judged if (problems := tool_call_problems(st))]
        evidence: dict[str, Any] = {
            "streams": len(judged),
            "bad": len(bad),
            "calls": sum(len(st.tool_calls or {}) for st in judged),
            "fragments": sum(len(st.t_tool_calls) for st in judged),
            "incomplete_excluded": len(carrying) - len(judged),  # cut or failed mid-call: early_close, errors
            "by_problem": dict(Counter(p for _, problems in bad for p in problems)),
            "bad_ids": [st.id for st, _ in bad[:MAX_IDS]],
            "offenders": [_offender(st, problems) for st, problems in bad[:3]],
        }
        if not judged:
            evidence["reason"] = ("no complete stream carried a tool call (the load sends tools with tool_choice "
                                  "required or a named function, and the target streams them)")
            return Verdict("tool_calls", phase, "inconclusive", None, self.budget, "fraction", 0, evidence)
        share = len(bad) / len(judged)
        status: Status = "pass" if share <= self.budget else "fail"
        if bad:
            evidence["reason"] = (f"{len(bad)} of {len(judged)} streams' tool calls did not assemble: "
                                  + ", ".join(f"{p} {n}" for p, n in evidence["by_problem"].items()))
        return Verdict("tool_calls", phase, status, share, self.budget, "fraction", len(judged), evidence)
