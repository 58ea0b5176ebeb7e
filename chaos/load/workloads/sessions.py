"""``sessions``: multi-turn conversations whose every turn resends the whole history.

A session is a coroutine (``run_session``): turn 1 sends the system message (if any) and a user message;
each later turn sends everything before it, each assistant message holding the text the client really
received, plus a new user message. The history depends on the replies, so a session runs turn after turn;
what does not depend on them is pure of (seed, worker, session, turn): how many turns, each user message,
each ``max_tokens``, each think time (``SyntheticSessions``). ShareGPT conversations replay the same way,
their human turns sent with the history and ``max_tokens`` their answer's length in tokens, capped
(``ShareGptSessions``).

A turn that failed or was cut (an error, a hang-up, no end of stream) is ``on_cut``'s: ``resume`` resends it
(the history without the lost reply, the same user message again; at most ``MAX_RESENDS`` times, then the
session ends), ``end`` ends the session (the slot starts a new one). A turn the server refused as a client
mistake (a 4xx other than 429: too long, a bad body) ends its session at once: resending it cannot help.

The think time is the user's pause between a reply's end and the next turn; the next turn's
``t_scheduled`` is when it ended, so ``t_sent - t_scheduled`` is the client's own lateness (coordinated
omission made visible, as for open-loop arrivals).

Completions requests carry the history as one text: ``System: ...``, ``User: ...``, ``Assistant: ...``
lines, ending ``Assistant:``. A session's ``prompt_tokens`` is the client's count of its messages' text in
the target's tokenizer (the template's own tokens come on top), where that tokenizer is known.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from chaos.load.text import synthetic_text
from chaos.load.workloads import WorkloadSettings
from chaos.load.workloads.tokens import CHARS_PER_TOKEN, TokenCounter
from chaos.model.observations import StreamRecord

__all__ = [
    "MAX_RESENDS",
    "History",
    "SessionDriver",
    "SessionScript",
    "ShareGptSessions",
    "SyntheticSessions",
    "answered",
    "refused",
    "run_session",
]

MAX_RESENDS = 2  # a cut turn is resent at most this many times (on_cut: resume), then its session ends
_TEMPLATE_TOKENS = 8  # a chat template's tokens per message (role tags, separators), beside its text: fit checks


def answered(record: StreamRecord) -> bool:
    """The turn got its whole reply: a 2xx stream that ended properly (a finish reason or ``[DONE]``) with
    no error, no hang-up and no in-band error."""
    return (record.error is None and record.hangup is None and record.in_band_error is None
            and record.status is not None and 200 <= record.status < 300
            and (record.finish_reason is not None or record.done_seen))


def refused(record: StreamRecord) -> bool:
    """The server refused the turn as the client's mistake (a 4xx other than 429): resending it cannot help."""
    return record.status is not None and 400 <= record.status < 500 and record.status != 429


@dataclass
class History:
    """A session's messages so far, each with its length in tokens (None: not counted)."""

    endpoint: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    tokens: list[int | None] = field(default_factory=list)

    def add(self, role: str, text: str, tokens: int | None) -> None:
        self.messages.append({"role": role, "content": text})
        self.tokens.append(tokens)

    def with_user(self, text: str) -> list[dict[str, Any]]:
        """The messages a turn sends: the history and the new user message."""
        return [*self.messages, {"role": "user", "content": text}]  # shared, never mutated: no copy per turn

    def count(self, user_tokens: int | None) -> int | None:
        """The client's count of a turn's prompt: its messages' tokens (None when any is not counted)."""
        counts = [*self.tokens, user_tokens]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)


def transcript(messages: Sequence[dict[str, Any]]) -> str:
    """Messages as one completions prompt: ``Role: text`` lines, ending with ``Assistant:``."""
    lines = [f"{str(m['role']).capitalize()}: {m['content']}" for m in messages]
    return "\n".join([*lines, "Assistant:"])


class SessionScript(Protocol):
    """What a session's coroutine reads of its script: pure of (seed, worker, session, turn)."""

    @property
    def id(self) -> str: ...
    @property
    def turns(self) -> int: ...
    @property
    def system(self) -> str | None: ...

    def user(self, turn: int) -> str: ...
    def max_tokens(self, turn: int) -> int: ...
    def think_s(self, turn: int, attempt: int) -> float: ...


@dataclass(frozen=True)
class _Synthetic:
    """A synthetic session's script (``SyntheticSessions.session``)."""

    id: str
    turns: int
    system: str | None
    seed: str  # "<seed>:<worker>:<session>": every draw of this session starts from it
    chars: tuple[int, int]
    scripts: tuple[str, ...]
    weights: tuple[float, ...]
    max_tokens_range: tuple[int, int]
    think: tuple[float, float]

    def user(self, turn: int) -> str:

        rng = random.Random(f"{self.seed}:{turn}:user")
        chars = rng.randint(*self.chars)
        script = rng.choices(self.scripts, weights=self.weights)[0]
        return synthetic_text(rng, chars, script)

    def max_tokens(self, turn: int) -> int:
        return random.Random(f"{self.seed}:{turn}:max_tokens").randint(*self.max_tokens_range)

    def think_s(self, turn: int, attempt: int) -> float:
        lo, hi = self.think
        return lo if lo == hi else random.Random(f"{self.seed}:{turn}:{attempt}:think").uniform(lo, hi)


class SyntheticSessions:
    """The sessions of one worker: session k's turns, user messages, max_tokens and think times, seeded."""

    def __init__(self, settings: WorkloadSettings, *, seed: int, worker_index: int, chars: tuple[int, int],
                 mix: Sequence[tuple[str, float]], max_tokens: tuple[int, int]) -> None:

        self.settings = settings
        self.seed = seed
        self.worker_index = worker_index
        self.chars = chars
        self.scripts = tuple(s for s, _ in mix) or ("ascii",)
        self.weights = tuple(w for _, w in mix) or (1.0,)
        self.max_tokens_range = max_tokens
        # shared by every session of every worker: the system prompt a deployment sends each conversation
        self.system = (synthetic_text(random.Random(f"{seed}:system"), settings.system_chars, "ascii")
                       if settings.system_chars > 0 else None)

    def session(self, k: int) -> SessionScript:
        key = f"{self.seed}:{self.worker_index}:{k}"
        turns = random.Random(f"{key}:turns").randint(*self.settings.turns)
        return _Synthetic(f"{self.worker_index}-s{k}", turns, self.system, key, self.chars, self.scripts,
                          self.weights, self.max_tokens_range, self.settings.think_time)


@dataclass(frozen=True)
class _Replayed:
    """A ShareGPT conversation's script: its human turns, each answer's length in tokens as max_tokens."""

    id: str
    system: str | None
    users: tuple[str, ...]
    answers: tuple[int, ...]  # max_tokens of each turn

    @property
    def turns(self) -> int:
        return len(self.users)

    def user(self, turn: int) -> str:
        return self.users[turn - 1]

    def max_tokens(self, turn: int) -> int:
        return self.answers[turn - 1]

    def think_s(self, turn: int, attempt: int) -> float:
        return 0.0  # the file has no timing: the next turn goes when the reply ended


class ShareGptSessions:
    """ShareGPT conversations as sessions: session k of worker i of N replays conversation (k * N + i) mod
    count, its user turns sent with the history, max_tokens each answer's length in tokens (counted with
    the target's tokenizer, else a quarter of its characters), capped at ``max_output_tokens``."""

    def __init__(self, settings: WorkloadSettings, *, worker_index: int, workers: int,
                 tokenizer: TokenCounter | None) -> None:
        from chaos.load.workloads.trace import read_sharegpt

        assert settings.path is not None, "a trace workload has a path (the loader checks it)"
        self.conversations = read_sharegpt(Path(settings.path))
        self.settings = settings
        self.worker_index = worker_index
        self.workers = max(1, workers)
        self.tokenizer = tokenizer

    def _tokens(self, text: str) -> int:
        if self.tokenizer is not None:
            return len(self.tokenizer.encode(text))
        return max(1, len(text) // CHARS_PER_TOKEN)

    def session(self, k: int) -> SessionScript:
        if not self.conversations:
            return _Replayed(f"{self.worker_index}-s{k}", None, (), ())
        conv = self.conversations[(k * self.workers + self.worker_index) % len(self.conversations)]
        users: list[str] = []
        answers: list[int] = []
        turns = conv.turns
        for i, (role, text) in enumerate(turns):
            if role != "user":
                continue
            reply = turns[i + 1][1] if i + 1 < len(turns) and turns[i + 1][0] == "assistant" else ""
            users.append(text)
            answers.append(max(1, min(self.settings.max_output_tokens, self._tokens(reply) if reply else
                                      self.settings.max_output_tokens)))
        return _Replayed(f"{self.worker_index}-s{k}", conv.system, tuple(users), tuple(answers))


class SessionDriver(Protocol):
    """What a session's coroutine needs of the load generator (``chaos.load.generator.LoadGenerator``)."""

    @property
    def deadline_ns(self) -> int: ...  # when sending stops (monotonic ns); it may move while the session runs

    def claim(self) -> int | None: ...  # a request number, None once max_requests is reached

    def send_turn(self, request_id: str, body: dict[str, Any], record_of: Callable[[StreamRecord], None],
                  chars: int, t_scheduled: int | None, t_ready: int | None) -> asyncio.Task[StreamRecord]: ...

    # after each turn: seconds to wait when its answer says nothing serves (the slot's ConnectBackoff), else
    # None (and the backoff starts over)
    def outage_wait(self, record: StreamRecord | None) -> float | None: ...


@dataclass
class SessionPlan:
    """What every session of a load shares: the endpoint, the body's fixed fields, the tokenizer."""

    endpoint: str
    model: str
    on_cut: str
    body_fields: dict[str, Any]  # temperature, ignore_eos, stream_options, tools, ...: as Workload builds them
    tokenizer: TokenCounter | None
    workload: str = "sessions"  # the records' workload: sessions, or trace for a ShareGPT replay
    context_tokens: int | None = None  # a turn that cannot fit ends its session before it is sent
    trimmed: int = 0  # sessions ended before a turn that could not fit

    def count(self, text: str) -> int | None:
        return None if self.tokenizer is None else len(self.tokenizer.encode(text))

    def body(self, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "stream": True, "max_tokens": max_tokens}
        if self.endpoint == "chat":
            body["messages"] = messages
        else:
            body["prompt"] = transcript(messages)
        body.update(self.body_fields)
        return body


async def run_session(driver: SessionDriver, plan: SessionPlan, script: SessionScript,
                      t_start: int | None) -> int:
    """Run one session to its last turn, the deadline, ``max_requests``, or its end by ``on_cut``; return how
    many requests it sent. ``t_start``: when an open-loop arrival scheduled it (its first turn's
    ``t_scheduled``); None closed loop."""
    history = History(plan.endpoint)
    if script.system:
        history.add("system", script.system, plan.count(script.system))
    turn, attempt, sent = 1, 0, 0
    t_scheduled = t_start
    while turn <= script.turns and time.monotonic_ns() < driver.deadline_ns:
        record = await _turn(driver, plan, script, history, turn, attempt, t_scheduled)
        if record is None:
            return sent
        sent += 1
        wait = driver.outage_wait(record)
        if answered(record):
            turn, attempt = turn + 1, 0
        else:
            if wait is not None:  # nothing serves: back off as a real client does, before anything else
                await asyncio.sleep(wait)
            if plan.on_cut == "end" or refused(record) or (wait is None and attempt >= MAX_RESENDS):
                return sent
            if wait is not None:  # an outage's resend is bounded by the backoff, not counted
                t_scheduled = None
                continue
            attempt += 1
        end = record.t_end if record.t_end is not None else time.monotonic_ns()
        # the user thinks even past the deadline: the slot waits with them (the run cancels it when sending
        # stops, or the deadline moves on and the turn goes). A session that returned here had its slot start
        # a new one at once, whose first turn has no think time: the last think time of a run filled with
        # first turns (1,000 sessions: 100 a second became 1,900, send delay p99 183 ms)
        t_scheduled = end + int(script.think_s(turn, attempt) * 1e9)
        delay = (t_scheduled - time.monotonic_ns()) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)
    return sent


async def _turn(driver: SessionDriver, plan: SessionPlan, script: SessionScript, history: History, turn: int,
                attempt: int, t_scheduled: int | None) -> StreamRecord | None:
    """Send turn ``turn`` (resend ``attempt``) and wait for its end; an answered turn joins the history.
    None: no turn was sent (it cannot fit the context, max_requests is reached) or its task failed."""
    user = script.user(turn)
    user_tokens = plan.count(user)
    prompt_tokens = history.count(user_tokens)
    max_tokens = script.max_tokens(turn)
    if (plan.context_tokens is not None and prompt_tokens is not None
            and prompt_tokens + max_tokens + _TEMPLATE_TOKENS * (len(history.messages) + 2) > plan.context_tokens):
        plan.trimmed += 1  # the rest of the conversation cannot fit the target's context
        return None
    if driver.claim() is None:
        return None
    messages = history.with_user(user)
    request_id = f"{script.id}-t{turn}" + (f"-r{attempt}" if attempt else "")
    meta = _Meta(script.id, turn, plan.workload, prompt_tokens)
    task = driver.send_turn(request_id, plan.body(messages, max_tokens), meta.stamp,
                            sum(len(str(m["content"])) for m in messages), t_scheduled, t_scheduled)
    await asyncio.wait([task])  # not `await task`: cancelling the session must not cancel its stream
    record = task.result() if not task.cancelled() and task.exception() is None else None
    if record is not None and answered(record):
        history.add("user", user, user_tokens)
        history.add("assistant", record.text, plan.count(record.text))
    return record


@dataclass(frozen=True)
class _Meta:
    session: str
    turn: int
    workload: str
    prompt_tokens: int | None

    def stamp(self, record: StreamRecord) -> None:
        record.session = self.session
        record.turn = self.turn
        record.workload = self.workload
        record.prompt_tokens = self.prompt_tokens
