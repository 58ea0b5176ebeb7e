"""A late client bunches events into its reads: `streaming` must not blame the server for that
(vLLM on a starved CPU box read 2 events per read at the median and 8+ in bursts), but a buffer that
holds responses whole is still a fail, late client or not."""

from __future__ import annotations

import sla
from sla.base import Verdict

SPEC = sla.spec_for("streaming")


def _streaming(first_read_share: float) -> Verdict:
    return Verdict("streaming", None, "fail", 0.46, 0.10, "fraction", 231,
                   {"first_read_share_p50": first_read_share, "events_per_read_p50": 2.1})


def test_bursts_a_late_client_explains_are_not_the_servers() -> None:
    assert SPEC.lateness_explains(_streaming(0.03), lag_s=0.16)


def test_a_whole_response_in_the_first_read_is_still_a_buffer() -> None:
    assert not SPEC.lateness_explains(_streaming(1.0), lag_s=0.16)  # nginx buffering, gzip: one read per stream
