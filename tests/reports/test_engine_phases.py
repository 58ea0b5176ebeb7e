"""report.json's ``engine_phases``: the prefix cache's hit rate and TTFT's queue/prefill split per phase,
read from the engine's counters as a run scrapes them (two label sets, a restart between scrapes)."""

from __future__ import annotations

from chaos.model.observations import NS, MetricSample, Observations, PhaseWindow
from chaos.output.reports.engine_phases import counter_increase, engine_phases


def _m(name: str, value: float, t_s: float, engine: str = "0") -> MetricSample:
    return MetricSample(name, {"engine": engine}, value, int(t_s * NS))


def test_a_counter_rises_by_its_increments_and_a_restart_counts_its_new_value() -> None:
    samples = [_m("c", 10, 0), _m("c", 30, 1), _m("c", 5, 2), _m("c", 12, 3)]  # killed between 1 s and 2 s
    assert counter_increase(samples, 0, 3 * NS) == 20 + 5 + 7
    assert counter_increase(samples, int(1.5 * NS), 3 * NS) == 5 + 7  # from the last scrape before the start
    assert counter_increase(samples[:1], 0, 3 * NS) is None  # one scrape: nothing to compare


def test_the_hit_rate_falls_in_the_phase_whose_fault_flushed_the_cache() -> None:
    obs = Observations()
    obs.add(PhaseWindow("baseline", 0, 2 * NS))
    obs.add(PhaseWindow("flush", 2 * NS, 4 * NS))
    hits = [(0, 0), (1, 80), (2, 160), (3, 170), (4, 180)]
    queries = [(0, 0), (1, 100), (2, 200), (3, 300), (4, 400)]
    for engine in ("0", "1"):  # two engines (data parallel): summed
        for t, v in hits:
            obs.add(_m("vllm:prefix_cache_hits_total", v, t, engine))
        for t, v in queries:
            obs.add(_m("vllm:prefix_cache_queries_total", v, t, engine))
    for t, (s, c) in enumerate([(0.0, 0), (0.5, 10), (1.0, 20), (9.0, 30), (17.0, 40)]):
        obs.add(_m("vllm:request_queue_time_seconds_sum", s, t))
        obs.add(_m("vllm:request_queue_time_seconds_count", c, t))
    phases = engine_phases(obs)
    assert phases is not None
    assert phases["baseline"]["prefix_cache_hit_rate"] == 0.8
    assert phases["baseline"]["prefix_cache_queried_tokens"] == 400
    assert phases["flush"]["prefix_cache_hit_rate"] == 0.1
    assert phases["baseline"]["queue_mean_s"] == 0.05 and phases["flush"]["queue_mean_s"] == 0.8
    assert "prefill_mean_s" not in phases["flush"]  # not exported: not made up


def test_an_engine_without_these_counters_has_none() -> None:
    obs = Observations()
    obs.add(PhaseWindow("baseline", 0, 2 * NS))
    obs.add(_m("vllm:num_requests_running", 3, 1))
    assert engine_phases(obs) is None


def test_the_console_says_what_the_fault_did_to_the_hit_rate_and_the_queue() -> None:
    from chaos.output.report import engine_phase_lines

    report = {"engine_phases": {
        "baseline": {"prefix_cache_hit_rate": 0.8331, "queue_mean_s": 0.005, "prefill_mean_s": 0.0138},
        "pressure": {"prefix_cache_hit_rate": 0.583, "queue_mean_s": 0.0315, "prefill_mean_s": 0.0226},
        "recovery": {"queue_mean_s": 0.004}}}  # no counters there: left out, never shown as 0%
    assert engine_phase_lines(report) == [
        "prefix cache hit rate: baseline 83.3%, pressure 58.3%",
        "engine time queued + in prefill (mean): baseline 5ms + 14ms, pressure 32ms + 23ms"]
    assert engine_phase_lines({"engine_phases": None}) == []
