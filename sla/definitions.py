"""The latency metrics by name: which stamps each uses, and what other tools call the same thing.

Tools disagree on names: vLLM's ``bench serve`` reports TPOT per request (first token excluded)
and ITL for every gap; AIPerf calls the per-request figure "Inter Token Latency" and the per-gap
one "Inter Chunk Latency"; GuideLLM's ``inter_token_latency_ms`` is again the per-request one.
This module names ours once, with the exact ``StreamRecord`` stamps, computes them, and states
where each matches another tool's. The README's definitions table, ``streamchaos list slas``,
the verdict evidence and ``streamchaos report --as vllm-bench`` all read it.

What the other tools do was read from their sources:
- vLLM ``vllm/benchmarks/serve.py`` (``calculate_metrics``: TPOT = (latency - ttft) /
  (output_len - 1) for output_len > 1; ITL = every chunk gap; E2EL = latency; goodput =
  good completed / duration) and ``vllm/benchmarks/lib/endpoint_request_func.py`` (the clock
  starts before ``session.post``; TTFT stops at the first SSE message carrying ``choices``, even
  with empty text, so on chat it is the role-only first chunk; latency ends at the last such
  message, before the usage chunk and ``[DONE]``).
- AIPerf ``docs/metrics-reference.md`` (TTFT = first non-empty content response - request start;
  TTST = second content response - first; Inter Token Latency = (request latency - TTFT) /
  (OSL - 1); Inter Chunk Latency = every gap between content responses; Request Latency = last
  content response - request start; goodput = good requests / benchmark duration).
- GuideLLM ``GenerativeRequestStats`` (time_to_first_token_ms = first token - request start;
  inter_token_latency_ms = (last token - first token) / (output tokens - 1);
  time_per_output_token_ms = (last token - request start) / output tokens, TTFT included;
  request_latency = request end - request start).

Our clock: ``t_sent`` is stamped when the request reaches the socket (httpx's trace hook), so
connection set-up and the client's own pool queueing are not in any of ours; a content event is
an SSE event whose ``text`` (completions) or ``delta.content`` (chat) is non-empty. A token event is a
content event, a reasoning event (``delta.reasoning_content`` or ``delta.reasoning``, vLLM's reasoning
streams) or a tool-call fragment (``delta.tool_calls``): ``t_first_token`` is the first of them,
``t_first_output`` the first that a user sees (content or a tool call, not reasoning), ``t_tokens`` all
of them in time order. For a stream without reasoning or tool calls every one of these is its content's.
Reasoning models were read in AIPerf (TTFT counts the first token of any kind, TTFO the first
non-reasoning one, PR #359) and GuideLLM (``first_token_iteration`` counts reasoning, PR #742;
``first_output_token_iteration`` does not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from chaos.model.observations import StreamRecord

__all__ = [
    "DEFINITIONS",
    "TOOLS",
    "Equivalent",
    "MetricDefinition",
    "definition_line",
    "definitions_markdown",
    "definitions_text",
    "e2e_ns",
    "output_tokens",
    "tokens_per_event",
    "tpot_ns",
    "ttfo_ns",
    "ttft_ns",
    "ttst_ns",
]

Match = Literal["same", "close", "different"]
TOOLS = ("vLLM bench serve", "AIPerf", "GuideLLM")


@dataclass(frozen=True)
class Equivalent:
    """What one tool calls the metric, and how close its definition is to ours."""

    tool: str
    name: str  # their name; "" when the tool has no such metric
    match: Match = "same"
    note: str = ""


@dataclass(frozen=True)
class MetricDefinition:
    name: str  # ours, as SLA kinds and parameters use it
    title: str
    stamps: str  # the formula over StreamRecord stamps
    per: str  # what one sample is
    equivalents: tuple[Equivalent, ...]

    def equivalent(self, tool: str) -> Equivalent:
        return next((e for e in self.equivalents if e.tool == tool), Equivalent(tool, "", "different"))


DEFINITIONS: dict[str, MetricDefinition] = {
    d.name: d
    for d in (
        MetricDefinition(
            "ttft", "time to first token of any kind (reasoning counts)", "t_first_token - t_sent", "request",
            (
                Equivalent("vLLM bench serve", "TTFT", "close",
                           "its clock starts before the connection; on chat it stops at the role-only first chunk"),
                Equivalent("AIPerf", "Time to First Token (TTFT)", "same"),
                Equivalent("GuideLLM", "time_to_first_token_ms", "same"),
            ),
        ),
        MetricDefinition(
            "ttfo", "time to first visible output: content or a tool call, not reasoning (ttft with to: output)",
            "t_first_output - t_sent", "request",
            (
                Equivalent("vLLM bench serve", "", "different", "its TTFT stops at the first chunk, reasoning or not"),
                Equivalent("AIPerf", "Time to First Output Token (TTFO)", "same"),
                Equivalent("GuideLLM", "TTFOT", "close",
                           "from its first_output_token_iteration (first non-reasoning content); tool calls aside"),
            ),
        ),
        MetricDefinition(
            "ttst", "time to second token", "t_tokens[1] - t_tokens[0]", "request with 2+ token events",
            (
                Equivalent("vLLM bench serve", "", "different", "the first entry of its ITL list"),
                Equivalent("AIPerf", "Time to Second Token (TTST)", "same"),
                Equivalent("GuideLLM", "", "different"),
            ),
        ),
        MetricDefinition(
            "tpot", "time per output token, first token excluded",
            "(t_tokens[-1] - t_first_token) / (tokens - 1); tokens = usage.completion_tokens, else token events",
            "request with 2+ tokens",
            (
                Equivalent("vLLM bench serve", "TPOT", "same"),
                Equivalent("AIPerf", "Inter Token Latency (ITL)", "same"),
                Equivalent("GuideLLM", "inter_token_latency_ms", "same",
                           "its time_per_output_token_ms includes TTFT"),
            ),
        ),
        MetricDefinition(
            "itl", "inter-token (inter-chunk) gap",
            "t_tokens[i+1] - t_tokens[i], every gap (within: content or reasoning: that kind's stamps only)",
            "gap between token events",
            (
                Equivalent("vLLM bench serve", "ITL", "same", "it also times chunks with empty text"),
                Equivalent("AIPerf", "Inter Chunk Latency (ICL)", "same"),
                Equivalent("GuideLLM", "", "different", "keeps no per-gap distribution"),
            ),
        ),
        MetricDefinition(
            "e2e", "end-to-end latency", "t_tokens[-1] - t_sent", "complete request",
            (
                Equivalent("vLLM bench serve", "E2EL", "close", "its clock starts before the connection"),
                Equivalent("AIPerf", "Request Latency", "same"),
                Equivalent("GuideLLM", "request_latency", "close", "it ends when the response closes"),
            ),
        ),
    )
}


# -- the metrics of one stream, in ns ------------------------------------------------------------


def ttft_ns(stream: StreamRecord) -> int | None:
    """Send to the first token of any kind (reasoning counts)."""
    return stream.ttft_ns


def ttfo_ns(stream: StreamRecord) -> int | None:
    """Send to the first visible output (content or a tool call)."""
    return stream.ttfo_ns


def ttst_ns(stream: StreamRecord) -> int | None:
    """First to second token event (AIPerf's TTST); None with fewer than two."""
    stamps = stream.t_tokens
    return stamps[1] - stamps[0] if len(stamps) >= 2 else None


def tokens_per_event(stream: StreamRecord) -> float | None:
    """``usage.completion_tokens`` spread over the stream's token events (content, reasoning, tool-call
    fragments), where the server reported at least as many as there were events (a chunk may carry several
    tokens); None otherwise (each event is then one token)."""
    reported = (stream.usage or {}).get("completion_tokens")
    events = stream.token_events
    if events and isinstance(reported, (int, float)) and not isinstance(reported, bool) and reported >= events:
        return float(reported) / events
    return None


def output_tokens(stream: StreamRecord) -> int:
    """Generated tokens, reasoning included: ``usage.completion_tokens`` when the server reported at least
    as many as there were token events (a chunk may carry several tokens), else the token events."""
    reported = (stream.usage or {}).get("completion_tokens")
    events = stream.token_events
    if isinstance(reported, int) and not isinstance(reported, bool) and reported >= events:
        return reported
    return events


def e2e_ns(stream: StreamRecord) -> int | None:
    """Send to the last token event; None without one."""
    stamps = stream.t_tokens
    if stream.t_sent is None or not stamps:
        return None
    return stamps[-1] - stream.t_sent


def tpot_ns(stream: StreamRecord) -> float | None:
    """(last token - first token) / (tokens - 1), reasoning included, as the token count is; None below
    two tokens."""
    tokens = output_tokens(stream)
    stamps = stream.t_tokens
    if tokens < 2 or not stamps:
        return None
    return (stamps[-1] - stamps[0]) / (tokens - 1)


# -- rendering -----------------------------------------------------------------------------------

_MARK = {"same": "", "close": " (close)", "different": ""}


def _cell(eq: Equivalent) -> str:
    if not eq.name:
        return f"none ({eq.note})" if eq.note else "none"
    text = f"{eq.name}{_MARK[eq.match]}"
    return f"{text}: {eq.note}" if eq.note else text


def definition_line(name: str) -> str:
    """One line for a verdict's evidence: ``ttft = t_first_content - t_sent (AIPerf: ..., ...)``."""
    d = DEFINITIONS[name]
    same = [f"{e.tool} {e.name}" for e in d.equivalents if e.name and e.match == "same"]
    close = [f"{e.tool} {e.name}" for e in d.equivalents if e.name and e.match == "close"]
    parts = []
    if same:
        parts.append("same as " + ", ".join(same))
    if close:
        parts.append("close to " + ", ".join(close))
    return f"{d.name} = {d.stamps}, per {d.per}" + (f" ({'; '.join(parts)})" if parts else "")


def definitions_text() -> str:
    """The definitions for ``streamchaos list slas``."""
    lines = ["Metric definitions (t_sent: request at the socket; a token event: an SSE event with non-empty content, "
             "reasoning or a tool-call fragment; t_tokens: every token event's stamp)", ""]
    for d in DEFINITIONS.values():
        lines.append(f"{d.name}  {d.title}")
        lines.append(f"    {d.stamps}  (one sample per {d.per})")
        for eq in d.equivalents:
            lines.append(f"    {eq.tool + ':':<18} {_cell(eq)}")
        lines.append("")
    return "\n".join(lines)


def definitions_markdown() -> str:
    """The README's table of definitions, side by side with the other tools' names."""
    def esc(text: str) -> str:
        return text.replace("|", "\\|")

    lines = [
        "| ours | what it measures | stamps | " + " | ".join(TOOLS) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in TOOLS) + " |",
    ]
    for d in DEFINITIONS.values():
        cells = [f"`{d.name}`", f"{d.title}, one per {d.per}", f"`{d.stamps}`"]
        cells += [_cell(d.equivalent(tool)) for tool in TOOLS]
        lines.append("| " + " | ".join(esc(c) for c in cells) + " |")
    return "\n".join(lines)
