"""`kv_cleanup` on synthetic metric series: a leak that never returns to baseline fails it, a missing series
is inconclusive (never zero), and a prompt return passes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import sla
from chaos.model.engines import PROFILES

pytestmark = pytest.mark.timeout(30)

USAGE, RUNNING = "vllm:kv_cache_usage_perc", "vllm:num_requests_running"
EVERY = 0.25  # scrape interval, s


def load(synth: Any, phase: str = "load", start: float = 1.0, n: int = 10, **kw: Any) -> list[Any]:
    # n streams 0.2s apart, each 0.1s to first content then 9 gaps of 20ms: in flight 1.0 .. ~3.08
    return [synth.stream(f"{phase}{i}", phase=phase, sent=start + i * 0.2, **kw) for i in range(n)]


def end_of(streams: list[Any], synth: Any) -> float:
    return float(max(st.t_end for st in streams) - synth.T0) / 1e9


def scenario(
    synth: Any,
    after: Callable[[float], float],
    running_after: Callable[[float], float] | None = None,
    *,
    stop: float = 10.0,
    first_scrape: float = 0.0,
    names: tuple[str, str] = (USAGE, RUNNING),
    busy: tuple[float, float] = (0.4, 4.0),
    notes: list[Any] | None = None,
) -> tuple[Any, float]:
    """Load from 1s; usage 0 before, ``busy`` during, ``after(seconds since end of load)`` after it."""
    streams = load(synth)
    end = end_of(streams, synth)
    run_after = running_after or (lambda dt: 0.0 if after(dt) == 0.0 else 2.0)

    def usage(t: float) -> float:
        return 0.0 if t < 1.0 else busy[0] if t < end else after(t - end)

    def running(t: float) -> float:
        return 0.0 if t < 1.0 else busy[1] if t < end else run_after(t - end)

    metrics = synth.steps(names[0], first_scrape, stop, EVERY, usage) + synth.steps(
        names[1], first_scrape, stop, EVERY, running
    )
    return synth.obs(streams, metrics, notes=notes or []), end


def test_leaking_kv_that_never_returns_fails(synth: Any) -> None:
    leak_note = synth.note("kv_leak", 8.0, request_ids=["load3", "load7"])
    obs, _ = scenario(synth, lambda dt: 0.3, notes=[leak_note])
    verdict = sla.judge(obs, "kv_cleanup", {"within": "2s"})
    assert verdict.status == "fail"
    assert verdict.unit == "s"
    assert verdict.budget == 2.0
    point = verdict.evidence["check_points"][0]
    assert point["kind"] == "end_of_load"
    assert point["outcome"] == "leaked"
    assert point[USAGE]["outcome"] == "leaked"
    assert point[USAGE]["value_at_deadline"] == pytest.approx(0.3)
    assert point[USAGE]["took_s"] is None
    assert point[RUNNING]["value_at_deadline"] == 2.0
    assert point["leaked_request_ids"] == ["load3", "load7"]
    assert verdict.evidence["leaked_request_ids"] == ["load3", "load7"]
    assert verdict.figure is not None and verdict.figure > 2.0  # watched that long without a return


def test_prompt_return_to_baseline_passes(synth: Any) -> None:
    obs, _ = scenario(synth, lambda dt: 0.4 if dt < 0.5 else 0.0)
    verdict = sla.judge(obs, "kv_cleanup", {})
    assert verdict.status == "pass"
    assert verdict.evidence["baseline"] == {USAGE: 0.0, RUNNING: 0.0}
    assert verdict.evidence["usage_series"] == USAGE
    # the figure is when the first scrape at baseline came after the end of load
    assert verdict.figure is not None and 0.5 <= verdict.figure <= 0.5 + EVERY
    assert verdict.evidence["check_points"][0][USAGE]["outcome"] == "returned"


def test_late_return_fails_with_the_time_it_took(synth: Any) -> None:
    obs, _ = scenario(synth, lambda dt: 0.4 if dt < 3.0 else 0.0)
    verdict = sla.judge(obs, "kv_cleanup", {"within": "2s"})
    assert verdict.status == "fail"
    assert verdict.evidence["check_points"][0]["outcome"] == "late"
    assert verdict.figure is not None and 3.0 <= verdict.figure <= 3.0 + EVERY


def test_sparse_scrapes_cannot_prove_a_late_return(synth: Any) -> None:
    # one scrape before load, then one 5s after its end that shows baseline: back by then, maybe in time
    streams = load(synth)
    end = end_of(streams, synth)
    metrics = synth.series(USAGE, [(0.0, 0.0), (2.0, 0.4), (end + 5.0, 0.0)])
    metrics += synth.series(RUNNING, [(0.0, 0.0), (2.0, 4.0), (end + 5.0, 0.0)])
    verdict = sla.judge(synth.obs(streams, metrics), "kv_cleanup", {"within": "2s"})
    assert verdict.status == "inconclusive"
    point = verdict.evidence["check_points"][0]
    assert point["outcome"] == "unobserved"
    assert point[USAGE]["took_s"] == pytest.approx(5.0)


def test_running_requests_stuck_alone_fail(synth: Any) -> None:
    # KV back to zero but the engine still counts a running request: an abort that never finished
    obs, _ = scenario(synth, lambda dt: 0.0, running_after=lambda dt: 1.0)
    verdict = sla.judge(obs, "kv_cleanup", {})
    assert verdict.status == "fail"
    point = verdict.evidence["check_points"][0]
    assert point[USAGE]["outcome"] == "returned"
    assert point[RUNNING]["outcome"] == "leaked"


def test_missing_series_is_inconclusive_never_zero(synth: Any) -> None:
    streams = load(synth)
    only_running = synth.steps(RUNNING, 0.0, 10.0, EVERY, lambda t: 0.0)
    verdict = sla.judge(synth.obs(streams, only_running), "kv_cleanup", {})
    assert verdict.status == "inconclusive"
    assert "no KV usage series" in verdict.evidence["reason"]
    assert "unknown, not zero" in verdict.evidence["reason"]
    only_usage = synth.steps(USAGE, 0.0, 10.0, EVERY, lambda t: 0.0)
    verdict = sla.judge(synth.obs(streams, only_usage), "kv_cleanup", {})
    assert verdict.status == "inconclusive"
    assert "no running requests series" in verdict.evidence["reason"]
    verdict = sla.judge(synth.obs(streams, only_usage + only_running), "kv_cleanup", {"series": "my_kv"})
    assert verdict.status == "inconclusive"
    assert "'my_kv' has no samples" in verdict.evidence["reason"]


def test_scrapes_ending_before_the_deadline_are_inconclusive(synth: Any) -> None:
    obs, end = scenario(synth, lambda dt: 0.3, stop=4.0)
    assert end + 2.0 > 4.0
    verdict = sla.judge(obs, "kv_cleanup", {"within": "2s"})
    assert verdict.status == "inconclusive"
    assert verdict.evidence["check_points"][0]["outcome"] == "unobserved"


def test_no_baseline_is_inconclusive_and_no_metrics_endpoint_unobservable(synth: Any) -> None:
    obs, _ = scenario(synth, lambda dt: 0.0, first_scrape=1.5)  # first scrape after the first stream
    verdict = sla.judge(obs, "kv_cleanup", {})
    assert verdict.status == "inconclusive"
    assert "no baseline" in verdict.evidence["reason"]
    obs, _ = scenario(synth, lambda dt: 0.0)
    obs.notes.append(synth.note("target", 0.0, metrics=False))
    verdict = sla.judge(obs, "kv_cleanup", {})
    assert verdict.status == "unobservable"
    assert verdict.evidence["reason"].startswith("the target has no metrics endpoint"), verdict.evidence


def test_tolerance_is_a_share_of_the_cache(synth: Any) -> None:
    obs, _ = scenario(synth, lambda dt: 0.05, running_after=lambda dt: 0.0)  # prefix cache keeps 5%
    assert sla.judge(obs, "kv_cleanup", {}).status == "fail"
    verdict = sla.judge(obs, "kv_cleanup", {"tolerance": "10%"})
    assert verdict.status == "pass"
    assert verdict.evidence["usage_slack"] == pytest.approx(0.1)


def test_exact_block_counts_ignore_tolerance(synth: Any) -> None:
    names = ("streamchaos_kv_blocks_used", RUNNING)
    obs, _ = scenario(synth, lambda dt: 1.0, running_after=lambda dt: 0.0, names=names, busy=(40, 4))
    verdict = sla.judge(obs, "kv_cleanup", {"tolerance": 0.5})
    assert verdict.evidence["usage_series"] == "streamchaos_kv_blocks_used"
    assert verdict.status == "fail"  # one block short of baseline is a leaked block


@pytest.mark.parametrize(
    ("present", "chosen"),
    [
        (("vllm:gpu_cache_usage_perc", "vllm:num_requests_running"), "vllm:gpu_cache_usage_perc"),
        (("sglang:token_usage", "sglang:num_running_reqs"), "sglang:token_usage"),
        (("tgi_batch_current_max_tokens", "tgi_batch_current_size"), "tgi_batch_current_max_tokens"),
    ],
)
def test_engine_series_fallbacks(synth: Any, present: tuple[str, str], chosen: str) -> None:
    obs, _ = scenario(synth, lambda dt: 0.0 if dt > 0.3 else 0.2, names=present)
    verdict = sla.judge(obs, "kv_cleanup", {})
    assert verdict.evidence["usage_series"] == chosen
    assert verdict.evidence["running_series"] == present[1]
    assert verdict.status == "pass"


def test_fallback_order_prefers_the_exact_and_the_current_names(synth: Any) -> None:
    obs, _ = scenario(synth, lambda dt: 0.0)
    obs.metrics += synth.steps("vllm:gpu_cache_usage_perc", 0.0, 10.0, EVERY, lambda t: 0.0)
    assert sla.judge(obs, "kv_cleanup", {}).evidence["usage_series"] == USAGE
    obs.metrics += synth.steps("streamchaos_kv_blocks_used", 0.0, 10.0, EVERY, lambda t: 0.0)
    assert sla.judge(obs, "kv_cleanup", {}).evidence["usage_series"] == "streamchaos_kv_blocks_used"


def test_one_leaking_engine_among_several_fails(synth: Any) -> None:
    streams = load(synth)
    end = end_of(streams, synth)
    metrics = []
    for engine, leaks in (("0", False), ("1", True)):
        metrics += synth.steps(
            USAGE,
            0.0,
            10.0,
            EVERY,
            lambda t, lk=leaks: 0.0 if t < 1 else (0.5 if t < end or lk else 0.0),
            engine=engine,
        )
        metrics += synth.steps(RUNNING, 0.0, 10.0, EVERY, lambda t: 0.0 if t < 1 or t >= end else 3.0, engine=engine)
    verdict = sla.judge(synth.obs(streams, metrics), "kv_cleanup", {})
    assert verdict.status == "fail"
    assert verdict.evidence["check_points"][0][USAGE]["labels"] == {"engine": "1"}


def test_a_pod_that_is_gone_is_set_aside_and_the_others_are_judged(synth: Any) -> None:
    """A Kubernetes target's series carry a pod label; a deleted pod's series stop mid-run. It cannot hold
    blocks any more, so the check points are judged on the pods still scraped (it used to be unobserved,
    so every pod kill made kv_cleanup inconclusive); a leak in a pod that stayed still fails."""
    streams = load(synth)
    end = end_of(streams, synth)

    def metrics(survivor_leaks: bool) -> list[Any]:
        out = []
        for pod, stops, leaks in (("web-a", 2.0, False), ("web-b", 10.0, survivor_leaks)):
            def usage(t: float, lk: bool = leaks) -> float:
                return 0.0 if t < 1 else (0.5 if t < end or lk else 0.0)

            out += synth.steps(USAGE, 0.0, stops, EVERY, usage, pod=pod)
            out += synth.steps(RUNNING, 0.0, stops, EVERY, lambda t: 0.0 if t < 1 or t >= end else 3.0, pod=pod)
        return out

    verdict = sla.judge(synth.obs(streams, metrics(False)), "kv_cleanup", {"within": "2s"})
    assert verdict.status == "pass"
    (point,) = verdict.evidence["check_points"]
    assert point["series_gone"] == [{"pod": "web-a"}] and point[USAGE]["labels"] == {"pod": "web-b"}
    leaking = sla.judge(synth.obs(streams, metrics(True)), "kv_cleanup", {"within": "2s"})
    assert leaking.status == "fail" and leaking.evidence["check_points"][0][USAGE]["labels"] == {"pod": "web-b"}
    # with no series left at all past the point, nothing is judged from the absence
    early = [m for m in metrics(False) if m.t < synth.ns(2.0)]
    assert sla.judge(synth.obs(streams, early), "kv_cleanup", {"within": "2s"}).status == "inconclusive"


def test_blocks_held_after_an_abort_burst_fail_even_if_freed_by_later_load(synth: Any) -> None:
    # The bug: aborted requests free their blocks only at the next scheduler step, and an idle
    # engine takes no step. Clients hang up at ~1.3s; nothing runs until the next load at 8s,
    # which finally frees the blocks; the end of load then looks clean.
    storm = [synth.stream(f"h{i}", phase="storm", sent=1.0 + i * 0.02, tokens=50, hangup_after=0.3) for i in range(10)]
    later = load(synth, phase="later", start=8.0)
    burst_end = (max(st.hangup.t for st in storm) - synth.T0) / synth.S
    end = end_of(later, synth)

    def usage(t: float) -> float:
        return 0.0 if t < 1.0 or t >= end else 0.5

    def running(t: float) -> float:
        return 0.0 if t < 1.0 or t >= end else 10.0

    metrics = synth.steps(USAGE, 0.0, 12.0, EVERY, usage) + synth.steps(RUNNING, 0.0, 12.0, EVERY, running)
    obs = synth.obs(storm + later, metrics)
    verdict = sla.judge(obs, "kv_cleanup", {"within": "2s"})
    assert verdict.status == "fail"
    kinds = {p["kind"]: p for p in verdict.evidence["check_points"]}
    assert kinds["abort_burst"]["outcome"] == "leaked"
    assert kinds["abort_burst"]["t_s"] == pytest.approx(burst_end)
    assert kinds["end_of_load"]["outcome"] == "returned"
    # scoped to the later phase alone (no hang-ups in it), only the end of load is checked
    scoped = sla.judge(obs, "kv_cleanup", {"within": "2s"}, "later")
    assert scoped.status == "pass"
    assert [p["kind"] for p in scoped.evidence["check_points"]] == ["end_of_load"]


def test_a_burst_followed_too_soon_by_more_load_is_not_blamed(synth: Any) -> None:
    storm = [synth.stream(f"h{i}", phase="storm", sent=1.0, tokens=50, hangup_after=0.3) for i in range(3)]
    later = load(synth, phase="later", start=1.8)  # 0.5s after the burst: less than `within`
    end = end_of(later, synth)
    metrics = synth.steps(USAGE, 0.0, 8.0, EVERY, lambda t: 0.0 if t < 1.0 or t >= end + 0.3 else 0.5)
    metrics += synth.steps(RUNNING, 0.0, 8.0, EVERY, lambda t: 0.0 if t < 1.0 or t >= end + 0.3 else 3.0)
    verdict = sla.judge(synth.obs(storm + later, metrics), "kv_cleanup", {"within": "2s"})
    assert verdict.status == "pass"
    kinds = {p["kind"]: p["outcome"] for p in verdict.evidence["check_points"]}
    assert kinds == {"abort_burst": "unobserved", "end_of_load": "returned"}


def test_a_missing_series_says_why_the_scrapes_failed(synth: Any) -> None:
    """A gateway that answers /metrics 401 (LiteLLM without its key): the reason names the status
    and what to set, not only "no KV usage series was scraped" (the 401 was in the journal only)."""
    streams = [synth.stream(f"s{i}", sent=1 + i * 0.1) for i in range(5)]
    notes = [synth.note("scrape_error", 0.2, url="http://gw/metrics", error="HTTP 401", status=401, failures=10)]
    verdict = sla.judge(synth.obs(streams, notes=notes), "kv_cleanup", {})
    assert verdict.status == "inconclusive"
    reason = verdict.evidence["reason"]
    assert reason.startswith("scraping http://gw/metrics failed: HTTP 401 (unauthorised: set target.metrics_auth")
    assert "no KV usage series was scraped" in reason


def test_the_profile_names_the_series_and_the_hint(synth: Any) -> None:
    """A profile naming no series, with metrics scraped from somewhere (the scrape gave samples)."""
    streams = [synth.stream(f"s{i}", sent=1 + i * 0.1) for i in range(5)]
    # llama.cpp's profile before it read /slots: a running series, no KV usage series
    profile = {**PROFILES["llamacpp"].describe(), "usage_series": [],
               "running_series": ["llamacpp:requests_processing"]}
    notes = [synth.note("engine_profile", 0.0, profile=profile, end={"finish_reason": True, "done": True})]
    metrics = synth.steps("llamacpp:requests_processing", 0.0, 3.0, EVERY, lambda t: 0.0)
    verdict = sla.judge(synth.obs(streams, metrics, notes=notes), "kv_cleanup", {})
    assert verdict.status == "unobservable"  # the series cannot exist there: not observable, not undecided
    assert verdict.evidence["reason"].startswith("llama.cpp server exports no KV usage series (profile llamacpp)")
    assert "name it with `series`" in verdict.evidence["reason"]
    # an entry that names a series of its own is judged on it: missing, it is unknown (inconclusive)
    verdict = sla.judge(synth.obs(streams, metrics, notes=notes), "kv_cleanup", {"series": "my_kv"})
    assert verdict.status == "inconclusive"
    assert "'my_kv' has no samples" in verdict.evidence["reason"]
    # the running series the profile does name: abort_propagation can observe it
    assert sla.judge(synth.obs(streams, metrics, notes=notes), "abort_propagation", {}).status == "inconclusive"


TRANSFORMERS = {"name": "transformers-serve", "title": "transformers serve", "usage_series": [], "running_series": [],
                "metrics": False, "metrics_hint": "transformers serve exports no Prometheus metrics (no /metrics)"}


@pytest.mark.parametrize("own_series", [False, True], ids=["bare", "with-host-and-gpu-samples"])
@pytest.mark.parametrize("verifier", ["kv_cleanup", "abort_propagation"])
def test_an_engine_without_metrics_is_named_first_and_no_metrics_url_is_suggested(
        synth: Any, verifier: str, own_series: bool) -> None:
    """Before: "scraping .../metrics failed: HTTP 404 (no metrics there: set target.metrics_url) ...":
    advice that cannot help, since transformers serve exports no metrics anywhere. The run's own
    host and GPU samples are not the target's metrics (a CI run read them as such)."""
    streams = [synth.stream(f"s{i}", sent=1 + i * 0.1) for i in range(5)]
    notes = [synth.note("engine_profile", 0.0, profile=TRANSFORMERS, end={"finish_reason": True, "done": False}),
             synth.note("scrape_error", 0.2, url="http://hf/metrics", error="HTTP 404", status=404, failures=12,
                        absent_in_a_row=12, next_every_s=5.0)]
    own = []
    if own_series:
        own = (synth.steps("host_neighbour_cores", 0.0, 3.0, 0.5, lambda t: 0.2)
               + synth.steps("gpu_sm_clock_mhz", 0.0, 3.0, 1.0, lambda t: 1980.0, gpu="0"))
    verdict = sla.judge(synth.obs(streams, own, notes=notes), verifier, {})
    assert verdict.status == "unobservable"
    reason = verdict.evidence["reason"]
    assert reason == "transformers serve exports no Prometheus metrics (profile transformers-serve)", reason
    assert "HTTP 404" in verdict.evidence["scrape_errors"][0]


@pytest.mark.parametrize("verifier", ["kv_cleanup", "abort_propagation"])
def test_a_404_at_metrics_of_a_generic_server_says_so_first_then_where_metrics_could_be(
        synth: Any, verifier: str) -> None:
    """A generic server (perhaps a gateway in front of an engine) with /metrics 404: the truth, then the
    suggestion that can help."""
    streams = [synth.stream(f"s{i}", sent=1 + i * 0.1) for i in range(5)]
    profile = {"name": "openai", "title": "generic OpenAI-compatible server",
               "usage_series": ["vllm:kv_cache_usage_perc"], "running_series": ["vllm:num_requests_running"],
               "metrics": True, "metrics_hint": ""}
    notes = [synth.note("engine_profile", 0.0, profile=profile, end={"finish_reason": True, "done": True}),
             synth.note("scrape_error", 0.2, url="http://gw/metrics", error="HTTP 404", status=404, failures=12,
                        absent_in_a_row=12, next_every_s=5.0)]
    verdict = sla.judge(synth.obs(streams, notes=notes), verifier, {})
    assert verdict.status == "unobservable"
    reason = verdict.evidence["reason"]
    assert reason.startswith("the target has no /metrics (404 ×12 at http://gw/metrics); "), reason
    assert reason.endswith("set target.metrics_url to the engine's own /metrics"), reason
