"""Scraping the target's Prometheus endpoint on a fixed period into ``MetricSample`` records.

Only the series verifiers and reports use are kept (vLLM, SGLang, TGI and our own names), so a
large production exposition does not flood the journal. Parsing uses prometheus-client's parser.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from chaos.host.cadence import next_tick
from chaos.host.capped import METRICS_LIMIT, get_capped
from chaos.host.tls import tls_context
from chaos.model.observations import ABSENT_AFTER, ABSENT_STATUSES, MetricSample, Note

__all__ = ["ABSENT_AFTER", "ABSENT_INTERVAL_S", "ABSENT_STATUSES", "KEPT_PREFIXES", "MetricScraper", "all_metric_names",
           "parse_exposition"]

# A target that answers /metrics 404 (or 501) this many times in a row has no metrics there (a server built
# without them, llama.cpp without --metrics, a bare OpenAI-compatible app): it is asked every
# ABSENT_INTERVAL_S from then on, in case they come up, not five times a second for the whole run
# (an httpx request each: 2% of a core of the runner's, which at 64 streams was a fifth of the load's
# own CPU). Any other answer (a 401 wanting credentials, a 500, a refused connection) keeps the
# period: those are failures the console and kv_cleanup name, and may clear.
# (ABSENT_AFTER, ABSENT_STATUSES: chaos.model.observations, where the verifiers read them too)
ABSENT_INTERVAL_S = 5.0

# Series names (after prometheus-client strips nothing: samples keep their full names) we keep.
KEPT_PREFIXES = (
    "streamchaos_",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:num_preemptions",
    "vllm:request_success",
    # the prefix cache's hit rate and TTFT's queue/prefill split, per phase (chaos.output.reports.engine_phases)
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_queue_time_seconds_count",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_prefill_time_seconds_count",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:token_usage",
    "sglang:num_aborted_requests",
    "tgi_queue_size",
    "tgi_batch_current_size",
    "tgi_batch_current_max_tokens",
    "tgi_batch_max_total_tokens",
    "tgi_request_failure",
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
)


def parse_exposition(text: str, t: int, keep: Iterable[str] = KEPT_PREFIXES) -> list[MetricSample]:
    """Prometheus text → samples of the kept series, all stamped ``t``. Pure."""
    prefixes = tuple(keep)
    out: list[MetricSample] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(prefixes) and not sample.name.endswith("_created"):
                out.append(MetricSample(name=sample.name, labels=dict(sample.labels), value=float(sample.value), t=t))
    return out


def all_metric_names(text: str) -> tuple[str, ...]:
    """Every family name in an exposition (engine detection reads them); empty when it does not parse. Pure."""
    try:
        return tuple(sorted({family.name for family in text_string_to_metric_families(text)}))
    except ValueError:
        return ()


class MetricScraper:
    """Polls ``url`` every ``interval`` seconds until stopped (or while entered); each sample goes to ``sink``.

    ``headers`` go with every scrape (the target's credentials, or ``target.metrics_auth``): a
    gateway such as LiteLLM answers ``/metrics`` 401 without them. A failing scrape is a
    ``scrape_error`` note (the 1st, 10th and 100th) with its HTTP status when there is one, so the
    console and the ``kv_cleanup`` verdict can say why a series is missing; the headers never are.
    """

    def __init__(self, url: str | None, interval: float, sink: Callable[[MetricSample | Note], None],
                 headers: Mapping[str, str] | None = None) -> None:
        self.url = url
        self.interval = interval
        self.sink = sink
        self.scrapes = 0
        self.failures = 0
        self.absent_in_a_row = 0  # consecutive 404s: see ABSENT_AFTER
        self._task: asyncio.Task[None] | None = None
        # redirects followed: LiteLLM answers /metrics with 307 to /metrics/ (httpx drops the
        # Authorization header on a redirect to another origin)
        self._deadline = max(1.0, 4 * interval)
        self._client = httpx.AsyncClient(timeout=self._deadline, headers=dict(headers or {}), follow_redirects=True,
                                         trust_env=False, verify=tls_context())

    async def scrape_once(self) -> int:
        if not self.url:
            return 0
        t = time.monotonic_ns()
        status: int | None = None
        refused: str | None = None
        try:
            # streamed, at most METRICS_LIMIT bytes and one deadline: a 150 MB or slow-drip exposition
            # costs a bounded read, not the run's memory
            response = await get_capped(self._client, self.url, limit=METRICS_LIMIT, deadline=self._deadline)
            if response.status_code >= 400:
                status, refused = response.status_code, f"HTTP {response.status_code}"
            elif response.over:
                refused = response.too_large()
            if refused is not None:
                raise ValueError(refused)
            samples = self.parse(response.text, t)
        except (httpx.HTTPError, ValueError) as exc:
            self.failures += 1
            self.absent_in_a_row = self.absent_in_a_row + 1 if status in ABSENT_STATUSES else 0
            if self.failures in (1, 10, 100):
                error = refused or f"{type(exc).__name__}: {exc}"
                data: dict[str, Any] = {"url": self.url, "error": error[:300], "status": status,
                                        "failures": self.failures, "absent_in_a_row": self.absent_in_a_row}
                if self.absent_in_a_row >= ABSENT_AFTER:
                    data["next_every_s"] = max(self.interval, ABSENT_INTERVAL_S)
                self.sink(Note(topic="scrape_error", t=t, data=data))
            return 0
        self.absent_in_a_row = 0
        self.scrapes += 1
        for sample in samples:
            self.sink(sample)
        return len(samples)

    def parse(self, text: str, t: int) -> list[MetricSample]:
        """One answer's samples (ValueError: it does not parse). Pure."""
        return parse_exposition(text, t)

    async def _loop(self) -> None:
        # at once, then on the run's shared ticks (chaos.host.cadence): the slot before now is the
        # last multiple of the period, so the next ones are multiples too
        next_t = next_tick(self.interval, time.monotonic()) - self.interval
        while True:
            await self.scrape_once()
            interval = self.interval if self.absent_in_a_row < ABSENT_AFTER else max(self.interval, ABSENT_INTERVAL_S)
            next_t += interval
            now = time.monotonic()
            if next_t < now:  # a slow scrape or a stalled loop: skip the missed slots, no burst
                next_t += interval * ((now - next_t) // interval + 1)
            await asyncio.sleep(next_t - now)

    async def __aenter__(self) -> MetricScraper:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def start(self) -> None:
        if self.url and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="metric-scraper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        await self._client.aclose()
