"""The report's size does not follow a stream's event count (issue 41, point 4): a target that streamed
750,000 tiny events into one request made a 55 MB report.html, one tick per event in the waterfall.
A row now draws at most ``TICKS_PER_ROW`` ticks, evenly by count."""

from __future__ import annotations

import pytest

from chaos.model.observations import NS, Observations, StreamRecord
from chaos.output.reports.waterfall import TICKS_PER_ROW, render_waterfall


def _obs(events: int, streams: int = 4) -> Observations:
    obs = Observations(t0=0)
    for i in range(streams):
        stamps = [NS + k * 10_000 for k in range(events)]  # 10 us apart: a firehose
        obs.streams.append(StreamRecord(id=f"s{i}", phase="p", t_sent=NS // 2, t_content=stamps, t_end=stamps[-1] + 1,
                                        finish_reason="stop", done_seen=True))
    return obs


@pytest.mark.timeout(60)
def test_a_firehose_stream_does_not_grow_the_waterfall() -> None:
    report = {"phases": [{"name": "p", "start_s": 0.0, "end_s": 2.0}], "faults": []}
    small = render_waterfall(report, _obs(TICKS_PER_ROW))
    big = render_waterfall(report, _obs(100_000))
    assert len(big) < 1.2 * len(small) + 20_000, (len(small), len(big))  # today: about 200 times the size
    assert f"at most {TICKS_PER_ROW} a row" in big
