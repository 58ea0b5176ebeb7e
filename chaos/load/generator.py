"""The load driver of one process: closed- or open-loop arrivals of streaming requests → StreamRecords.

Closed loop (``concurrency``): that many slots each send back-to-back, each slot in effect on its
own kept-alive connection. Open loop (``rate``): a seeded Gamma arrival process whose schedule
never waits for the server (coordinated-omission free); each record keeps ``t_scheduled`` (when
the arrival process wanted it sent) apart from ``t_sent``. Arrivals beyond the in-flight safety cap
wait client-side, as scheduled times in a bounded queue (no task each), and are counted as
overflows; those still queued at the deadline, or beyond the queue's bound, are abandoned.

Coordinated omission made visible: the generator also keeps, per phase, its own *send delay*:
``t_sent`` minus the moment the request could have gone (its scheduled time, or the moment a slot
freed for an arrival that had to queue). That is the client's lateness alone, apart from the
in-flight cap's queueing; ``lag_stats()`` reports it beside the event-loop lag, and a p99 above
the lag threshold marks the client saturated (``chaos.execution.verify``).

Workload kinds (``chaos.load.workloads``): ``single`` and ``shared_prefix`` requests go out as above, one
request number each; a Mooncake trace is an open loop whose schedule is the trace's timestamps; sessions
(and ShareGPT replays) are coroutines, one per slot (closed loop: each slot runs sessions back to back) or
per arrival (open loop: ``rate`` sessions a second), each sending its turns one after the other.

It also serves as the ``BackgroundLoad`` that faults use for their own streams.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, NamedTuple

from chaos.host.tls import trust_data
from chaos.load.backoff import DEFAULT_CONNECT_BACKOFF, ConnectBackoff
from chaos.load.client import StreamCall, StreamClient, make_http_client, stream_request
from chaos.load.lag import LagMonitor, delay_summary
from chaos.load.pacer import Pacer
from chaos.load.sdk_headers import request_headers, request_id_header
from chaos.load.workload import (
    LoadSettings,
    LoadSpecLike,
    LoadTarget,
    Prompt,
    Workload,
    body_fields,
    build_body,
    endpoint_url,
    gamma_gaps,
    synthetic_text,
)
from chaos.load.workloads.sessions import SessionPlan, run_session
from chaos.model.context import ClientPolicy
from chaos.model.errors import ExperimentInvalid
from chaos.model.observations import ErrorInfo, Hangup, StreamRecord
from chaos.model.request_ids import RequestIds, run_tag
from chaos.model.trace_ids import TRACEPARENT_HEADER, span_id_of, traceparent

__all__ = ["BACKLOG_CAP", "DEFAULT_INFLIGHT_CAP", "LoadGenerator"]

DEFAULT_INFLIGHT_CAP = 1024  # open loop without a concurrency bound: per process, as GuideLLM does
BACKLOG_CAP = 65_536  # open-loop arrivals queued for a slot (an int pair each); beyond it: abandoned
SEND_DELAY_KEEP = 100_000  # send-delay samples kept per phase (newest)
# the open loop makes arrivals this far past the next one due before waiting for it (a burst in one ms is
# made whole before its first goes), and at most this many
LOOKAHEAD_NS = 2_000_000
LOOKAHEAD_MAX = 64


_SETTLE_POLL_S = 0.01  # how often start() looks whether its background streams have their first token
_IDLE_SESSIONS = 256  # a closed-loop slot whose sessions sent nothing this many times in a row stops


def _traceparent_of(spec: LoadSpecLike, target: LoadTarget) -> str | None:
    """The trace id each request's ``traceparent`` names (the run's, ``--otlp``), unless ``load.headers`` names
    a traceparent of its own (sent as given); None: none sent."""
    return None if any(n.lower() == TRACEPARENT_HEADER for n, _ in spec.headers) else target.trace_id


class LoadGenerator:
    """Drive one process's share of the load; see the module docstring."""

    def __init__(
        self,
        spec: LoadSpecLike,
        target: LoadTarget,
        *,
        policy: ClientPolicy,
        sink: Callable[[StreamRecord], None],
        worker_index: int = 0,
        workers: int = 1,
    ) -> None:
        self.workload = Workload(spec, model=target.model, seed=target.seed, worker_index=worker_index)
        self.kind = self.workload.kind
        self.timed = self.workload.settings.timed  # a Mooncake trace: its timestamps are the schedule
        if spec.concurrency is None and spec.rate is None and not self.timed:
            raise ExperimentInvalid("load: give concurrency (closed loop) or rate (open loop, requests/s)")
        self.spec = spec
        self.target = target
        for pem in target.ca_pems:  # what the run serves over TLS itself (chaos.host.certs): one trust policy
            trust_data(pem)
        self.settings = LoadSettings.of(spec)
        self._id_header, self._trace_id = request_id_header(spec.headers), _traceparent_of(spec, target)  # or None
        # each request's X-Request-Id: its record id as a UUID-shaped id of the run (``load.request_ids: uuid``)
        # or as it is (``sequence``); the hops' taps are read back to the record id (chaos.execution.path)
        self._ids = RequestIds(self.settings.request_ids,
                               target.run_tag if target.run_tag is not None else run_tag(target.seed))
        self.http_version = self.settings.http_version  # "auto": decided by ALPN in ``run`` (``negotiate``)
        self.policy = policy
        self.sink = sink
        self.worker_index = worker_index
        self.workers = workers
        self.phase = ""
        self.url = endpoint_url(target.base_url, spec.endpoint)
        self.open_loop = spec.rate is not None or self.timed
        # with a rate, a concurrency (if given) is the client's in-flight bound
        self.inflight_cap = spec.concurrency if spec.concurrency else DEFAULT_INFLIGHT_CAP
        self.overflows = 0  # open-loop arrivals that found the in-flight cap full and waited
        self.abandoned = 0  # of those, arrivals never sent: still queued at the deadline, or the queue was full
        self.sent = 0
        self.sessions = 0  # sessions started (sessions, ShareGPT replay)
        self._session_plan: SessionPlan | None = None
        self._session_source: Any = None
        self.connect_backoffs = 0  # closed-loop waits after an outage's answer (``load.connect_backoff``)
        self.connect_backoff_s = 0.0  # and their planned seconds in all
        self.deadline_ns = 0  # when sending stops (monotonic); ``move_deadline`` moves it during ``run``
        self._deadline_moved = asyncio.Event()
        self._next = 0
        self._http: StreamClient | None = None
        self._bg_http: StreamClient | None = None
        self.send_delays: dict[str, deque[float]] = {}  # phase → seconds late, newest last
        self._inflight: set[asyncio.Task[StreamRecord]] = set()
        self._records: dict[asyncio.Task[StreamRecord], StreamRecord] = {}
        self._bg: dict[str, tuple[list[asyncio.Task[None]], set[asyncio.Task[StreamRecord]]]] = {}
        self._bg_count = 0
        self._bg_stopping: set[str] = set()
        self.lag = LagMonitor(threshold_s=spec.lag_threshold)
        # what the workload kind needs (the tokenizer, a trace, the prefixes, the sessions' source), made now:
        # a load process is built before the run starts, so its first requests are not late by it
        self.workload.prepare()
        if self.workload.settings.conversational:
            self._sessions_ready()

    # ---- request plumbing -------------------------------------------------------------------

    def _client(self) -> StreamClient:
        if self._http is None:
            self._http = self._new_client(self.inflight_cap)
        return self._http

    async def _settle_version(self) -> None:
        """``load.http.version: auto``: what the server picks by ALPN, asked once, before the first client is
        made (``run``, or a fault's background load that starts before it)."""
        if self.http_version == "auto":
            from chaos.load.http2 import negotiate

            try:
                self.http_version = await negotiate(self.url)
            except OSError:  # unreachable now (TimeoutError, ssl.SSLError too): each request records what it meets
                self.http_version = "1.1"

    def _new_client(self, connections: int) -> StreamClient:
        s = self.settings
        return make_http_client(connections, api_key=self.target.api_key, headers=self._headers(),
                                version=self.http_version, streams_per_connection=s.streams_per_connection,
                                stream_window=s.stream_window, reuse=s.keep_alive != "off")

    def _headers(self) -> dict[str, str]:
        """What every request of this load sends: the SDK's headers with the experiment's ``load.headers``."""
        return request_headers(self.spec.headers, self.spec.request_timeout)

    def _claim(self) -> int | None:
        """The next request number of this worker, or None when max_requests is reached."""
        if self._claims_spent():
            return None
        n = self._next
        self._next += 1
        return n

    def _record(self, request_id: str, body: dict[str, Any], prompt: Prompt, *,
                background: bool = False) -> StreamRecord:
        record = StreamRecord(
            id=request_id,
            phase=self.phase,
            endpoint=self.spec.endpoint,
            prompt_chars=prompt.chars,
            max_tokens=int(body["max_tokens"]),
            expected_text=prompt.expected_text,
            background=background,
        )
        if self.kind != "single" and not background:  # single-turn records stay as they were (workload None)
            record.workload = self.kind
            record.prompt_tokens = prompt.tokens
            record.prefix_group = prompt.group
        return record

    def _spawn(self, n: int, t_scheduled: int | None, t_ready: int | None = None,
               made: _Made | None = None) -> asyncio.Task[StreamRecord]:
        """Start request ``n``; ``t_ready``: when it could have gone (open loop), for the send delay; ``made``:
        its body, prompt and request bytes when made ahead (``_make``, a pure function of n)."""
        request_id = f"{self.worker_index}-{n}"
        if made is None:
            made = _Made(*self.workload.request(n), None, None)
        record = self._record(request_id, made.body, made.prompt)
        return self._send(request_id, made.body, record, t_scheduled, t_ready, made.payload, made.plan_rng)

    def _make(self, n: int) -> _Made:
        """Request ``n`` made ahead of its time: its body and prompt, its request bytes encoded and its client
        plan's generator seeded now (each a few µs that a burst's last request would otherwise wait for)."""
        body, prompt = self.workload.request(n)
        http = self._client()
        request_id = f"{self.worker_index}-{n}"
        try:
            payload: object | None = http.encode(http.target(self.url), body, self._id_of(request_id))
        except ValueError:
            payload = None  # a header or URL it cannot send: the request's own run records why
        return _Made(body, prompt, payload, self._plan_rng(request_id))

    def _id_of(self, request_id: str) -> dict[str, str]:
        """The request's own id header as it goes on the wire, unless ``load.headers`` names it (``_id_header``),
        and with a trace id its ``traceparent``: its span id derived from that wire id (chaos.model.trace_ids)."""
        if self._trace_id is None:
            return {self._id_header: self._ids.wire(request_id)} if self._id_header else {}
        wire = self._ids.wire(request_id)
        out = {self._id_header: wire} if self._id_header else {}
        out[TRACEPARENT_HEADER] = traceparent(self._trace_id, span_id_of(wire))
        return out

    def _plan_rng(self, request_id: str) -> random.Random:
        # seeded by the request id: the same request gets the same client behaviour in every replay, whatever
        # the timing
        return random.Random(f"{self.target.seed}:client:{request_id}")

    def _send(self, request_id: str, body: dict[str, Any], record: StreamRecord, t_scheduled: int | None,
              t_ready: int | None, payload: object | None = None,
              plan_rng: random.Random | None = None) -> asyncio.Task[StreamRecord]:
        """Send ``body`` as ``record``'s stream: the client plan drawn, the task tracked to its sink. With its
        request bytes made ahead (``payload``), it is written now when an idle connection waits
        (``StreamCall.send_now``), before the task that reads its response first runs."""
        record.t_scheduled = t_scheduled
        plan = self.policy.plan(plan_rng or self._plan_rng(request_id))
        self.sent += 1
        call = StreamCall(self._client(), self.url, body, record, plan=plan, request_timeout=self.spec.request_timeout,
                          headers=self._id_of(request_id), payload=payload)
        sent_now = call.send_now()
        task = self._launch(record, call.run)
        if sent_now:  # a task cancelled before its first step never ran call.run: what it took goes back
            task.add_done_callback(lambda _task: call.abandon())
        self._inflight.add(task)
        self._records[task] = record
        task.add_done_callback(self._inflight.discard)
        task.add_done_callback(self._forget)
        if t_ready is not None:
            task.add_done_callback(functools.partial(self._note_send_delay, record, t_ready))
        return task

    def last_activity(self) -> list[int]:
        """For each foreground stream in flight, when it last got a byte (or was sent): monotonic ns.
        A frozen target still accepts connections; these stamps are how a halt sees it (chaos.execution.halt)."""
        out = []
        for task in self._inflight:
            record = self._records.get(task)
            if record is None or record.t_sent is None:
                continue
            stamps = [record.t_sent, record.t_headers, record.t_first_byte, record.t_first_event,
                      record.t_content[-1] if record.t_content else None,
                      # a reasoning phase or a tool call streams no content: its tokens are activity too
                      record.t_reasoning[-1] if record.t_reasoning else None,
                      record.t_tool_calls[-1] if record.t_tool_calls else None]
            out.append(max(t for t in stamps if t is not None))
        return out

    def _note_send_delay(self, record: StreamRecord, t_ready: int, _task: asyncio.Task[StreamRecord]) -> None:
        if record.t_sent is None:
            return
        samples = self.send_delays.get(record.phase)
        if samples is None:
            samples = self.send_delays[record.phase] = deque(maxlen=SEND_DELAY_KEEP)
        samples.append(max(0, record.t_sent - t_ready) / 1e9)

    def _forget(self, task: asyncio.Task[StreamRecord]) -> None:
        self._records.pop(task, None)

    def _launch(self, record: StreamRecord, make: Callable[[], Awaitable[StreamRecord]],
                bg_fault: str | None = None) -> asyncio.Task[StreamRecord]:
        async def run() -> StreamRecord:
            return await make()  # created here, so a task cancelled before it starts leaves no coroutine behind

        task = asyncio.get_running_loop().create_task(run(), name=f"stream-{record.id}")
        task.add_done_callback(functools.partial(self._done, record, bg_fault))
        return task

    def _done(self, record: StreamRecord, bg_fault: str | None, task: asyncio.Task[StreamRecord]) -> None:
        """Every record reaches the sink exactly once, cancelled and failed ones included."""
        now = time.monotonic_ns()
        if task.cancelled():
            if bg_fault is not None and bg_fault in self._bg_stopping:
                _mark_stopped(record, bg_fault, record.t_end or now)
            elif record.error is None and record.hangup is None:
                # a request written at once (``StreamCall.send_now``) is sent before its task's first step
                record.error = ErrorInfo("cancelled", "cancelled before the request was sent" if record.t_sent is None
                                         else "the stream was still open when the load generator stopped waiting")
        elif task.exception() is not None:
            exc = task.exception()
            record.error = ErrorInfo("protocol", f"load generator failure: {type(exc).__name__}: {exc}"[:500])
        if record.t_end is None:
            record.t_end = now
        self.sink(record)

    # ---- the driver ----------------------------------------------------------------------------

    async def run(self, deadline_ns: int) -> None:
        """Send until ``deadline_ns`` (monotonic) or max_requests; in-flight streams keep running."""
        await self._settle_version()
        self._client()  # build the pool (and its TLS context) before the lag clock starts
        self.lag.start()
        self.deadline_ns = deadline_ns
        loop = asyncio.get_running_loop()
        if self.workload.settings.conversational:
            if self.open_loop:
                slots: list[asyncio.Task[None]] = [loop.create_task(self._open_sessions())]
            else:
                slots = [loop.create_task(self._session_slot(i)) for i in range(self.inflight_cap)]
        elif self.open_loop:
            driver = loop.create_task(self._open_loop())
            slots = [driver]
        else:
            slots = [loop.create_task(self._closed_slot(i)) for i in range(self.inflight_cap)]
        try:
            await self._until_deadline(slots)
        finally:
            for slot in slots:
                slot.cancel()  # a slot's request task is separate and keeps streaming
            await asyncio.gather(*slots, return_exceptions=True)

    async def move_deadline(self, deadline_ns: int) -> None:
        """Stop sending at ``deadline_ns`` instead (the runner's timeline knows the end only as it goes)."""
        self.deadline_ns = deadline_ns
        self._deadline_moved.set()

    async def _until_deadline(self, slots: list[asyncio.Task[None]]) -> None:
        """Until every slot is done or the deadline, as it stands then, has passed."""
        pending: set[asyncio.Future[Any]] = set(slots)
        while pending:
            self._deadline_moved.clear()
            remaining = (self.deadline_ns - time.monotonic_ns()) / 1e9
            if remaining <= 0:
                return
            moved = asyncio.ensure_future(self._deadline_moved.wait())
            try:
                _done, pending = await asyncio.wait(pending | {moved}, timeout=remaining,
                                                    return_when=asyncio.FIRST_COMPLETED)
            finally:
                moved.cancel()
            pending.discard(moved)

    async def _closed_slot(self, slot: int) -> None:
        # the target down (a crash fault, a dropped link, a gateway with nothing behind it): back off as a
        # real client does rather than re-send at once (chaos.load.backoff); jitter drawn per slot, seeded,
        # so a run replays
        driver = self._slot_driver(slot)
        while time.monotonic_ns() < self.deadline_ns:
            n = self._claim()
            if n is None:
                return
            task = self._spawn(n, None)
            await asyncio.wait([task])  # not `await task`: cancelling the slot must not cancel it
            record = task.result() if not task.cancelled() and task.exception() is None else None
            wait = driver.outage_wait(record)  # None: the server's own answer (a 500 included)
            if wait is not None:
                await asyncio.sleep(wait)

    def _schedule(self) -> Iterator[int]:
        """The open loop's arrival times, ns after its start: the trace's timestamps (a Mooncake trace),
        else the seeded Gamma process's (each gap rounded to the ns, as it always was)."""
        if self.timed:
            replay = self.workload.replay()
            yield from (replay.offset_ns(n) for n in range(len(replay)))
            return
        rate = float(self.spec.rate or 0.0)
        gaps = gamma_gaps(random.Random(f"{self.target.seed}:{self.worker_index}:arrivals"), rate, self.spec.burstiness)
        offset = 0
        while True:
            offset += int(next(gaps) * 1e9)
            yield offset

    async def _open_loop(self) -> None:
        schedule = self._schedule()
        slots = _Slots(self.inflight_cap)
        pacer = Pacer()  # wakes at each arrival to the tens of µs (asyncio.sleep: to the ms; chaos.load.pacer)
        ahead: deque[_Arrival] = deque()  # arrivals made ahead, in schedule order
        drain = False  # the arrivals ended with the trace or max_requests: what is queued still goes out
        more = True
        release = functools.partial(self._release_due, ahead, slots)
        t0 = time.monotonic_ns()
        try:
            while True:
                # every arrival due within LOOKAHEAD_NS of the next one is made (its prompt, its JSON, its request
                # bytes) while waiting for that one: a burst due in one millisecond goes out from one wake-up,
                # none of it made after its time, each making delaying all those after it
                while more and len(ahead) < LOOKAHEAD_MAX and (not ahead or ahead[-1].t - ahead[0].t <= LOOKAHEAD_NS):
                    offset = next(schedule, None)
                    if offset is None:  # the trace's last request is scheduled
                        more, drain = False, True
                        break
                    # the schedule only ever advances by its own gaps: a slow server never delays it
                    t_next = t0 + offset
                    if t_next >= self.deadline_ns:
                        more = False
                        break
                    n = self._claim()
                    if n is None:  # every request is claimed: those queued for a slot still go out (until the deadline)
                        more, drain = False, True
                        break
                    ahead.append(_Arrival(n, t_next, self._make(n) if slots.free > len(ahead) else None))
                if not ahead:
                    if drain:
                        await self._drain_backlog(slots)
                    return
                # the due ones go out from the timer's wake-up itself, written before any other callback runs
                await pacer.until(ahead[0].t, on_time=release)
        finally:
            pacer.close()
            # arrivals still queued for a slot at the deadline are abandoned, never sent
            self.abandoned += len(slots.backlog)
            slots.backlog.clear()
            slots.closed = True

    def _release_due(self, ahead: deque[_Arrival], slots: _Slots) -> None:
        """Send every arrival made ahead whose time has come (from the pacer's wake-up), or queue it for a slot."""
        now = time.monotonic_ns()
        while ahead and ahead[0].t <= now:
            arrival = ahead.popleft()
            if arrival.t >= self.deadline_ns:  # the deadline moved before it: neither it nor any later one goes
                ahead.clear()
                return
            if slots.free > 0:
                slots.free -= 1
                self._spawn_in_slot(slots, arrival.n, arrival.t, arrival.t, arrival.made)
            else:
                self.overflows += 1
                if len(slots.backlog) < BACKLOG_CAP:
                    slots.backlog.append((arrival.n, arrival.t))  # a scheduled time, not a task
                else:
                    self.abandoned += 1  # the queue is full: never sent

    @staticmethod
    async def _drain_backlog(slots: _Slots) -> None:
        """Until the arrivals queued for a slot have all gone out (the deadline cuts it short)."""
        if slots.backlog:
            slots.drained = asyncio.get_running_loop().create_future()
            await slots.drained

    def _spawn_in_slot(self, slots: _Slots, n: int, t_scheduled: int, t_ready: int,
                       made: _Made | None = None) -> None:
        try:
            task = self._spawn(n, t_scheduled, t_ready, made)
        except BaseException:
            slots.free += 1
            raise
        task.add_done_callback(functools.partial(self._slot_freed, slots))

    def _slot_freed(self, slots: _Slots, _task: asyncio.Task[StreamRecord]) -> None:
        """A request of this run ended: its slot goes to the oldest queued arrival, or is freed."""
        if slots.backlog and not slots.closed:
            n, t_scheduled = slots.backlog.popleft()
            if not slots.backlog and slots.drained is not None and not slots.drained.done():
                slots.drained.set_result(None)
            self._spawn_in_slot(slots, n, t_scheduled, time.monotonic_ns())
            return
        slots.free += 1

    # ---- sessions (chaos.load.workloads.sessions) ----------------------------------------------------

    def _sessions_ready(self) -> None:
        """The sessions' script source and shared plan, made once (a trace file is read here)."""
        if self._session_plan is not None:
            return
        from chaos.load.workloads.sessions import ShareGptSessions, SyntheticSessions

        settings = self.workload.settings
        source: Any
        if settings.kind == "sessions":
            p = self.spec.prompts
            lo, hi = self.spec.max_tokens
            source = SyntheticSessions(settings, seed=self.target.seed, worker_index=self.worker_index,
                                       chars=(p.min_chars, p.max_chars), mix=p.mix, max_tokens=(lo, hi))
        else:
            source = ShareGptSessions(settings, worker_index=self.worker_index, workers=self.workers,
                                      tokenizer=self.workload.tokenizer)
        self._session_source = source
        self._session_plan = SessionPlan(self.spec.endpoint, self.target.model, settings.on_cut, body_fields(self.spec),
                                         self.workload.tokenizer, settings.kind, settings.context_tokens)

    def _new_session(self, driver: _SessionSlot, t_start: int | None) -> Coroutine[Any, Any, int]:
        assert self._session_plan is not None
        k = self.sessions
        self.sessions += 1
        return run_session(driver, self._session_plan, self._session_source.session(k), t_start)

    async def _session_slot(self, slot: int) -> None:
        """A closed-loop slot: one session after another until the deadline or max_requests."""
        driver = self._slot_driver(slot)
        idle = 0  # sessions in a row that sent nothing (a replayed conversation too long for the context)
        while time.monotonic_ns() < self.deadline_ns and not self._claims_spent():
            if await self._new_session(driver, None):
                idle = 0
                continue
            idle += 1
            if idle >= _IDLE_SESSIONS:
                return  # nothing this slot could send: stop rather than spin
            await asyncio.sleep(0)

    async def _open_sessions(self) -> None:
        """Open loop: sessions arrive at ``rate`` a second (seeded Gamma gaps), each its own coroutine; at most
        ``inflight_cap`` live at once (one stream each), later arrivals queued, as requests are."""
        schedule = self._schedule()
        live = _LiveSessions(self)
        t0 = time.monotonic_ns()
        try:
            while not self._claims_spent():
                t_next = t0 + next(schedule)
                if t_next >= self.deadline_ns:
                    break
                delay = (t_next - time.monotonic_ns()) / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
                live.arrive(t_next)
            while live.tasks:  # the live sessions run their turns out (each stops at the deadline)
                await asyncio.wait(set(live.tasks))
        finally:
            await live.close()

    def _slot_driver(self, slot: int | str) -> _SessionSlot:
        backoff = ConnectBackoff(getattr(self.spec, "connect_backoff", DEFAULT_CONNECT_BACKOFF),
                                 random.Random(f"{self.target.seed}:{self.worker_index}:backoff:{slot}"))
        return _SessionSlot(self, backoff)

    def _claims_spent(self) -> bool:
        return self.spec.max_requests is not None and self._next >= self.spec.max_requests

    def send_turn(self, request_id: str, body: dict[str, Any], record_of: Callable[[StreamRecord], None],
                  chars: int, t_scheduled: int | None, t_ready: int | None) -> asyncio.Task[StreamRecord]:
        """Send one turn of a session (``chaos.load.workloads.sessions.run_session``)."""
        record = StreamRecord(id=request_id, phase=self.phase, endpoint=self.spec.endpoint, prompt_chars=chars,
                              max_tokens=int(body["max_tokens"]))
        record_of(record)
        return self._send(request_id, body, record, t_scheduled, t_ready)

    async def drain(self, timeout: float) -> int:
        """Wait for in-flight streams; cancel those still open after ``timeout``; return that count."""
        pending = set(self._inflight)
        if not pending:
            return 0
        _done, still = await asyncio.wait(pending, timeout=timeout)
        for task in still:
            task.cancel()
        await asyncio.gather(*still, return_exceptions=True)
        return len(still)

    async def aclose(self) -> None:
        for fault in list(self._bg):
            await self.stop(fault)
        for task in list(self._inflight):
            task.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
        await self.lag.stop()
        for client in (self._http, self._bg_http):
            if client is not None:
                await client.aclose()
        self._http = self._bg_http = None

    async def ready(self) -> None:
        """In-process: ready at once (``WorkerPool.ready`` waits for its processes)."""

    def lag_stats(self) -> dict[str, Any]:
        """The generator's own event-loop lag: p50/p99/max in ms, samples, threshold, saturated."""
        return self.lag.summary()

    def send_delay_stats(self) -> dict[str, dict[str, Any]]:
        """Per phase, the open loop's send delay (p50/p99/max in ms, samples); empty in closed loop."""
        return {phase: delay_summary(samples) for phase, samples in self.send_delays.items()}

    def stats(self) -> dict[str, Any]:
        extra = {"sessions": self.sessions} if self.workload.settings.conversational else {}
        if self._session_plan is not None and self._session_plan.trimmed:
            extra["sessions_trimmed"] = self._session_plan.trimmed  # ended before a turn the context could not hold
        return {**extra, "sent": self.sent, "in_flight": len(self._inflight), "overflows": self.overflows,
                "abandoned": self.abandoned, "inflight_cap": self.inflight_cap,
                "connect_backoffs": self.connect_backoffs, "connect_backoff_s": round(self.connect_backoff_s, 3),
                "loops": [kind] if (kind := _running_loop_kind()) else []}

    # ---- BackgroundLoad (faults' own streams, outside the SLA population) --------------------------

    async def start(self, fault: str, streams: int, prompt_chars: int, max_tokens: int,
                    settle_s: float = 0.0) -> int:
        """Keep ``streams`` background streams open for ``fault`` until ``stop(fault)``; wait up to
        ``settle_s`` until every one has its first token (the engine has its prompt's KV blocks), and
        return how many have by then. A fault that reads the engine's state at once would otherwise
        read it before the streams were admitted, later on a busier box."""
        if fault in self._bg:
            await self.stop(fault)
        if self._bg_http is None:
            await self._settle_version()
            self._bg_http = self._new_client(max(streams, 1) + 16)
        tasks: set[asyncio.Task[StreamRecord]] = set()
        current: list[StreamRecord | None] = [None] * streams  # each slot's stream now
        held = [False] * streams  # a slot whose stream had its first token, even one that has ended since
        loop = asyncio.get_running_loop()
        slots = [loop.create_task(self._bg_slot(fault, i, prompt_chars, max_tokens, tasks, current, held))
                 for i in range(streams)]
        self._bg[fault] = (slots, tasks)
        deadline = time.monotonic() + max(0.0, settle_s)
        while True:  # bounded by settle_s
            holding = sum(h or (r is not None and r.t_first_token is not None)  # any token: KV is held
                          for h, r in zip(held, current, strict=True))
            if holding >= streams or time.monotonic() >= deadline:
                return holding
            await asyncio.sleep(_SETTLE_POLL_S)

    async def _bg_slot(self, fault: str, slot: int, prompt_chars: int, max_tokens: int,
                       tasks: set[asyncio.Task[StreamRecord]], current: list[StreamRecord | None],
                       held: list[bool]) -> None:
        assert self._bg_http is not None
        while True:
            self._bg_count += 1
            # the fault is its hang-up's reason, not part of the id: a UUID-shaped id has no room for its name
            request_id = f"{self.worker_index}-bg-{self._bg_count}"
            rng = random.Random(f"{self.target.seed}:{self.worker_index}-bg-{fault}-{self._bg_count}")
            prompt = Prompt(text=synthetic_text(rng, prompt_chars, "ascii"))
            body = build_body(
                self.spec.endpoint, self.target.model, prompt,
                # the load's own switch: the preflight turned it off where the engine refuses the field
                max_tokens=max_tokens, temperature=self.spec.temperature, ignore_eos=self.spec.ignore_eos,
                include_usage=self.spec.include_usage,
            )
            record = self._record(request_id, body, prompt, background=True)
            current[slot] = record
            http = self._bg_http
            task = self._launch(record, self._bg_request(http, body, record, request_id), bg_fault=fault)
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.wait([task])
            held[slot] = held[slot] or record.t_first_token is not None
            if record.error is not None and record.error.kind != "cancelled":
                await asyncio.sleep(0.1)  # do not spin against a target that refuses

    def _bg_request(self, http: StreamClient, body: dict[str, Any], record: StreamRecord,
                    request_id: str) -> Callable[[], Awaitable[StreamRecord]]:
        """One background stream's request, bound to this pass of its slot's loop."""
        return lambda: stream_request(http, self.url, body, record, request_timeout=self.spec.request_timeout,
                                      headers=self._id_of(request_id))

    async def stop(self, fault: str) -> int:
        """Hang up the fault's background streams (a real disconnect); return how many were open."""
        entry = self._bg.pop(fault, None)
        if entry is None:
            return 0
        slots, tasks = entry
        self._bg_stopping.add(fault)
        try:
            for slot in slots:
                slot.cancel()
            await asyncio.gather(*slots, return_exceptions=True)
            running = list(tasks)
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        finally:
            self._bg_stopping.discard(fault)
        return len(running)


class _SessionSlot:
    """What one session (or a closed-loop slot's sessions, one after another) drives the generator through
    (``chaos.load.workloads.sessions.SessionDriver``), with the slot's own connect backoff."""

    def __init__(self, gen: LoadGenerator, backoff: ConnectBackoff) -> None:
        self.gen = gen
        self.backoff = backoff

    @property
    def deadline_ns(self) -> int:
        return self.gen.deadline_ns

    def claim(self) -> int | None:
        return self.gen._claim()  # noqa: SLF001 - the generator's own request numbering

    def send_turn(self, request_id: str, body: dict[str, Any], record_of: Callable[[StreamRecord], None],
                  chars: int, t_scheduled: int | None, t_ready: int | None) -> asyncio.Task[StreamRecord]:
        return self.gen.send_turn(request_id, body, record_of, chars, t_scheduled, t_ready)

    def outage_wait(self, record: StreamRecord | None) -> float | None:
        if not self.backoff.outage(record):
            self.backoff.reset()  # the server's own answer (a 500 included)
            return None
        wait = self.backoff.wait_s()
        self.gen.connect_backoffs += 1
        self.gen.connect_backoff_s += wait
        return wait


class _LiveSessions:
    """The open loop's live sessions and the arrivals queued for one to end (``BACKLOG_CAP`` at most)."""

    def __init__(self, gen: LoadGenerator) -> None:
        self.gen = gen
        self.tasks: set[asyncio.Task[int]] = set()
        self.backlog: deque[int] = deque()  # scheduled times
        self.started = itertools.count()

    def arrive(self, t_scheduled: int) -> None:
        gen = self.gen
        if len(self.tasks) < gen.inflight_cap:
            self._start(t_scheduled)
            return
        gen.overflows += 1
        if len(self.backlog) < BACKLOG_CAP:
            self.backlog.append(t_scheduled)
        else:
            gen.abandoned += 1

    def _start(self, t_scheduled: int) -> None:
        driver = self.gen._slot_driver(f"open-{next(self.started)}")  # noqa: SLF001 - its own generator's
        session = self.gen._new_session(driver, t_scheduled)  # noqa: SLF001
        task = asyncio.get_running_loop().create_task(session)
        self.tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[int]) -> None:
        self.tasks.discard(task)
        if self.backlog and time.monotonic_ns() < self.gen.deadline_ns:
            self._start(self.backlog.popleft())

    async def close(self) -> None:
        """Arrivals still queued are abandoned; a live session stops (its stream in flight keeps streaming)."""
        self.gen.abandoned += len(self.backlog)
        self.backlog.clear()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class _Made(NamedTuple):
    """A request made ahead of its time (``LoadGenerator._make``)."""

    body: dict[str, Any]
    prompt: Prompt
    payload: object | None  # its request, encoded (bytes; an H2Request over HTTP/2); None: encoded as it goes
    plan_rng: random.Random | None  # its client plan's seeded generator (None: seeded as it goes)


class _Arrival(NamedTuple):
    """An open-loop arrival made ahead: its request number, its due time (monotonic ns) and what was made
    (None where no slot was free as it was made: made as it goes, if it goes)."""

    n: int
    t: int
    made: _Made | None


class _Slots:
    """One open-loop run's in-flight slots and its bounded queue of arrivals waiting for one."""

    __slots__ = ("free", "backlog", "closed", "drained")

    def __init__(self, cap: int) -> None:
        self.free = cap
        self.backlog: deque[tuple[int, int]] = deque()  # (request number, scheduled time)
        self.closed = False  # the run's arrival process ended: nothing more is admitted
        self.drained: asyncio.Future[None] | None = None  # set when the backlog empties (max_requests)


def _mark_stopped(record: StreamRecord, fault: str, t: int) -> None:
    """A background stream ended by its fault's revert is a deliberate hang-up, not an error."""
    record.hangup = Hangup(fault, "stopped", t)
    if record.error is not None and record.error.kind == "cancelled":
        record.error = None


def _running_loop_kind() -> str | None:
    """``uvloop`` or ``asyncio``: the event loop this generator's process runs (None outside one)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return "uvloop" if type(loop).__module__.split(".")[0] == "uvloop" else "asyncio"
