"""`integrity`: what the clients received is well-formed and, where a reference exists, correct.

Every judged stream, hung up or failed or not, must have decoded as UTF-8 without a replacement
character, carried only JSON payloads and well-formed SSE framing. Where a stream has a reference
text (``expected_text``: the fault-free output of the deterministic builtin model), a complete
stream's text must equal it and an incomplete one's (hung up, failed, cut) must be a prefix of it:
a cut stream proves nothing about the missing tail, but what did arrive must still be right.
``split_chars`` (multibyte characters that arrived split across reads) is reported so a slicer
experiment can show the splits it provoked really happened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chaos.model.context import HaltSpec
from chaos.model.observations import STRICT_END, EndRule, Observations, StreamRecord
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Status, Verdict, verifier
from sla.common import MAX_IDS

__all__ = ["diff_snippet", "Integrity"]

SCHEMA = Schema(
    (
        Param(
            "require_reference",
            "bool",
            default=False,
            doc="complete streams without expected_text make the verdict inconclusive",
        ),
    )
)

REPLACEMENT = "\ufffd"
_CONTEXT = 24  # characters of context either side of a difference


def diff_snippet(expected: str, got: str) -> dict[str, Any]:
    """Where two texts first differ and a little of each around it."""
    i = next((k for k, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b), min(len(expected), len(got)))
    lo = max(0, i - _CONTEXT)
    return {
        "at": i,
        "expected": expected[lo : i + _CONTEXT],
        "got": got[lo : i + _CONTEXT],
        "expected_len": len(expected),
        "got_len": len(got),
    }


def _problems(stream: StreamRecord, rule: EndRule = STRICT_END) -> list[str]:
    found = []
    if stream.utf8_errors:
        found.append("utf8_errors")
    if REPLACEMENT in stream.text:
        found.append("replacement_char")
    if stream.json_errors:
        found.append("json_errors")
    if stream.sse_errors:
        found.append("sse_errors")
    if stream.expected_text is not None:
        if stream.is_complete(rule) and stream.text != stream.expected_text:
            found.append("text_mismatch")
        elif not stream.is_complete(rule) and not stream.expected_text.startswith(stream.text):
            found.append("prefix_mismatch")
    return found


@verifier
@dataclass(frozen=True, kw_only=True)
class Integrity(SlaSpec):
    kind = "integrity"
    summary = "valid UTF-8, no U+FFFD, well-formed SSE and JSON; text equal to the reference"
    schema = SCHEMA
    timing = False
    better = "lower"
    capacity_fit = True
    needs = ()
    sample_label = None

    require_reference: bool

    def samples(self, obs: Observations, phase: str | None) -> list[float] | None:
        return None  # a count of corrupted streams

    def budget_rule(self) -> BudgetRule:
        return BudgetRule.policy("integrity has no budget: any corrupted stream fails it")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return None

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        require_reference: bool = self.require_reference
        population = obs.population(phase)
        counts: dict[str, int] = {
            "utf8_errors": 0,
            "replacement_char": 0,
            "json_errors": 0,
            "sse_errors": 0,
            "text_mismatch": 0,
            "prefix_mismatch": 0,
        }
        offenders: list[dict[str, Any]] = []
        first_diff: dict[str, Any] | None = None
        bad = 0
        rule = obs.end_rule
        for stream in population:
            found = _problems(stream, rule)
            bad += bool(found)
            for problem in found:
                counts[problem] += 1
            if found and len(offenders) < MAX_IDS:
                offenders.append({"id": stream.id, "problems": found})
            if (
                first_diff is None
                and stream.expected_text is not None
                and {"text_mismatch", "prefix_mismatch"} & set(found)
            ):
                first_diff = {"id": stream.id, **diff_snippet(stream.expected_text, stream.text)}

        without_reference = [st for st in population if obs.complete(st) and st.expected_text is None]
        evidence: dict[str, Any] = {
            "streams": len(population),
            "problems": counts,
            "offenders": offenders,
            "first_diff": first_diff,
            "compared_with_reference": sum(1 for st in population if st.expected_text is not None),
            "complete_without_reference": len(without_reference),
            "split_chars": sum(st.split_chars for st in population),
            "utf8_error_bytes": sum(st.utf8_errors for st in population),
        }
        status: Status
        if bad:
            status = "fail"
        elif not population:
            status = "inconclusive"
            evidence["reason"] = "no streams to judge"
        elif require_reference and without_reference:
            status = "inconclusive"
            evidence["reason"] = (
                f"require_reference is set but {len(without_reference)} complete streams have no expected_text "
                f"(first: {without_reference[0].id})"
            )
        else:
            status = "pass"
        return Verdict("integrity", phase, status, float(bad), 0.0, "count", len(population), evidence)
