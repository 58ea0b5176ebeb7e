"""Two capacity searches side by side (``report --compare`` of two capacity run directories): per
case, each interval, and whether B's capacity is decisively lower or higher than A's. Pure.

Decisive means the intervals do not overlap: B's lowest failing level at or below A's highest
passing one (lower), or B's highest passing level at or above A's lowest failing one (higher).
Overlapping intervals say the two searches cannot tell the capacities apart at their resolution."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CapacityChange", "compare_capacity", "compare_lines"]


@dataclass(frozen=True)
class CapacityChange:
    case: str
    a: tuple[float | None, float | None]  # (passing, failing)
    b: tuple[float | None, float | None]
    change: str  # lower | higher | same | only in A | only in B

    @property
    def flagged(self) -> bool:
        return self.change == "lower"


def _change(a: tuple[float | None, float | None], b: tuple[float | None, float | None]) -> str:
    (a_pass, a_fail), (b_pass, b_fail) = a, b
    if b_fail is not None and (a_pass is not None and b_fail <= a_pass):
        return "lower"
    if b_pass is not None and a_fail is not None and b_pass >= a_fail:
        return "higher"
    return "same"


def compare_capacity(a: dict[str, Any], b: dict[str, Any]) -> list[CapacityChange]:
    """Per case in either search, in A's order then B's new ones."""
    def intervals(body: dict[str, Any]) -> dict[str, tuple[float | None, float | None]]:
        return {c["case"]: (c["capacity"]["passing"], c["capacity"]["failing"]) for c in body.get("cases", [])}

    ia, ib = intervals(a), intervals(b)
    rows = []
    for case in [*ia, *(c for c in ib if c not in ia)]:
        if case not in ib or case not in ia:
            change = "only in A" if case in ia else "only in B"
            rows.append(CapacityChange(case, ia.get(case, (None, None)), ib.get(case, (None, None)), change))
        else:
            rows.append(CapacityChange(case, ia[case], ib[case], _change(ia[case], ib[case])))
    return rows


def compare_lines(rows: list[CapacityChange], unit: str, label_a: str, label_b: str) -> list[str]:
    def show(interval: tuple[float | None, float | None]) -> str:
        lo, hi = interval
        return f"[{'-' if lo is None else f'{lo:g}'}, {'-' if hi is None else f'{hi:g}'})"

    lines = [f"capacity ({unit}): {label_a} vs {label_b}"]
    for r in rows:
        mark = "  FLAGGED" if r.flagged else ""
        lines.append(f"  {r.case}: {show(r.a)} -> {show(r.b)}: {r.change}{mark}")
    return lines
