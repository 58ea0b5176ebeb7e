"""Issue 40, point 7: what the clean-up verdicts must see of a client that leaves.

- kv_cleanup's window: a ``safety.cleanup_window`` no longer than ``within`` (plus two scrapes) cannot
  see past the deadline, so a leak was "unobserved": the loader refuses it, the default grows to fit,
  the shipped experiments fit; a series up at its last sample past the deadline fails, one whose scrapes
  stopped before it says so in words.
- kv_cleanup from the last hang-up: blocks freed long after a hang-up, while the load goes on, fail
  even when they are back by the end of load.
- abort_propagation for every way a client leaves: read timeouts and resets as well as hang-ups.
- client.disconnect's after_tokens: 0 cannot promise a hang-up before the first token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import sla
from chaos.experiment import experiment_from_dict, load_experiment, parse_experiment
from chaos.model.errors import ExperimentInvalid
from chaos.model.observations import ErrorInfo, FaultEvent, Hangup

pytestmark = pytest.mark.timeout(30)

SHIPPED = Path(__file__).resolve().parents[2] / "experiments"
USAGE, RUNNING = "vllm:kv_cache_usage_perc", "vllm:num_requests_running"
EVERY = 0.2


def _storm_text(window: str | None, within: str = "2s") -> str:
    safety = f"safety: {{max_duration: 2m, cleanup_window: {window}}}\n" if window else ""
    return (
        "name: w\nphases:\n  - {name: storm, duration: 2s}\n"
        f"sla:\n  - kind: kv_cleanup\n    within: {within}\n" + safety
    )


def test_a_cleanup_window_no_longer_than_within_is_refused_at_its_key() -> None:
    with pytest.raises(ExperimentInvalid) as info:
        parse_experiment(_storm_text("2s"), "storm.yaml")
    text = str(info.value)
    assert "storm.yaml:7" in text and "safety.cleanup_window" in text, text
    assert "kv_cleanup" in text and "two scrape intervals" in text and "2.4s or more" in text, text


def test_the_default_cleanup_window_grows_to_what_kv_cleanup_needs() -> None:
    exp = parse_experiment(_storm_text(None, within="3s"), "storm.yaml")
    assert exp.safety.cleanup_window == pytest.approx(3.4)
    assert parse_experiment(_storm_text("2500ms"), "storm.yaml").safety.cleanup_window == 2.5


@pytest.mark.parametrize("path", sorted(SHIPPED.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_experiment_scrapes_past_its_kv_cleanup_deadline(path: Path) -> None:
    """11 of the 15 shipped experiments with kv_cleanup stopped scraping at or before the deadline."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    entries = [e for e in raw.get("sla") or [] if e.get("kind") == "kv_cleanup"]
    if not entries:
        pytest.skip("no kv_cleanup entry")
    from sla.kv_cleanup import cleanup_window_needed

    exp = load_experiment(path)
    for entry in (e for e in exp.sla if e.kind == "kv_cleanup"):
        need = cleanup_window_needed(entry.spec.within, exp.safety.scrape_interval)  # type: ignore[attr-defined]
        assert exp.safety.cleanup_window >= need - 1e-9, (path.name, exp.safety.cleanup_window, need)
        window = (raw.get("safety") or {}).get("cleanup_window")
        assert window is not None, f"{path.name}: state the cleanup window a kv_cleanup entry needs"


def _end_of_load(synth: Any, after: Any, stop: float) -> tuple[Any, float]:
    """Streams 1 .. ~3.1 s; usage 0 before, 0.4 while busy, ``after(dt)`` from the end of load; running 0 after."""
    streams = [synth.stream(f"s{i}", phase="load", sent=1.0 + i * 0.2) for i in range(10)]
    end = max(st.t_end for st in streams) / 1e9 - synth.T0 / 1e9

    def usage(t: float) -> float:
        return 0.0 if t < 1.0 else 0.4 if t < end else after(t - end)

    def running(t: float) -> float:
        return 0.0 if t < 1.0 or t >= end else 4.0

    metrics = synth.steps(USAGE, 0.0, stop, EVERY, usage) + synth.steps(RUNNING, 0.0, stop, EVERY, running)
    return synth.obs(streams, metrics), end


def test_a_series_still_up_at_its_last_sample_past_the_deadline_fails_even_after_a_dip(synth: Any) -> None:
    """Back to baseline for one scrape, then up again with nothing running, up to the last sample: a leak."""
    obs, end = _end_of_load(synth, lambda dt: 0.0 if 0.3 < dt < 0.5 else 1.23, stop=6.5)
    verdict = sla.judge(obs, "kv_cleanup", {"within": "2s"})
    assert verdict.status == "fail", verdict.evidence
    point = verdict.evidence["check_points"][0]
    assert point["outcome"] == "leaked" and point[USAGE]["last_sample"]["value"] == pytest.approx(1.23)
    assert verdict.figure is not None and verdict.figure > 2.0


def test_scrapes_that_stop_before_the_deadline_say_so_and_a_shorter_within_fails(synth: Any) -> None:
    """The reported case: KV usage 1.23 with nothing running, scraped for 1.9 s after the last stream."""
    obs, end = _end_of_load(synth, lambda dt: 1.23, stop=0.0)
    obs, end = _end_of_load(synth, lambda dt: 1.23, stop=end + 1.9)
    undecided = sla.judge(obs, "kv_cleanup", {"within": "2s"})
    assert undecided.status == "inconclusive"
    reason = undecided.evidence["reason"]
    assert "still above baseline (1.23 against 0)" in reason and "before the deadline of 2s" in reason, reason
    assert "cleanup_window must exceed within" in reason, reason
    assert sla.judge(obs, "kv_cleanup", {"within": "1s"}).status == "fail"  # the leak is in the data


def _storm_with_late_frees(synth: Any, free_after: float) -> Any:
    """8 clients back to back from 1 s to 14 s (streams of 0.5 s), hung up by a storm from 4 s to 7 s; each
    hang-up's blocks (0.05 of the cache) held ``free_after`` seconds. Load level 0.4, running 8."""
    streams, hangups = [], []
    for c in range(8):
        t, k = 1.0 + c * 0.06, 0
        while t + 0.5 <= 14.0:
            hang = 0.1 if 4.0 <= t < 7.0 and k % 2 == 0 else None
            st = synth.stream(f"c{c}-{k}", phase="load", sent=t, ttft=0.02, itl=0.048, tokens=10, hangup_after=hang)
            streams.append(st)
            if st.hangup is not None:
                hangups.append(st.hangup.t / 1e9 - synth.T0 / 1e9)
            t = (st.t_end / 1e9 - synth.T0 / 1e9) + 0.01
            k += 1

    def usage(t: float) -> float:
        held = sum(1 for h in hangups if h <= t < h + free_after)
        load = 0.4 if 1.0 <= t <= 14.0 else 0.0
        return load + 0.05 * held

    def running(t: float) -> float:
        return 8.0 if 1.0 <= t <= 14.0 else 0.0

    metrics = synth.steps(USAGE, 0.0, 18.0, EVERY, usage) + synth.steps(RUNNING, 0.0, 18.0, EVERY, running)
    return synth.obs(streams, metrics)


def test_blocks_freed_long_after_each_hang_up_fail_though_back_by_the_end_of_load(synth: Any) -> None:
    obs = _storm_with_late_frees(synth, free_after=5.0)
    verdict = sla.judge(obs, "kv_cleanup", {"within": "2s"})
    assert verdict.status == "fail", verdict.evidence
    points = {p["kind"]: p for p in verdict.evidence["check_points"]}
    assert points["end_of_load"]["outcome"] == "returned"  # the end of load alone saw nothing wrong
    after = points["after_hangups"]
    assert after["outcome"] == "late" and after["figure_s"] > 4.0, after
    assert after[USAGE]["load_level"] == pytest.approx(0.4)


def test_blocks_freed_at_once_pass_the_after_hang_ups_check(synth: Any) -> None:
    verdict = sla.judge(_storm_with_late_frees(synth, free_after=0.1), "kv_cleanup", {"within": "2s"})
    assert verdict.status == "pass", verdict.evidence
    assert {p["kind"]: p["outcome"] for p in verdict.evidence["check_points"]}["after_hangups"] == "returned"


def _orphans(synth: Any, fault: str, leave: Any) -> Any:
    """8 clients back to back (1 s streams) from 1 s to 11 s; in force 3-9 s, half the streams are left by
    ``leave(stream)``; the server runs each left stream on for 1 s (an orphan)."""
    streams = []
    for c in range(8):
        t, k = 1.0 + c * 0.1, 0
        while t + 1.0 <= 11.0:
            st = synth.stream(f"c{c}-{k}", phase="storm", sent=t, ttft=0.05, itl=0.05, tokens=20)
            if 3.0 <= t < 9.0 and k % 2 == 0:
                st = leave(st)
            streams.append(st)
            t = st.t_end / 1e9 - synth.T0 / 1e9 + 0.01
            k += 1

    def running(t: float) -> float:
        at = synth.ns(t)
        open_ = sum(1 for st in streams if st.t_sent <= at < st.t_end)
        orphans = sum(1 for st in streams if st.t_end <= at < st.t_end + synth.S and st.finish_reason is None)
        return open_ + orphans

    obs = synth.obs(streams, synth.steps(RUNNING, 0.0, 12.0, EVERY, running),
                    phases=[synth.phase("storm", 0.0, 12.0)])
    obs.faults = [FaultEvent(fault, fault, "inject", synth.ns(3.0), "storm"),
                  FaultEvent(fault, fault, "revert", synth.ns(9.0), "storm")]
    return obs


def _timed_out(st: Any) -> Any:
    cut = st.t_sent + 300_000_000
    st.t_content = [x for x in st.t_content if x <= cut]
    st.hangup, st.t_end, st.finish_reason, st.done_seen = Hangup("impatient", "read_timeout", cut), cut, None, False
    return st


def _reset(st: Any) -> Any:
    cut = st.t_sent + 150_000_000
    st.t_content = [x for x in st.t_content if x <= cut]
    st.error = ErrorInfo("read", "ConnectionResetError: [Errno 104] Connection reset", cause="reset")
    st.t_end, st.finish_reason, st.done_seen = cut, None, False
    return st


@pytest.mark.parametrize(("fault", "leave", "how"), [("client.timeout", _timed_out, "read timeout"),
                                                     ("network.reset", _reset, "connection reset")])
def test_orphans_after_read_timeouts_and_resets_fail_abort_propagation(synth: Any, fault: str, leave: Any,
                                                                       how: str) -> None:
    verdict = sla.judge(_orphans(synth, fault, leave), "abort_propagation", {}, phase="storm")
    assert verdict.status == "fail", verdict.evidence
    assert verdict.evidence["clients_left"].get(how, 0) > 10
    assert verdict.evidence["faults"] == [fault]


def test_a_storm_without_orphans_passes_for_resets(synth: Any) -> None:
    obs = _orphans(synth, "network.reset", _reset)
    obs.metrics = [m for m in obs.metrics if m.name != RUNNING]

    def running(t: float) -> float:
        at = synth.ns(t)
        return sum(1 for st in obs.streams if st.t_sent <= at < st.t_end)

    obs.metrics = synth.steps(RUNNING, 0.0, 12.0, EVERY, running)
    assert sla.judge(obs, "abort_propagation", {}, phase="storm").status == "pass"


def test_after_tokens_zero_cannot_promise_a_hang_up_before_the_first_token() -> None:
    body = {"name": "z", "phases": [{"name": "p", "duration": "1s", "faults": [
        {"kind": "client.disconnect", "after_tokens": [0, 4]}]}]}
    with pytest.raises(ExperimentInvalid, match="while_queued: true"):
        experiment_from_dict(body)


def test_the_shipped_storm_hangs_up_before_the_first_token_and_judges_the_streams_that_stay() -> None:
    exp = load_experiment(SHIPPED / "disconnect-storm.yaml")
    storm = next(p for p in exp.phases if p.name == "storm")
    assert any(getattr(f, "while_queued", False) for f in storm.faults)
    judged = {(e.kind, e.phases) for e in exp.sla}
    assert ("ttft", ("storm",)) in judged and ("itl", ("storm",)) in judged


@pytest.mark.parametrize(("name", "phase"), [("client-timeouts", "impatient"), ("connection-resets", "resets")])
def test_shipped_timeouts_and_resets_judge_orphans(name: str, phase: str) -> None:
    exp = load_experiment(SHIPPED / f"{name}.yaml")
    assert any(e.kind == "abort_propagation" and e.phases == (phase,) for e in exp.sla)


def _stale(st: Any) -> Any:
    """The server closed a kept connection after its last response; the next request found it closed."""
    cut = st.t_sent + 150_000_000
    st.t_content = []
    st.error = ErrorInfo("read", "the server closed the kept connection after HTTP 200 (request c0-1): "
                         "ConnectionResetError: [Errno 104] Connection reset by peer", cause="stale_connection")
    st.t_end, st.finish_reason, st.done_seen = cut, None, False
    return st


def _request_timeout(st: Any) -> Any:
    """The request timeout ran out mid-stream: worded otherwise than the client does, the cause decides."""
    cut = st.t_sent + 300_000_000
    st.t_content = [x for x in st.t_content if x <= cut]
    st.error = ErrorInfo("timeout", "gave up waiting", cause="request_timeout")
    st.t_end, st.finish_reason, st.done_seen = cut, None, False
    return st


def test_a_stale_connection_is_no_client_leaving_and_opens_no_window(synth: Any) -> None:
    """Its message names ConnectionResetError, which read as a client leaving: the server closed the
    connection, and a fault in force then was taken for one that makes clients leave."""
    from sla.abort_propagation import _departures, _windows

    obs = _orphans(synth, "network.reset", _stale)
    assert _departures(obs, "storm") == [] and _windows(obs, "storm", []) == []
    verdict = sla.judge(obs, "abort_propagation", {}, phase="storm")
    assert verdict.status != "fail" and not verdict.evidence.get("clients_left"), verdict.evidence


def test_a_request_timeout_is_known_by_its_cause_and_old_journals_by_their_wording(synth: Any) -> None:
    from chaos.load.client import _timeout_error
    from sla.engine_series import client_left

    verdict = sla.judge(_orphans(synth, "network.delay", _request_timeout), "abort_propagation", {}, phase="storm")
    left = verdict.evidence["clients_left"]
    assert verdict.status == "fail" and left.get("request timeout", 0) > 10, verdict.evidence
    causes = {cause: _timeout_error(connect=connect, connected=connected, connect_timeout=1, request_timeout=5)
              for cause, connect, connected in (("connect_timeout", True, False), ("no_connection", False, False),
                                                ("request_timeout", False, True))}
    assert {k: v.cause for k, v in causes.items()} == {k: k for k in causes}
    st = synth.stream("s", phase="storm", sent=1.0)
    for cause, left in (("request_timeout", True), ("no_connection", False), ("connect_timeout", False)):
        st.error = causes[cause]
        assert (client_left(st) is not None) is left, cause
    st.error = ErrorInfo("timeout", "no complete response within the request timeout of 5s")  # a journal before causes
    assert client_left(st) == (st.t_end, "request timeout")
