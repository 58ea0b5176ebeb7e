"""`early_close`: the share of streams that ended without a proper terminal event, against a budget.

A stream is complete when a non-null ``finish_reason`` and ``data: [DONE]`` were both seen and no
error came, in band or otherwise (``StreamRecord.is_complete``; reference §2.7: vLLM and TGI send
``[DONE]`` after an error event, so ``[DONE]`` alone proves nothing). The run's engine profile may
not require ``[DONE]`` (``transformers serve`` never sends it): the rule the run recorded in its
journal (``Observations.end_rule``) is the one applied, and the evidence says which it was. Streams a client fault hung
up on purpose are not judged and are counted separately.

Truncation is never success, whatever the status: each early close has one *cause* (``by_cause``
counts them), as the client saw it: ``http_status`` (a status of 400 or more), ``error_event`` (an
``{"error": ...}`` event), ``bare_eof`` (the connection closed cleanly in the middle of a framed body:
a truncated 200), ``reset`` (a TCP reset), ``no_response`` (closed before a response head),
``timeout``, ``protocol``, ``connect``, ``cancelled``, ``done_without_finish`` (``[DONE]`` with no
finish reason: a clean-looking end of a cut stream) or ``eof_without_done`` (a body that ended cleanly
without the terminal event). ``ErrorInfo.cause`` tells a bare EOF from a reset; in a journal written
before it existed, the error's message does. Where stream hops tapped the request, the offender also
says where the cut happened (``cut_at``: at a stream hop, naming the rules that acted on it, or
between two hops, naming the gateways between from the run's path note), and a stream hop's deadline
makes the cause ``deadline`` (the client's own view kept as ``seen_as``).

A stream that looks complete can still have been cut: one that ends with ``finish_reason: length``
before ``max_tokens`` while the load asked for ``ignore_eos`` (the run's ``preflight`` note says which
convenience fields every request carried) is an early close with cause ``short_length``: with
``ignore_eos`` the only way to end on ``length`` is to reach ``max_tokens``. The count is the
server's own ``usage.completion_tokens``; a stream without it is not judged short: its content
events only bound its tokens from below, since an engine may put several tokens in one event
(llama-cpp-python sends the bytes of a character it held back as one event: 30-31 events for 32
tokens, every stream of a healthy server "short" by events). The load asks for usage unless the
engine refused it, and the preflight names a server that ignores the request. A context window
shorter than prompt + ``max_tokens`` ends a stream on ``length`` early too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from chaos.model.context import HaltSpec
from chaos.model.observations import STRICT_END, EndRule, Observations, StreamRecord, TapRecord
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Status, Verdict, verifier
from sla.common import MAX_IDS
from sla.integrity import usage_tokens
from sla.relay import PathHop, between, path_hops, stream_hop_names

__all__ = ["EarlyClose", "close_cause", "cut_at", "ignore_eos_sent", "short_length", "why_incomplete"]

PREFLIGHT_TOPIC = "preflight"  # the runner's note of the preflight: its "sent" lists the load's convenience fields

SCHEMA = Schema(
    (
        Param("budget", "fraction", default=0.0, doc="the largest share of streams that may close early"),
        Param("min_samples", "int", default=1, min=1, doc="fewer judged streams than this: inconclusive"),
    )
)


def why_incomplete(stream: StreamRecord, rule: EndRule = STRICT_END) -> list[str]:
    """The reasons a stream is not complete, in the vocabulary of reference §2.7; empty if complete."""
    why: list[str] = []
    if stream.status is not None and stream.status >= 400:
        why.append("http_error")
    if stream.error is not None and f"{stream.error.kind}_error" not in why:
        why.append(f"{stream.error.kind}_error")  # read_error, timeout_error, ... (http_error once)
    if stream.in_band_error is not None:
        why.append("error_event")
    if stream.finish_reason is None and rule.finish_reason:
        why.append("no_finish_reason")
    if not stream.done_seen and rule.done:
        why.append("no_done")
    return why


def ignore_eos_sent(obs: Observations) -> bool:
    """Whether the load's requests carried ``ignore_eos`` (the preflight's note; False in a journal
    from before it said)."""
    notes = obs.notes_on(PREFLIGHT_TOPIC)
    sent = notes[-1].data.get("sent") if notes else None
    return isinstance(sent, list) and "ignore_eos" in sent


def short_length(stream: StreamRecord, ignore_eos: bool) -> str | None:
    """Why a stream that ended on ``length`` stopped short of its ``max_tokens`` although ``ignore_eos``
    was sent; None when it did not. Pure."""
    if not ignore_eos or stream.finish_reason != "length" or stream.max_tokens <= 0:
        return None
    tokens = usage_tokens(stream)
    if tokens is None or tokens >= stream.max_tokens:  # no usage: events bound the tokens from below only
        return None
    return (f"finish_reason length after {tokens} of max_tokens {stream.max_tokens} (usage.completion_tokens) "
            "although the request asked for ignore_eos")


_ERROR_CAUSES = {"timeout": "timeout", "protocol": "protocol", "connect": "connect", "cancelled": "cancelled",
                 "http": "http_status", "in_band": "error_event"}


def _read_cause(message: str) -> str:
    """A read failure's cause from its message, for journals written before ``ErrorInfo.cause``."""
    text = message.lower()
    if "reset" in text:
        return "reset"
    if "without sending a response" in text:
        return "no_response"
    if "without sending complete message body" in text or "incomplete" in text:
        return "bare_eof"
    return "read"


def close_cause(stream: StreamRecord) -> str:
    """The one cause of an early close, as the client saw it (see the module's docstring). Pure."""
    if stream.status is not None and stream.status >= 400:
        return "http_status"
    if stream.in_band_error is not None:
        return "error_event"  # the server said why; a reset or [DONE] after it is the aftermath
    err = stream.error
    if err is not None:
        if err.kind == "read":
            return err.cause or _read_cause(err.message)
        return _ERROR_CAUSES.get(err.kind, err.kind)
    if stream.done_seen:
        return "done_without_finish"
    return "eof_without_done"


# how a tap says a side ended badly: from upstream (the cut came from behind the hop), or downstream
_BROKEN_UP = frozenset({"bare_eof", "reset", "timeout"})
_CUT_DOWN = frozenset({"bare_eof", "reset", "error_event", "deadline", "status"})


def _broken_upstream(tap: TapRecord, rule: EndRule) -> bool:
    """The tap received a broken stream from upstream: cut, reset, timed out, an error status, or (when
    the rule wants ``[DONE]``) a body that ended without it."""
    return (tap.up_end in _BROKEN_UP or (tap.up_end == "eof" and rule.done)
            or (tap.status_up is not None and tap.status_up >= 400))


def cut_at(taps: list[TapRecord], path: list[PathHop] | None, rule: EndRule) -> tuple[str, str | None] | None:
    """Where one request's stream was cut, from its taps (load side first), walked from the engine out:
    (where, the stream hop's own end when a hop cut it itself, e.g. ``deadline``); None without taps.
    Every hop relayed it whole: the cut lies between the outermost stream hop and the load."""
    inner: str | None = None
    for tap in reversed(taps):
        if _broken_upstream(tap, rule):
            gateways = between(path, tap.hop, inner)
            via = f" ({', '.join(gateways)})" if gateways else ""
            return f"between {inner or 'the target'} and {tap.hop}{via}", None
        if tap.up_end == "cut" or tap.down_end in _CUT_DOWN:
            rules = f" (rules: {', '.join(tap.faults)})" if tap.faults else ""
            return f"at stream hop {tap.hop}{rules}", tap.down_end
        inner = tap.hop
    if not taps:
        return None
    if taps[0].down_end == "client_gone":
        return f"the load left first (seen at {taps[0].hop})", None
    gateways = between(path, None, taps[0].hop)
    via = f" ({', '.join(gateways)})" if gateways else ""
    return f"between {taps[0].hop} and the load{via}", None


def _taps_by_request(obs: Observations) -> dict[str, list[TapRecord]]:
    """Each request's taps, load side first (path order when recorded, else the order they accepted it)."""
    order = {name: i for i, name in enumerate(stream_hop_names(obs))}
    out: dict[str, list[TapRecord]] = {}
    for tap in sorted(obs.taps, key=lambda t: t.t_accept):
        if tap.request_id is not None:
            out.setdefault(tap.request_id, []).append(tap)
    for taps in out.values():
        taps.sort(key=lambda t: (order.get(t.hop, len(order)), t.t_accept))
    return out


def _offender(stream: StreamRecord, why: list[str], taps: list[TapRecord] | None, path: list[PathHop] | None,
              rule: EndRule) -> dict[str, Any]:
    cause = close_cause(stream)
    entry: dict[str, Any] = {"id": stream.id, "why": why, "cause": cause}
    if stream.error:
        entry["error"] = stream.error.message
    where = cut_at(taps, path, rule) if taps else None
    if where is not None:
        entry["cut_at"] = where[0]
        if where[1] == "deadline":
            entry["cause"], entry["seen_as"] = "deadline", cause
    return entry


@verifier
@dataclass(frozen=True, kw_only=True)
class EarlyClose(SlaSpec):
    kind = "early_close"
    summary = "share of streams that ended without finish_reason and [DONE] (hang-ups excluded)"
    schema = SCHEMA
    timing = False
    better = "lower"
    capacity_fit = True
    needs = ("end_of_stream",)
    sample_label = None

    budget: float
    min_samples: int

    def samples(self, obs: Observations, phase: str | None) -> list[float] | None:
        return None  # a share of streams cut short: counts, no sample of values

    def budget_rule(self) -> BudgetRule:
        return BudgetRule.policy("a ceiling on early closes is a policy, not a measurement")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return None

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        budget: float = self.budget
        min_samples: int = self.min_samples
        population = obs.population(phase)
        judged = [st for st in population if st.hangup is None]
        hung_up = len(population) - len(judged)
        rule = obs.end_rule
        offenders = [(st, why_incomplete(st, rule)) for st in judged if not st.is_complete(rule)]
        ignore_eos = ignore_eos_sent(obs)
        short = [(st, why) for st in judged if st.is_complete(rule) and (why := short_length(st, ignore_eos))]
        offenders += [(st, ["short_length"]) for st, _ in short]

        taps = _taps_by_request(obs) if obs.taps else {}
        path = path_hops(obs)
        described = [_offender(st, why, taps.get(st.id), path, rule) for st, why in offenders]
        for entry, (_, why_short) in zip(described[len(offenders) - len(short):], short, strict=True):
            entry.update(cause="short_length", detail=why_short)
        evidence: dict[str, Any] = {
            "streams": len(judged),
            "incomplete": len(offenders),
            "hung_up_excluded": hung_up,
            "end_rule": (("finish_reason" if rule.finish_reason else "")
                         + (" and [DONE]" if rule.done else " ([DONE] not required)")),
            "by_reason": dict(Counter(reason for _, why in offenders for reason in why)),
            "by_cause": dict(Counter(entry["cause"] for entry in described)),
            "ignore_eos_sent": ignore_eos,
            "offenders": described[:MAX_IDS],
        }
        cut = Counter(entry["cut_at"] for entry in described if "cut_at" in entry)
        if cut:
            evidence["by_cut_at"] = dict(cut)
        if len(judged) < min_samples:
            evidence["reason"] = f"{len(judged)} judged streams (hang-ups excluded), at least {min_samples} needed"
            return Verdict("early_close", phase, "inconclusive", None, budget, "fraction", len(judged), evidence)
        share = len(offenders) / len(judged)
        status: Status = "pass" if share <= budget else "fail"
        return Verdict("early_close", phase, status, share, budget, "fraction", len(judged), evidence)
