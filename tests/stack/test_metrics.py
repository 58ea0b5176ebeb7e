"""/metrics parses as Prometheus text, carries vLLM's names and buckets, and its counters move."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chaos.stack.metrics import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS
from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(60)

NAMES = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:num_preemptions",
    "vllm:request_success", "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds", "streamchaos_kv_blocks_used",
    "streamchaos_kv_blocks_total", "streamchaos_kv_blocks_reserved", "streamchaos_kv_leaks", "streamchaos_stack_info",
}


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = httpx.get(url + "/metrics", timeout=5)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = list(text_string_to_metric_families(r.text))
    assert NAMES <= {f.name for f in families}, NAMES - {f.name for f in families}
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    want = {"model_name": "tiny", "engine": "0", **labels}
    return sum(v for (n, ls), v in samples.items() if n == name and want.items() <= dict(ls).items())


def _buckets(samples: dict[Any, float], name: str) -> list[float]:
    return sorted(float(dict(ls)["le"]) for (n, ls) in samples if n == name + "_bucket" and dict(ls)["le"] != "+Inf")


def test_names_buckets_and_counters_move(stack: StackProcess, admin: Any, sse: Any) -> None:
    before = _scrape(stack.url)
    assert _buckets(before, "vllm:time_to_first_token_seconds") == list(TTFT_BUCKETS)
    assert _buckets(before, "vllm:inter_token_latency_seconds") == list(ITL_BUCKETS)
    assert _buckets(before, "vllm:e2e_request_latency_seconds") == list(E2E_BUCKETS)
    assert _value(before, "streamchaos_kv_blocks_total") == 1024
    info = {dict(ls)["starlette"] for (n, ls) in before if n == "streamchaos_stack_info"}
    assert info == {__import__("starlette").__version__}

    r = httpx.post(stack.url + "/v1/completions",
                   json={"model": "tiny", "prompt": "count me", "max_tokens": 7, "ignore_eos": True}, timeout=30)
    assert r.status_code == 200
    sock = sse.open_raw(stack.url, "/v1/completions", {"model": "tiny", "prompt": "abort me", "max_tokens": 3000,
                                                       "ignore_eos": True, "stream": True})
    admin.decoding()
    during = _scrape(stack.url)
    assert _value(during, "vllm:num_requests_running") == 1 and _value(during, "streamchaos_kv_blocks_used") > 0
    assert 0 < _value(during, "vllm:kv_cache_usage_perc") <= 1
    sock.close()
    admin.wait_idle()

    after = _scrape(stack.url)
    delta = lambda name, **kw: _value(after, name, **kw) - _value(before, name, **kw)
    assert delta("vllm:request_success_total", finished_reason="length") == 1
    assert delta("vllm:request_success_total", finished_reason="abort") == 1
    assert delta("vllm:generation_tokens_total") >= 8
    assert delta("vllm:prompt_tokens_total") > 0
    assert delta("vllm:time_to_first_token_seconds_count") == 2
    assert delta("vllm:e2e_request_latency_seconds_count") == 1  # aborts are not in the latency histogram
    assert delta("vllm:inter_token_latency_seconds_count") >= 6
    # gauges are read at scrape time, so they are back to zero right after the abort
    assert _value(after, "vllm:num_requests_running") == 0 and _value(after, "streamchaos_kv_blocks_used") == 0
    assert _value(after, "streamchaos_kv_leaks_total") == 0
