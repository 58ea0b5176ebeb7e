"""One survival probe: a rule on the innermost stream hop, one streaming request through the whole
path, and what became of it: whole, or cut, with how the client saw the cut and which hop cut it.

Which hop cut comes from the stream hops' taps of that request (matched by its ``X-Request-Id``, sent
UUID-shaped and read back to the probe's own id: ``chaos.model.request_ids``):
a stream hop whose downstream client left before the response ended (``t_client_gone``) was cut
from outside, so the cutter sits between it and the next stream hop outward (or the client). The
outermost stream hop that saw its client leave marks the segment: everything outward of it only saw
its upstream end. When no stream hop saw its client leave, the cut came from inside: the first hop,
from the target outward, whose upstream did not end with ``[DONE]`` (the target, or the gateways
between two stream hops), or a stream hop that received the whole stream and did not deliver it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from chaos.model.context import HopInfo
from chaos.model.errors import ChaosError
from chaos.model.observations import NS, STRICT_END, EndRule, StreamRecord, TapRecord
from chaos.model.request_ids import RequestIds, run_tag
from chaos.survival.search import CUT, ERROR, WHOLE, Trial

__all__ = ["DIMENSIONS", "Dimension", "Prober", "RuleAPI", "client_saw", "cut_by", "hint_s", "read_taps", "rule_for"]

RULE = "survival"  # the one rule a probe sets on the innermost stream hop (replaced by the next probe)
TAP_GRACE_S = 3.0  # how long after a cut (and after the hold or silence it was cut in) a hop's tap may take
REQUEST_MARGIN_S = 60.0  # the client's own timeout beyond the probed duration: the path cuts first, not us


@dataclass(frozen=True)
class Dimension:
    """One column of the matrix: what the rule holds, and with which keep-alive comments."""

    name: str
    what: str  # in words, for the report
    kind: str  # the stream hop's rule kind: hold | silence
    keepalive: str  # none | given (every --keepalive s) | fine (every min(1 s, resolution): bytes always flow)


DIMENSIONS: dict[str, Dimension] = {d.name: d for d in (
    Dimension("hold", "first event held D s, no keep-alive", "hold", "none"),
    Dimension("hold_keepalive", "first event held D s, ': keep-alive' comments meanwhile", "hold", "given"),
    Dimension("silence", "after 1 event, D s of silence, no keep-alive", "silence", "none"),
    Dimension("silence_keepalive", "after 1 event, D s of silence, comments meanwhile", "silence", "given"),
    Dimension("deadline", "after 1 event, D s with comments every min(1 s, resolution): the total duration the "
              "path lets a stream live while bytes flow", "silence", "fine"),
)}


def rule_for(dim: Dimension, duration_s: float, *, keepalive_s: float, resolution_s: float) -> dict[str, Any]:
    """The stream hop rule (kind and params) that holds ``dim`` for ``duration_s``."""
    every = {"none": None, "given": keepalive_s, "fine": min(1.0, resolution_s)}[dim.keepalive]
    if dim.kind == "hold":
        return {"kind": "hold", "params": {"seconds": duration_s, "keepalive_s": every, "headers": "send"}}
    return {"kind": "silence", "params": {"after_events": 1, "seconds": duration_s, "keepalive_s": every}}


def client_saw(record: StreamRecord, rule: EndRule = STRICT_END) -> tuple[str, str]:
    """How the client saw the stream end: a short cause (``whole``, ``http_status``, ``bare_eof``,
    ``reset``, ``error_event``, ``eof_without_done``, ``done_without_finish``, ``timeout``, ``connect``,
    ``other``) and the same in words, with the HTTP status it had."""
    head = f"HTTP {record.status}" if record.status is not None else "no response head"
    error = record.error
    if record.status is not None and record.status >= 400:
        return "http_status", f"HTTP {record.status}"
    if error is not None:
        message = error.message.lower()
        if error.kind == "timeout":
            return "timeout", f"{head}, then the client's own timeout"
        if "reset" in message:
            return "reset", f"{head}, then a TCP reset"
        if error.kind == "read":
            return "bare_eof", f"{head}, then a bare EOF (the connection closed mid-body)"
        return ("connect" if error.kind == "connect" else "other"), f"{head}, then {error.kind}: {error.message}"
    if record.in_band_error is not None:
        return "error_event", f"{head}, then an error event: {record.in_band_error}"[:300]
    if rule.done and not record.done_seen:
        return "eof_without_done", f"{head}, then a clean EOF without [DONE]"
    if rule.finish_reason and record.finish_reason is None:
        return "done_without_finish", f"{head}, then [DONE] without a finish_reason"
    return "whole", f"{head}, finish_reason {record.finish_reason!r} and [DONE]"


def _client_left(tap: TapRecord) -> bool:
    return tap.t_client_gone is not None or tap.down_end == "client_gone"


def _between(path: Sequence[HopInfo], outer: int, inner: int) -> str:
    """The hops strictly between positions ``outer`` (-1: the client) and ``inner`` (len: the target)."""
    names = [h.name for h in path[outer + 1:inner]]
    if names:
        return " or ".join(names)
    if inner >= len(path):
        return "the target"
    if outer < 0:
        return "the client"
    return f"the connection between {path[outer].name} and {path[inner].name}"


def cut_by(path: Sequence[HopInfo], taps: Mapping[str, TapRecord]) -> str | None:
    """The hop (or segment of hops) that cut the stream, from its taps; None when a stream hop's tap
    is missing (it taps nothing, or never saw the request)."""
    stream = [i for i, hop in enumerate(path) if hop.kind == "stream"]
    if not stream or any(path[i].name not in taps for i in stream):
        return None
    for pos, i in enumerate(stream):  # outermost first: the first that saw its client leave
        if _client_left(taps[path[i].name]):
            return _between(path, stream[pos - 1] if pos else -1, i)
    inner = len(path)
    for i in reversed(stream):  # from the target outward: where the whole stream stopped arriving
        tap = taps[path[i].name]
        if tap.up_end != "done":
            return _between(path, i, inner)
        if tap.down_end != "done":
            return path[i].name
        inner = i
    return _between(path, -1, stream[0])


def hint_s(dim: Dimension, record: StreamRecord) -> float | None:
    """Where on ``dim``'s scale the cut came: seconds into the hold (from the response head) or into
    the silence (from the first event); None when the stream never got that far."""
    if record.t_end is None:
        return None
    start = record.t_headers if dim.kind == "hold" else record.t_first_token  # reasoning is the first event too
    if start is None:
        return None
    return max(0.0, (record.t_end - start) / NS)


def read_taps(files: Mapping[str, Path], request_id: str) -> dict[str, TapRecord]:
    """Each stream hop's tap of ``request_id``, from its taps file (``chaos.execution.path.read_taps``:
    bounded, never through a link; a line still being written, or a file not there yet, is skipped)."""
    from chaos.execution.path import read_taps as read_file

    found: dict[str, TapRecord] = {}
    for hop, path in files.items():
        mine = [t for t in read_file(path, hop).records if t.request_id == request_id]
        if mine:
            found[hop] = mine[-1]
    return found


class RuleAPI(Protocol):
    """What a probe needs of the stream hop's control API (``chaos.hops.client.StreamHopAPI``)."""

    async def put_rule(self, rule: str, kind: str, params: dict[str, Any], *, seed: int,
                       share: float = 1.0) -> dict[str, Any]: ...

    async def delete_rule(self, rule: str) -> dict[str, Any]: ...


@dataclass
class Prober:
    """Probes of one path: each sets the rule on the innermost stream hop, sends one request through
    the path's first hop, removes the rule, and reads the taps when the stream was cut."""

    path: Sequence[HopInfo]  # load side first
    api: RuleAPI  # the innermost stream hop's control API
    url: str  # the request's URL through the path's first hop
    body: Mapping[str, Any]
    taps: Mapping[str, Path]  # each stream hop's taps file
    api_key: str | None = None
    end_rule: EndRule = STRICT_END
    keepalive_s: float = 2.0
    resolution_s: float = 1.0
    seed: int = 0
    sink: Callable[[StreamRecord], None] | None = None  # each probe's stream, as the client saw it (the journal)
    sent: int = 0
    request_ids: str = "uuid"  # the X-Request-Id a probe sends: uuid (its id UUID-shaped) | sequence (its id)
    run: int | None = None  # the run's tag in its UUID-shaped ids (None: from the seed and this prober's start)

    def __post_init__(self) -> None:
        tag = self.run if self.run is not None else run_tag(self.seed, f"survival:{time.time_ns()}")
        self._ids = RequestIds(self.request_ids, tag)

    def request_id(self, label: str) -> str:
        """The probe's own id (its record's, in reports): ``survival-<label>-<n>-<6 hex digits>``."""
        self.sent += 1
        return f"survival-{label}-{self.sent}-{secrets.token_hex(3)}"

    def wire_id(self, request_id: str) -> str:
        """The X-Request-Id the probe ``request_id`` goes out with (what a gateway's log shows)."""
        return self._ids.wire(request_id)

    async def send(self, request_id: str, timeout_s: float) -> StreamRecord:
        """One streaming request through the path; its record (never raises for what the path does)."""
        from chaos.load.client import make_http_client, stream_request

        record = StreamRecord(id=request_id, phase="survival",
                              endpoint="chat" if self.url.endswith("/chat/completions") else "completions")
        http = make_http_client(1, api_key=self.api_key)
        try:
            await stream_request(http, self.url, self.body, record, request_timeout=timeout_s,
                                 headers={"X-Request-Id": self.wire_id(request_id)})
        finally:
            await http.aclose()
        if self.sink is not None:
            self.sink(record)
        return record

    async def baseline(self) -> Trial:
        """The path with no rule: a stream that is not whole here says the path itself is broken."""
        rid = self.request_id("baseline")
        began = time.monotonic()
        record = await self.send(rid, REQUEST_MARGIN_S)
        return await self._judged(rid, record, began, 0.0, None)

    async def __call__(self, dim: Dimension, duration_s: float) -> Trial:
        rid = self.request_id(dim.name)
        rule = rule_for(dim, duration_s, keepalive_s=self.keepalive_s, resolution_s=self.resolution_s)
        began = time.monotonic()
        try:
            await self.api.put_rule(RULE, rule["kind"], rule["params"], seed=self.seed)
        except ChaosError as exc:
            return Trial(duration_s, ERROR, time.monotonic() - began, detail={"error": f"setting the rule: {exc}"})
        try:
            record = await self.send(rid, duration_s + REQUEST_MARGIN_S)
        finally:
            try:
                await self.api.delete_rule(RULE)
            except ChaosError:
                pass  # the next probe's rule replaces it, and it dies with the hop
        return await self._judged(rid, record, began, duration_s, dim)

    async def _judged(self, rid: str, record: StreamRecord, began: float, duration_s: float,
                      dim: Dimension | None) -> Trial:
        how, words = client_saw(record, self.end_rule)
        detail: dict[str, Any] = {"request_id": rid, "wire_id": self.wire_id(rid), "client_saw": words, "how": how,
                                  "status": record.status, "events": record.events}
        if how == "whole":
            return Trial(duration_s, WHOLE, time.monotonic() - began, detail=detail)
        if how == "connect":
            detail["error"] = f"the path's first hop could not be reached: {words}"
            return Trial(duration_s, ERROR, time.monotonic() - began, detail=detail)
        # the hop holding the stream may notice its client left only when the hold or silence ends
        taps = await self.wait_for_taps(rid, max(0.0, duration_s - (time.monotonic() - began)) + TAP_GRACE_S)
        hop = cut_by(self.path, taps)
        missing = [name for name in self.taps if name not in taps]
        detail["cut_by"] = hop if hop is not None else f"unknown (no tap from {', '.join(missing) or 'a stream hop'})"
        detail["taps"] = {name: {"up_end": t.up_end, "down_end": t.down_end, "status_down": t.status_down,
                                 "client_gone": t.t_client_gone is not None} for name, t in taps.items()}
        hint = hint_s(dim, record) if dim is not None else None
        return Trial(duration_s, CUT, time.monotonic() - began, hint_s=hint, detail=detail)

    async def wait_for_taps(self, request_id: str, within_s: float) -> dict[str, TapRecord]:
        """Every stream hop's tap of the request, as soon as all are written, or what there is after ``within_s``."""
        deadline = time.monotonic() + within_s
        while True:
            found = read_taps(self.taps, request_id)
            if len(found) == len(self.taps) or time.monotonic() >= deadline:
                return found
            await asyncio.sleep(0.1)
