"""scripts/soak.py's judgement of one run: which verdicts were not as meant, false or undecided."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from soak import judged, markdown  # noqa: E402


def test_a_run_is_split_into_false_verdicts_and_inconclusive_ones() -> None:
    report = {"verdicts": [
        {"sla": "ttft", "phase": "baseline", "status": "pass", "ok": True},
        # meant to fail
        {"sla": "recovery", "name": "under_pressure", "phase": "pressure", "status": "pass", "ok": False},
        {"sla": "itl", "phase": None, "status": "fail", "ok": False},
        {"sla": "ttft", "phase": "recovery", "status": "inconclusive", "ok": None,
         "evidence": {"reason": "35 samples cannot bound the p50"}},
    ]}
    out = judged(report)
    assert out["false"] == ["under_pressure[pressure]", "itl[run]"]
    assert out["inconclusive"] == ["ttft[recovery]: 35 samples cannot bound the p50"]
    table = markdown([{"experiment": "smoke", "runs": 2, "as_meant": 1, "false": {"itl[run]": 1}, "inconclusive": {},
                       "errors": [], "load_average": [2.1, 3.4]}], 2)
    assert "| smoke | 2 | 1 | {'itl[run]': 1} | 0 | 0 | 2.1-3.4 |" in table
