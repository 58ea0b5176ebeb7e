"""Hook-fault specs and request selection (pure: a fake clock, no loop for timeouts)."""

from __future__ import annotations

import asyncio

import pytest

from chaos.stack.hooks import MAX_LIFETIME_S, Hooks, HookSpecInvalid, StallSpec, TimeoutSpec, parse_spec


class _NoEngine:
    def pause(self) -> None: ...
    def resume(self) -> None: ...


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_parse_timeout_and_stall() -> None:
    spec = parse_spec({"type": "timeout", "where": "send", "every_n": 3, "after": 0.5})
    assert spec == TimeoutSpec(where="send", every_n=3, after=0.5)
    stall = parse_spec({"type": "stall", "where": "engine", "duration": 0.2, "every": 1})
    assert stall == StallSpec(where="engine", duration=0.2, every=1.0, ttl=MAX_LIFETIME_S)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ([], "JSON object"),
        ({"type": "boom"}, "'type'"),
        ({"type": "timeout", "where": "nowhere", "fraction": 0.5}, "where"),
        ({"type": "timeout", "where": "send"}, "exactly one"),
        ({"type": "timeout", "where": "send", "fraction": 0.5, "every_n": 2}, "exactly one"),
        ({"type": "timeout", "where": "send", "fraction": 1.5}, "fraction"),
        ({"type": "timeout", "where": "send", "every_n": 0}, "every_n"),
        ({"type": "timeout", "where": "send", "every_n": 1, "colour": "red"}, "unknown key"),
        ({"type": "stall", "where": "event_loop", "duration": 1, "every": 1}, "longer than"),
        ({"type": "stall", "where": "event_loop", "duration": 0.1, "every": 1, "ttl": 10_000}, "ttl"),
    ],
)
def test_parse_rejects(raw: object, needle: str) -> None:
    with pytest.raises(HookSpecInvalid, match=needle):
        parse_spec(raw)


def test_every_n_picks_every_nth_request_and_respects_after() -> None:
    clock = _Clock()
    hooks = Hooks(_NoEngine(), clock=clock)
    hooks.install("f", TimeoutSpec(where="detokenize", every_n=3, after=1.0))
    for i in range(6):
        hooks.begin(f"r{i}")
    fired = []
    for i in range(6):
        hooks.check(f"r{i}", "detokenize")  # too young: nothing fires yet, but the pick is made
        hooks.check(f"r{i}", "send")  # another hook point is never affected
    clock.t += 1.0
    for i in range(6):
        try:
            hooks.check(f"r{i}", "detokenize")
        except TimeoutError as exc:
            fired.append(i)
            assert "fault 'f'" in str(exc)
    assert fired == [2, 5]
    assert hooks.engine_step(["r2"]) == {}  # engine_step is its own hook point


def test_fraction_is_deterministic_per_seed() -> None:
    def picks(seed: int) -> list[str]:
        hooks = Hooks(_NoEngine(), clock=_Clock())
        hooks.install("f", TimeoutSpec(where="engine_step", fraction=0.3, seed=seed))
        ids = [f"r{i}" for i in range(200)]
        for rid in ids:
            hooks.begin(rid)
        return sorted(hooks.engine_step(ids))

    a, b, c = picks(1), picks(1), picks(2)
    assert a == b and a != c
    assert 30 <= len(a) <= 90  # about 30% of 200


def test_expired_fault_no_longer_fires() -> None:
    clock = _Clock()
    hooks = Hooks(_NoEngine(), clock=clock)
    hooks.install("f", TimeoutSpec(where="send", fraction=1.0, ttl=5.0))
    hooks.begin("r")
    with pytest.raises(asyncio.TimeoutError):
        hooks.check("r", "send")
    clock.t += 5.0
    hooks.check("r", "send")  # expired: silent
    assert hooks.describe() == {}


def test_a_renewed_fault_lives_one_ttl_past_its_last_renewal() -> None:
    clock = _Clock()
    hooks = Hooks(_NoEngine(), clock=clock)
    hooks.install("f", TimeoutSpec(where="send", fraction=1.0, ttl=5.0))
    clock.t += 4.0
    assert hooks.renew("f") is not None
    clock.t += 4.0  # 8 s after install, 4 s after the renewal: still in force
    hooks.begin("r")
    with pytest.raises(asyncio.TimeoutError):
        hooks.check("r", "send")
    clock.t += 1.0
    assert hooks.renew("f") is None  # expired before this renewal came: it stays expired
    hooks.check("r", "send")
    assert hooks.describe() == {} and hooks.renew("nope") is None


def test_requests_older_than_the_fault_are_spared() -> None:
    clock = _Clock()
    hooks = Hooks(_NoEngine(), clock=clock)
    hooks.begin("old")
    clock.t += 1.0
    hooks.install("f", TimeoutSpec(where="send", fraction=1.0))
    hooks.begin("new")
    hooks.check("old", "send")
    with pytest.raises(asyncio.TimeoutError):
        hooks.check("new", "send")
