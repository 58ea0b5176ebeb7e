"""An SLA entry's ``turns:``: which turns of the conversations its verdict judges.

``turns: "2+"`` judges turn 2 and every later one (the turns that resend a history: what a prefix cache
and a KV-pressure fault change most), ``turns: 1`` or ``[1]`` only first turns, ``[2, 3]`` those two,
``"2-4"`` a range. A request outside any conversation (single, shared_prefix, a Mooncake trace) is its
own first turn. Pure: parsing, and the view of a run's observations a verdict then judges.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from chaos.model.observations import Observations

__all__ = ["Turns", "parse_turns", "turn_view"]

_FROM = re.compile(r"\s*(\d+)\s*\+\s*")
_RANGE = re.compile(r"\s*(\d+)\s*-\s*(\d+)\s*")
_ONE = re.compile(r"\s*(\d+)\s*")


@dataclass(frozen=True)
class Turns:
    """Turns ``listed``, and every turn from ``from_turn`` on (None: no open end)."""

    listed: tuple[int, ...] = ()
    from_turn: int | None = None

    def __contains__(self, turn: object) -> bool:
        if not isinstance(turn, int):
            return False
        return turn in self.listed or (self.from_turn is not None and turn >= self.from_turn)

    def text(self) -> str:
        """As written back: ``2+``, ``1``, ``2, 3``, ``1, 4+``."""
        parts = [str(t) for t in self.listed] + ([f"{self.from_turn}+"] if self.from_turn is not None else [])
        return ", ".join(parts)


def parse_turns(raw: object) -> Turns:
    """``2``, ``"2+"``, ``"2-4"``, ``[1]``, ``[2, 3]`` (a list may hold ``"4+"``) → ``Turns``; ValueError
    with what is allowed otherwise. Turns count from 1."""
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise ValueError("expected a turn, a list of turns or N+ (N and later), found an empty list")
    listed: set[int] = set()
    from_turn: int | None = None
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise ValueError(f"expected a turn such as 2, a list such as [1, 2], 2+ or 2-4, found {raw!r}")
        text = str(item)
        if m := _FROM.fullmatch(text):
            start = int(m.group(1))
            from_turn = start if from_turn is None else min(from_turn, start)
            numbers = [start]
        elif m := _RANGE.fullmatch(text):
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo > hi:
                raise ValueError(f"a range of turns runs low-high, found {text!r}")
            numbers = list(range(lo, hi + 1))
            listed.update(numbers)
        elif _ONE.fullmatch(text):
            numbers = [int(text)]
            listed.update(numbers)
        else:
            raise ValueError(f"expected a turn such as 2, a list such as [1, 2], 2+ or 2-4, found {item!r}")
        if min(numbers) < 1:
            raise ValueError(f"turns count from 1 (a session's first turn), found {item!r}")
    if from_turn is not None:
        listed = {t for t in listed if t < from_turn}
    return Turns(tuple(sorted(listed)), from_turn)


def turn_view(obs: Observations, turns: Turns | None) -> Observations:
    """``obs`` whose ``population`` judges only the streams of ``turns`` (``obs.streams`` stays whole: a
    verdict still finds a judged turn's turn before, and the run's busy periods); ``obs`` itself for None."""
    if turns is None:
        return obs
    return replace(obs, turns=turns)
