"""A closed-loop client's backoff while nothing serves (``load.connect_backoff``).

Real clients do not re-send at once when nothing answers: the OpenAI Python SDK waits 0.5 s, then
twice as long each time, at most 8 s, each wait cut by up to a quarter at random (its jitter). A load
that re-sent at once made 53-65 requests a second of four clients during a 200 s vLLM restart,
13,724 instant failures that buried the phase. Each closed-loop slot keeps one ``ConnectBackoff``:
``wait_s()`` after an outage's answer (``outage``): a connect error (refused, unreachable), and
with the backoff on, a 502, 503 or 504 (a gateway such as nginx with nothing behind it, a server not
taking requests) or a connection accepted and closed with no response (Toxiproxy in front of a
dead upstream); ``reset()`` after any other request. A 500, or any other status, is the server's
own answer, not an outage: a server fault that fails a share of requests keeps its load's shape.
Its jitter comes from a generator seeded per slot, so a run replays. Pure: it only says how long;
the slot sleeps.
"""

from __future__ import annotations

import random

from chaos.model.observations import StreamRecord

__all__ = ["DEFAULT_CONNECT_BACKOFF", "FIXED_PAUSE_S", "JITTER", "OUTAGE_STATUSES", "ConnectBackoff"]

DEFAULT_CONNECT_BACKOFF = (0.5, 8.0, 2.0)  # initial s, max s, multiplier: the OpenAI Python SDK's
FIXED_PAUSE_S = 0.05  # ``connect_backoff: off``: the fixed pause a slot always made (no backoff)
JITTER = 0.25  # each wait is cut by up to this share, at random (the OpenAI SDK's)
# nothing serves behind the answer: bad gateway, unavailable, gateway timeout (the OpenAI SDK retries
# these after its backoff too); 500 and the rest are the server's own answer
OUTAGE_STATUSES = frozenset({502, 503, 504})


class ConnectBackoff:
    """One slot's backoff: ``params`` (initial s, max s, multiplier), or None for the fixed pause."""

    def __init__(self, params: tuple[float, float, float] | None, rng: random.Random) -> None:
        self.initial_s, self.max_s, self.multiplier = params if params is not None else (FIXED_PAUSE_S,) * 2 + (1.0,)
        self.jitter = JITTER if params is not None else 0.0
        self.on = params is not None  # ``off``: only connect errors pause, the fixed pause of before
        self.rng = rng
        self.failures = 0  # outage answers in a row

    def outage(self, record: StreamRecord | None) -> bool:
        """Whether ``record`` says nothing serves, so the slot waits before its next request."""
        error = None if record is None else record.error
        if record is None or error is None:
            return False
        if error.kind == "connect":
            return True
        if not self.on:
            return False
        status = record.status if record.status is not None else error.status
        return status in OUTAGE_STATUSES or (error.kind == "read" and error.cause == "no_response")

    def wait_s(self) -> float:
        """How long to wait after one more outage answer in a row."""
        base = min(self.max_s, self.initial_s * self.multiplier ** min(self.failures, 64))
        self.failures += 1
        return base * (1.0 - self.jitter * self.rng.random())

    def reset(self) -> None:
        """A request got an answer of the server's own: the next outage starts from the initial wait again."""
        self.failures = 0
