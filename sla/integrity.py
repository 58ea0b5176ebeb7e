"""`integrity`: what the clients received is well-formed and, where a reference exists, correct.

Every judged stream, hung up or failed or not, must have decoded as UTF-8 without a replacement
character, carried only JSON payloads and well-formed SSE framing. Where a stream has a reference
text (``expected_text``: the fault-free output of the deterministic builtin model), a complete
stream's text must equal it and an incomplete one's (hung up, failed, cut) must be a prefix of it:
a cut stream proves nothing about the missing tail, but what did arrive must still be right.
``split_chars`` (multibyte characters that arrived split across reads) is reported so a slicer
experiment can show the splits it provoked really happened.

Two more checks use what the server itself says. A 2xx response that came with a ``Content-Type`` other
than ``text/event-stream`` is a ``content_type`` problem, and the evidence names the types seen (the
load client also fails such a stream as a ``protocol`` error, so ``errors`` and ``early_close`` name it
in experiments that do not list integrity). One with none is judged as SSE (a homemade server may never
send it), except an HTTP/2 stream where others of the run came as ``text/event-stream``: that is
``content_type_missing``, the same server labelling some streams and not others, which is what a
response header lost or leaked between the streams of one HTTP/2 connection looks like, and a
browser's ``EventSource`` refuses the stream. Its evidence names the stream, its connection and HTTP/2
stream id, and the header. Where the stream carried
``usage.completion_tokens`` (the load asks for ``stream_options.include_usage``), more content events
than that count is ``events_over_usage``: every content event carries at least one token, so the
surplus was sent twice (or made up). Repeated events (a content event whose whole payload, JSON and SSE
``id``, equals the one before) are counted and shown beside it, but are no problem on their own: an
engine may generate the same token twice in a row, and most engines send the same ``id`` and
``created`` in every chunk of a stream, so the payload alone cannot tell a repeated token from a
repeated event; the server's own token count can.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from chaos.model.context import HaltSpec
from chaos.model.observations import STRICT_END, EndRule, Observations, StreamRecord, foreign_content_type
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Status, Verdict, verifier
from sla.common import MAX_IDS, usage_count

__all__ = ["diff_snippet", "framing_problem", "usage_tokens", "Integrity"]

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


# every problem a stream can have, in the order the evidence lists them
PROBLEMS = ("content_type", "content_type_missing", "events_over_usage", "utf8_errors", "replacement_char",
            "json_errors", "sse_errors", "text_mismatch", "prefix_mismatch")


def framing_problem(stream: StreamRecord) -> bool:
    """A 2xx response that came with a Content-Type other than text/event-stream (none at all is no
    problem here: the body is judged as SSE, by the other checks). Pure."""
    ok = stream.status is None or 200 <= stream.status < 300
    return ok and foreign_content_type(stream.content_type)


def usage_tokens(stream: StreamRecord) -> int | None:
    """The server's own count of the tokens it generated for the stream (``usage.completion_tokens``)."""
    return usage_count(stream, "completion_tokens")


def _over_usage(stream: StreamRecord) -> bool:
    tokens = usage_tokens(stream)
    # events that carried a token: content and reasoning (a tool call's first and last fragments carry none)
    return tokens is not None and len(stream.t_content) + len(stream.t_reasoning) > tokens


def missing_content_type(stream: StreamRecord) -> bool:
    """A 2xx HTTP/2 response that came with no Content-Type at all (``""``; None: no response, or an older
    journal). Over HTTP/1.1 a missing header stays what it always was here, a homemade server's habit judged
    as SSE: one connection carries one response at a time, so no neighbour's head can take its place. Pure."""
    ok = stream.status is None or 200 <= stream.status < 300
    return ok and stream.content_type == "" and stream.protocol == "h2"


def labelled_sse(stream: StreamRecord) -> bool:
    """A response that came as ``text/event-stream``. Pure."""
    return bool(stream.content_type) and not foreign_content_type(stream.content_type)


def _problems(stream: StreamRecord, rule: EndRule = STRICT_END, sse_elsewhere: bool = False) -> list[str]:
    found = []
    if framing_problem(stream):
        found.append("content_type")
    if sse_elsewhere and missing_content_type(stream):
        found.append("content_type_missing")
    if _over_usage(stream):
        found.append("events_over_usage")
    if stream.utf8_errors:
        found.append("utf8_errors")
    if REPLACEMENT in stream.text:
        found.append("replacement_char")
    if stream.json_errors:
        found.append("json_errors")
    if stream.sse_errors:
        found.append("sse_errors")
    return found + _reference_problems(stream, rule)


def _reference_problems(stream: StreamRecord, rule: EndRule) -> list[str]:
    """Its text against its reference: equal when complete, a prefix of it when not."""
    if stream.expected_text is None:
        return []
    if stream.is_complete(rule):
        return ["text_mismatch"] if stream.text != stream.expected_text else []
    return [] if stream.expected_text.startswith(stream.text) else ["prefix_mismatch"]


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
        counts: dict[str, int] = dict.fromkeys(PROBLEMS, 0)
        offenders: list[dict[str, Any]] = []
        first_diff: dict[str, Any] | None = None
        bad = 0
        rule = obs.end_rule
        # over the whole run, not the phase's: a phase where every stream lost the header is no proof the
        # server never sends it
        sse_labelled = sum(1 for st in obs.population(None) if labelled_sse(st))
        for stream in population:
            found = _problems(stream, rule, sse_elsewhere=sse_labelled > 0)
            bad += bool(found)
            for problem in found:
                counts[problem] += 1
            if found and len(offenders) < MAX_IDS:
                offenders.append(_offender(stream, found))
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
            **_server_said(population),
            "labelled_event_stream": sse_labelled,
        }
        status: Status
        if bad:
            status = "fail"
            evidence["reason"] = _reason(counts, evidence, len(population))
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


def _offender(stream: StreamRecord, found: list[str]) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": stream.id, "problems": found}
    if "content_type" in found:
        entry["content_type"] = stream.content_type
    if "content_type_missing" in found:
        entry["missing_header"] = "content-type"
    if stream.connection is not None:  # which connection (and HTTP/2 stream) carried it: neighbours share one
        entry.update(protocol=stream.protocol, connection=stream.connection, stream_id=stream.stream_id)
    if "events_over_usage" in found:
        entry.update(content_events=len(stream.t_content), usage_completion_tokens=usage_tokens(stream),
                     repeated_events=stream.repeated_events)
    return entry


def _server_said(population: list[StreamRecord]) -> dict[str, Any]:
    """What the streams' own headers and usage say: the Content-Types that were not an event stream,
    how many streams could be counted against usage, and the repeated events seen."""
    types = Counter(st.content_type for st in population if framing_problem(st))
    return {
        "content_types": {str(t): n for t, n in types.items()},  # never "" nor None: framing_problem's
        "compared_with_usage": sum(1 for st in population if usage_tokens(st) is not None),
        "repeated_events": sum(st.repeated_events for st in population),
        "streams_with_repeated_events": sum(1 for st in population if st.repeated_events),
    }


def _reason(counts: dict[str, int], evidence: dict[str, Any], streams: int) -> str:
    """The failure in words, the server's own facts first (what it labelled the stream, what it counted)."""
    said = []
    if counts["content_type"]:
        shown = ", ".join(f"{t!r} ({n})" for t, n in evidence["content_types"].items())
        said.append(f"{counts['content_type']} of {streams} streams came as Content-Type {shown}, "
                    "not text/event-stream")
    if counts["content_type_missing"]:
        first = next((o for o in evidence["offenders"] if "content_type_missing" in o["problems"]), None)
        where = ""
        if first is not None:
            where = f" (first: {first['id']}"
            if first.get("connection"):
                where += f" on connection {first['connection']}"
                if first.get("stream_id") is not None:
                    where += f", HTTP/2 stream {first['stream_id']}"
            where += ")"
        said.append(f"{counts['content_type_missing']} of {streams} streams came with no content-type header while "
                    f"{evidence['labelled_event_stream']} came as text/event-stream{where}: a header lost or leaked "
                    "between streams; a browser's EventSource refuses such a stream")
    if counts["events_over_usage"]:
        said.append(f"{counts['events_over_usage']} streams carried more content events than the server's own "
                    f"usage.completion_tokens ({evidence['repeated_events']} content events repeated the one before "
                    "whole): events sent twice")
    others = {k: n for k, n in counts.items()
              if n and k not in ("content_type", "content_type_missing", "events_over_usage")}
    if others:
        said.append(", ".join(f"{k}: {n}" for k, n in others.items()))
    return "; ".join(said)
