"""Halt conditions as pure functions, and the watcher that feeds them and halts a run once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from chaos.execution.halt import (
    DEAD_FIRST,
    Ended,
    HaltWatcher,
    check,
    dead_target,
    error_share,
    target_down,
    top_errors,
    ttft_quantile,
)
from chaos.model.context import HaltSpec, SafetySpec
from chaos.model.observations import NS, ErrorInfo, FaultEvent, Hangup, Note, StreamRecord

pytestmark = pytest.mark.timeout(30)


def _e(t: float, failed: bool = False, answered: bool = True, ttft: float | None = 0.05,
       msg: str | None = None) -> Ended:
    return Ended(int(t * NS), failed, answered, None if ttft is None else int(ttft * NS),
                 msg or ("boom" if failed else None))


def _clocked_watcher(halts: list[str]) -> tuple[HaltWatcher, Callable[[int, float, bool], None], list[int]]:
    """A watcher with default safety on a clock of its own (``clock[0]``, ns), and ``stream(i, t_s,
    failed)``: a stream that ended at ``t_s`` seconds (refused when ``failed``, else answered 200), the clock
    moved there first."""
    clock = [0]
    watcher = HaltWatcher(SafetySpec(), halts.append, lambda n: None, clock=lambda: clock[0])

    def stream(i: int, t_s: float, failed: bool) -> None:
        clock[0] = int(t_s * NS)
        watcher.on_event(StreamRecord(id=str(i), phase="p", t_end=clock[0], status=None if failed else 200,
                                      error=ErrorInfo("connect", "refused") if failed else None))

    return watcher, stream, clock


def test_dead_from_the_start_all_of_the_first_20_failed() -> None:
    streams = [_e(0.01 * i, failed=True) for i in range(DEAD_FIRST)]
    assert "all of the first 20" in (dead_target(streams, int(1 * NS)) or "")
    assert dead_target(streams[:-1], int(1 * NS)) is None  # 19 decide nothing
    mixed = [*streams[:-1], _e(0.5)]
    assert dead_target(mixed, int(0.6 * NS)) is not None  # ... but 19 of 20 in 2s is >= 95%


def test_dead_later_95_percent_over_2_seconds() -> None:
    healthy = [_e(i * 0.05) for i in range(60)]  # 3 s of successes
    dying = [_e(3 + i * 0.01, failed=True) for i in range(250)]  # then 2.5 s of refusals
    assert dead_target(healthy, int(3 * NS)) is None
    assert dead_target(healthy + dying[:30], int(3.3 * NS)) is None  # the successes still in the window
    assert "failed (>= 95%)" in (dead_target(healthy + dying, int(5.2 * NS)) or "")


def test_dead_when_clients_backing_off_get_no_answer_for_10_seconds() -> None:
    """Closed-loop clients that back off on refused connections end a few streams a window, never 20
    in 2 s: ten quiet seconds of unanswered streams are a dead target too, not an outage to sit out."""
    healthy = [_e(i * 0.1, answered=True) for i in range(20)]  # 2 s answered
    backing_off = [_e(2 + t, failed=True, answered=False) for t in (0.5, 1.5, 3.5, 7.5, 12.5)]
    assert dead_target(healthy + backing_off[:3], int(6 * NS)) is None  # answered streams still in the window
    assert "got an answer" in (dead_target(healthy + backing_off, int(14.6 * NS)) or "")
    assert dead_target(healthy + backing_off[:2], int(14.6 * NS)) is None  # fewer than 3 ended: nothing decided
    # a planned outage ended at 9.6 s: its refusals before then do not count
    assert dead_target(healthy + backing_off, int(14.6 * NS), since=int(9.6 * NS)) is None
    young = [_e(0.5 + t, failed=True, answered=False) for t in (0.0, 1.0, 3.0)]
    assert dead_target(young, int(5 * NS)) is None  # streams for less than 10 s: too early to tell


def test_error_share_ttft_and_target_down() -> None:
    spec = HaltSpec("error_share", window=5.0, above=0.5, min_streams=10, name="errors")
    streams = [_e(i * 0.1, failed=i % 3 != 0) for i in range(40)]  # 26 of 40 failed
    assert "errors: 65%" in (error_share(streams, int(4 * NS), spec) or "")
    assert error_share(streams[:5], int(4 * NS), spec) is None
    slow = HaltSpec("ttft", window=5.0, above=1.0, quantile=0.9, min_streams=10, name="slow")
    assert ttft_quantile([_e(i * 0.1, ttft=2.0) for i in range(20)], int(2 * NS), slow) is not None
    assert ttft_quantile([_e(i * 0.1, ttft=0.2) for i in range(20)], int(2 * NS), slow) is None
    down = HaltSpec("target_down", window=3.0, min_streams=3, name="down")
    unanswered = [_e(0.5)] + [_e(1 + i * 0.5, failed=True, answered=False) for i in range(8)]
    assert "did not answer any" in (target_down(unanswered, int(4.9 * NS), down) or "")
    assert target_down(unanswered, int(3.2 * NS), down) is None  # the answered stream is still in the window


def test_check_respects_the_switch_and_the_order() -> None:
    streams = [_e(0.01 * i, failed=True) for i in range(DEAD_FIRST)]
    assert check(streams, NS, SafetySpec()) is not None
    assert check(streams, NS, SafetySpec(halt_on_dead_target=False)) is None


def test_top_errors_counts_and_orders() -> None:
    assert top_errors(["a", "b", "a", None, "a", "b", "c"], n=2) == [{"message": "a", "count": 3},
                                                                     {"message": "b", "count": 2}]


def test_the_watcher_halts_once_with_the_reason_and_ignores_hangups() -> None:
    halts: list[str] = []
    notes: list[Note] = []
    clock = [0]
    watcher = HaltWatcher(SafetySpec(), halts.append, notes.append, clock=lambda: clock[0])
    hung = StreamRecord(id="h", phase="p", t_end=1, hangup=Hangup("client.disconnect", "after_tokens", 1))
    for _ in range(30):
        watcher.on_event(hung)  # hang-ups on purpose are not failures
    assert not halts
    for i in range(25):
        clock[0] = i * 1000
        watcher.on_event(StreamRecord(id=str(i), phase="p", t_end=clock[0], error=ErrorInfo("connect", "refused")))
    assert len(halts) == 1 and "all of the first 20" in halts[0] and "20x connect: refused" in halts[0]
    assert notes[0].topic == "halt" and notes[0].data["top_errors"] == [{"message": "connect: refused", "count": 20}]


def test_an_experiment_without_conditions_never_halts() -> None:
    halts: list[Any] = []
    watcher = HaltWatcher(SafetySpec(halt_on_dead_target=False), halts.append, lambda n: None, clock=lambda: 0)
    for i in range(50):
        watcher.on_event(StreamRecord(id=str(i), phase="p", t_end=i, error=ErrorInfo("connect", "refused")))
    assert not halts and not watcher.active


def test_a_kill_with_restart_is_a_planned_outage_until_one_window_after_its_revert() -> None:
    """vLLM takes tens of seconds to come back: the dead-target default must not halt the run the
    experiment asked for, and must halt again once the restart is over and the target stays dead."""
    halts: list[str] = []
    watcher, stream, clock = _clocked_watcher(halts)

    for i in range(30):
        stream(i, i * 0.05, failed=False)  # a healthy start
    watcher.on_event(FaultEvent("kill", "process.kill", "plan", clock[0], undo={"pid": 1, "restart": True}))
    for i in range(300):
        stream(100 + i, 2 + i * 0.1, failed=True)  # 30 s of refusals while vLLM restarts
    assert not halts
    watcher.on_event(FaultEvent("kill", "process.kill", "revert", clock[0]))
    stream(500, 32.5, failed=True)  # within one window of the revert: still the restart's outage
    assert not halts
    for i in range(40):
        stream(600 + i, 35 + i * 0.05, failed=True)  # the restarted target is dead too: now it halts
    assert len(halts) == 1 and "looks dead" in halts[0]
    # without restart the same refusals halt at once
    plain = HaltWatcher(SafetySpec(), halts.append, lambda n: None, clock=lambda: clock[0])
    plain.on_event(FaultEvent("kill", "process.kill", "plan", 0, undo={"pid": 1, "restart": False}))
    for i in range(30):
        clock[0] = int(i * 0.05 * NS)
        plain.on_event(StreamRecord(id=str(i), phase="p", t_end=clock[0], error=ErrorInfo("connect", "refused")))
    assert len(halts) == 2


def test_target_down_sees_streams_in_flight_that_get_no_byte() -> None:
    """A frozen target (SIGSTOP) accepts connections and ends no stream: the in-flight stamps decide."""
    down = HaltSpec("target_down", window=5.0, min_streams=10, name="down")
    answered = [Ended(int(1 * NS), False, True, 100, None)]
    silent = [int(2 * NS), int(2.5 * NS)]
    assert "none of the 2 streams in flight got a byte" in (target_down(answered, int(7.6 * NS), down, silent) or "")
    assert target_down(answered, int(7.0 * NS), down, silent) is None  # one got a byte 4.5 s ago
    assert target_down(answered, int(9 * NS), down, [int(2 * NS), int(8 * NS)]) is None  # one is still streaming
    # one just answered
    assert target_down([Ended(int(8 * NS), False, True, 1, None)], int(9 * NS), down, silent) is None
    assert target_down(answered, int(9 * NS), down, ()) is None  # nothing in flight, too few ended
    safety = SafetySpec(halt_on=(down,), halt_on_dead_target=False)
    assert "got a byte" in (check(answered, int(9 * NS), safety, silent) or "")


def test_the_count_of_kept_failures_follows_the_window_and_a_late_death_still_halts() -> None:
    """A tick with only the dead-target rule and no failed stream kept skips the pass over the
    window; the count that decides it must go down as failures age out and up as they come."""
    halts: list[str] = []
    watcher, stream, _ = _clocked_watcher(halts)

    for i in range(30):
        stream(i, i * 0.05, failed=i in (25, 26))  # two failures after the first twenty
    assert watcher._failed_kept == 2
    for i in range(30):
        stream(100 + i, 10 + i * 0.05, failed=False)  # long after: the two have left the window
    assert watcher._failed_kept == 0 and not halts
    for i in range(40):
        stream(200 + i, 20 + i * 0.05, failed=True)  # then the target dies
    assert len(halts) == 1 and "looks dead" in halts[0]


def _tick(watcher: HaltWatcher, clock: list[int], t_s: float) -> None:
    """The watcher's timer firing at ``t_s`` (no loop here: called by hand)."""
    clock[0] = int(t_s * NS)
    watcher._tick()


def test_the_watcher_keeps_ten_seconds_for_the_no_answer_rule() -> None:
    """The rule reads 10 s; the watcher forgot answered streams after 3 s, so three refusals in a row
    after 80 answered streams halted a healthy run at 23.2 s ("none of the 3 streams ... in the last 10s")."""
    halts: list[str] = []
    watcher, stream, clock = _clocked_watcher(halts)
    for i in range(80):
        stream(i, 19.9 - (79 - i) * 0.25, failed=False)  # answered until 19.9 s
    for i, t in enumerate((20.5, 21.5, 23.2)):
        stream(100 + i, t, failed=True)
    _tick(watcher, clock, 25.0)
    assert not halts  # the answer at 19.9 s is 5.1 s old: inside the 10 s
    stream(200, 27.0, failed=True)
    _tick(watcher, clock, 29.8)
    assert not halts
    _tick(watcher, clock, 30.0)  # now nothing answered for 10 s, and 4 streams ended unanswered in them
    assert len(halts) == 1 and "none of the 4 streams that ended in the last 10s got an answer" in halts[0]
    assert "(top errors: 4x connect: refused)" in halts[0]  # those older than the short windows too


def test_after_a_restart_the_no_answer_rule_counts_only_what_ended_after_it() -> None:
    """The outage's refusals stay in the 10 s window for 10 s after the revert, longer than the 2 s
    hold-off (clients asleep up to 8 s in their backoff end streams seconds later): vllm-engine-kill
    halted just after its restart succeeded."""
    halts: list[str] = []
    watcher, stream, clock = _clocked_watcher(halts)
    for i in range(30):
        stream(i, i * 0.05, failed=False)  # a healthy start
    watcher.on_event(FaultEvent("kill", "process.kill", "plan", clock[0], undo={"pid": 1, "restart": True}))
    for i, t in enumerate((2.5, 3.5, 5.5, 9.5, 17.5, 23.0, 25.0, 27.0, 29.0)):
        stream(100 + i, t, failed=True)  # the clients backing off while vLLM restarts
    clock[0] = int(30 * NS)
    watcher.on_event(FaultEvent("kill", "process.kill", "revert", clock[0]))
    _tick(watcher, clock, 32.5)  # past the 2 s hold-off; 4 refusals of the outage in the last 10 s
    stream(200, 33.0, failed=True)  # a stream the kill cut ends late
    _tick(watcher, clock, 33.5)
    assert not halts
    for i in range(20):
        stream(300 + i, 34 + i * 0.1, failed=False)  # the clients wake to the restarted target
    assert not halts
    for i, t in enumerate((40.0, 41.5, 44.0)):
        stream(400 + i, t, failed=True)  # then it dies for good: the rule still decides after the restart
    _tick(watcher, clock, 45.0)
    assert not halts  # answered 4 s ago
    _tick(watcher, clock, 36.0 + 10.0)  # the last answer at 35.9 s
    assert len(halts) == 1 and "none of the 3 streams that ended in the last 10s" in halts[0]
