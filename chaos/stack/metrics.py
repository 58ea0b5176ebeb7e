"""Prometheus metrics of the builtin stack, under vLLM's names and bucket boundaries.

Histograms and the finished-request counter are observed by the server as requests progress.
Everything the engine knows exactly (running, waiting, KV blocks, preemptions, token totals, leaks,
prefix-cache queries and hits, the queue and prefill times it stamps) is read from ``engine.stats()``
by a custom collector at scrape time, so those series can never go stale after a mass abort (vLLM
#22545). Each app owns its own ``CollectorRegistry``.

KV usage counts blocks held by requests plus reserved ones: a free block that still holds a cached
prefix is free (evictable), as in vLLM V1's ``kv_cache_usage_perc``; ``streamchaos_kv_blocks_cached``
counts those. A block an aborted request still holds is used, cached or not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .engine.types import REQUEST_TIME_BUCKETS
from .engine.types import Histogram as EngineHistogram

__all__ = [
    "CONTENT_TYPE",
    "E2E_BUCKETS",
    "FINISH_REASONS",
    "ITL_BUCKETS",
    "REQUEST_TIME_BUCKETS",
    "TTFT_BUCKETS",
    "StackMetrics",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vllm/v1/metrics/buckets.py defaults (reference/llm-serving.md §1.1)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0)
FINISH_REASONS = ("stop", "length", "abort", "error")

_LABELS = ("model_name", "engine")


class _EngineCollector(Collector):
    """Reads the engine's exact counters and gauges on every scrape."""

    def __init__(self, stats: Callable[[], Any], model_name: str) -> None:
        self._stats = stats
        self._labels = [model_name, "0"]

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        held = s.kv_blocks_used - s.kv_blocks_reserved  # the engine counts reservations as used

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=_LABELS)
            g.add_metric(self._labels, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=_LABELS)
            c.add_metric(self._labels, value)
            return c

        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", s.num_running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.num_waiting)
        usage = s.kv_blocks_used / s.kv_blocks_total if s.kv_blocks_total else 0.0
        yield gauge("vllm:kv_cache_usage_perc",
                    "KV-cache usage, 1 = 100% (1 - free/total; reserved blocks are not free, cached ones with no "
                    "holder are).", usage)
        yield counter("vllm:num_preemptions", "Cumulative number of preemptions from the engine.", s.num_preemptions)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens_total)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens_total)
        yield gauge("streamchaos_kv_blocks_used", "KV blocks held by requests (exact; reservations excluded).", held)
        yield gauge("streamchaos_kv_blocks_total", "KV blocks in the pool.", s.kv_blocks_total)
        yield gauge("streamchaos_kv_blocks_reserved", "KV blocks taken out of the pool by kv.pressure (admin API).",
                    s.kv_blocks_reserved)
        yield counter("streamchaos_kv_leaks", "Idle self-checks that found blocks still held (see /admin/state).",
                      s.leaks_total)
        yield counter("vllm:prefix_cache_queries",
                      "Prefix cache queries, in terms of number of queried tokens.", s.prefix_cache_queries_total)
        yield counter("vllm:prefix_cache_hits",
                      "Prefix cache hits, in terms of number of cached tokens.", s.prefix_cache_hits_total)
        yield gauge("streamchaos_kv_blocks_cached",
                    "Free KV blocks still holding a cached prefix (evictable; not counted as used).",
                    s.kv_blocks_cached)
        yield self._histogram("vllm:request_queue_time_seconds",
                              "Histogram of time spent in WAITING phase for request.", s.queue_time)
        yield self._histogram("vllm:request_prefill_time_seconds",
                              "Histogram of time spent in PREFILL phase for request.", s.prefill_time)

    def _histogram(self, name: str, doc: str, h: EngineHistogram) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=_LABELS)
        cumulative, buckets = 0, []
        for bound, count in zip((*h.bounds, float("inf")), h.counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))  # as Histogram
        family.add_metric(self._labels, buckets, h.sum)
        return family


class StackMetrics:
    """The registry of one app and the observations the request path makes into it."""

    def __init__(self, stats: Callable[[], Any], model_name: str, versions: Mapping[str, str]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._labels = {"model_name": model_name, "engine": "0"}
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            _LABELS, buckets=TTFT_BUCKETS, registry=self.registry,
        ).labels(**self._labels)
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            _LABELS, buckets=ITL_BUCKETS, registry=self.registry,
        ).labels(**self._labels)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of end-to-end request latency in seconds.",
            _LABELS, buckets=E2E_BUCKETS, registry=self.registry,
        ).labels(**self._labels)
        self._success = Counter(
            "vllm:request_success", "Count of finished requests by finish reason (aborts included).",
            (*_LABELS, "finished_reason"), registry=self.registry,
        )
        for reason in FINISH_REASONS:  # every series exists from the start, as in vLLM
            self._success.labels(**self._labels, finished_reason=reason)
        Info("streamchaos_stack", "Versions of the builtin stack (disconnect detection depends on them).",
             registry=self.registry).info(dict(versions))
        self.registry.register(_EngineCollector(stats, model_name))

    def finished(self, reason: str) -> None:
        """Count one finished request; unknown reasons are counted as ``error``."""
        self._success.labels(**self._labels, finished_reason=reason if reason in FINISH_REASONS else "error").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
