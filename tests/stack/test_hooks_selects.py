"""``Hooks.selects``: the once-a-request answer the ASGI middleware asks instead of checking every
chunk (pure: a fake clock)."""

from __future__ import annotations

from chaos.stack.hooks import Hooks, parse_spec


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_selects_says_whether_a_fault_chose_the_request_and_after_how_many_events() -> None:
    clock = _Clock()
    hooks = Hooks(None, clock=clock)

    def later() -> Hooks:
        clock.t += 0.01
        return hooks

    later().install("none", parse_spec({"type": "timeout", "where": "mid_stream", "fraction": 0.0}))
    later().begin("a")
    later().install("late", parse_spec({"type": "abort", "every_n": 1, "after_events": 5}))
    assert hooks.selects("a", "mid_stream") is None  # "none" did not choose it; "late" came after it
    later().begin("b")
    later().install("early", parse_spec({"type": "timeout", "where": "mid_stream", "every_n": 1,
                                         "after_events": 2}))
    later().begin("c")
    assert hooks.selects("b", "mid_stream") == 5  # "late" chose it; "early" came after it
    assert hooks.selects("c", "mid_stream") == 2  # both chose it: the fewest events
    assert hooks.selects("c", "first_byte") is None  # no fault at that point
    assert hooks.due("c", "mid_stream", 1) is None and hooks.due("c", "mid_stream", 2) is not None
    assert hooks.selects("c", "mid_stream") == 5  # the fired fault is spent; the other still waits


def test_selects_decides_as_the_first_due_would() -> None:
    """Asked first, it matches the same k-th requests as ``due`` checked every chunk would."""
    by_selects, by_due = Hooks(None, clock=_Clock()), Hooks(None, clock=_Clock())
    for hooks in (by_selects, by_due):
        hooks.install("f", parse_spec({"type": "timeout", "where": "mid_stream", "fraction": 0.3, "seed": 4}))
    chosen_selects, chosen_due = [], []
    for n in range(40):
        rid = f"r{n}"
        by_selects.begin(rid)
        by_due.begin(rid)
        chosen_selects.append(by_selects.selects(rid, "mid_stream") is not None)
        chosen_due.append(by_due.due(rid, "mid_stream", 1) is not None)
    assert chosen_selects == chosen_due and 0 < sum(chosen_due) < 40
