"""Long contexts and the prefix cache through the real builtin stack: an 8,000-token prompt streams (its
prefill chunked under max_num_batched_tokens), a second send of it is served from the prefix cache
(usage.prompt_tokens_details.cached_tokens), /metrics counts queries and hits under vLLM's names, and
POST /reset_prefix_cache empties the cache."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chaos.stack.engine import Tokenizer
from chaos.stack.metrics import REQUEST_TIME_BUCKETS
from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(120)

# 8K context, 1,100 blocks of 16 tokens (17,600: two 8K requests at once); prefill chunks of 2,048 (the default)
ARGS = ("--max-model-len", "8192", "--kv-blocks", "1100", "--max-num-seqs", "4")
PROMPT_TOKENS = 8000


@pytest.fixture(scope="module")
def stack() -> Iterator[StackProcess]:
    with StackProcess.start(*ARGS, timeout=60) as proc:
        yield proc


def _stream(stack: StackProcess, prompt: Any, max_tokens: int = 8) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Stream one completion; its chunks and the usage chunk."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "temperature": 0, "stream_options": {"include_usage": True}}
    events = []
    with httpx.stream("POST", stack.base_url + "/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    assert all("error" not in e for e in events), events[-1]
    usage = events[-1]
    assert usage["choices"] == []
    return events[:-1], usage["usage"]


def _scrape(stack: StackProcess) -> dict[str, float]:
    text = httpx.get(stack.url + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name + ("{le=%s}" % s.labels["le"] if "le" in s.labels else "")
            out[key] = out.get(key, 0.0) + s.value
    return out


def _idle(stack: StackProcess) -> dict[str, Any]:
    for _ in range(500):
        state = httpx.get(stack.admin_url + "/state", headers=stack.admin_headers, timeout=5).json()
        if (state["num_running"], state["num_waiting"]) == (0, 0):
            return dict(state)
        __import__("time").sleep(0.01)
    pytest.fail(f"the stack did not go idle: {state}")


def test_an_8k_prompt_streams_and_its_second_send_is_served_from_the_prefix_cache(stack: StackProcess) -> None:
    tok = Tokenizer.load()
    rng = random.Random(8)
    ids = [rng.randrange(300, tok.vocab_size) for _ in range(PROMPT_TOKENS)]
    before = _scrape(stack)

    chunks, usage = _stream(stack, ids)
    assert usage["prompt_tokens"] == PROMPT_TOKENS and usage["completion_tokens"] == 8
    assert "prompt_tokens_details" not in usage  # nothing was cached yet
    text = "".join(c["choices"][0]["text"] for c in chunks)

    chunks2, usage2 = _stream(stack, ids)
    # every full block but the one holding the last prompt token: (8000 - 1) // 16 * 16
    assert usage2["prompt_tokens_details"] == {"cached_tokens": 7984}
    assert "".join(c["choices"][0]["text"] for c in chunks2) == text  # a hit changes no token (temperature 0)

    state = _idle(stack)
    after = _scrape(stack)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    assert delta["vllm:prefix_cache_queries_total"] == 2 * PROMPT_TOKENS
    assert delta["vllm:prefix_cache_hits_total"] == 7984
    assert delta["vllm:prompt_tokens_total"] == 2 * PROMPT_TOKENS
    assert delta["vllm:request_queue_time_seconds_count"] == 2
    assert delta["vllm:request_prefill_time_seconds_count"] == 2
    buckets = sorted(float(k.split("le=")[1][:-1]) for k in after
                     if k.startswith("vllm:request_prefill_time_seconds_bucket") and "+Inf" not in k)
    assert buckets == list(REQUEST_TIME_BUCKETS)
    # idle: the cached blocks are free (not used, not a leak) and counted apart
    assert after["streamchaos_kv_blocks_used"] == 0 and after["vllm:kv_cache_usage_perc"] == 0
    assert after["streamchaos_kv_blocks_cached"] == state["kv_blocks_cached"] >= 500
    assert after["streamchaos_kv_leaks_total"] == 0 and state["leaked_request_ids"] == []

    # vLLM's reset path, behind the admin token
    assert httpx.post(stack.url + "/reset_prefix_cache", timeout=5).status_code == 403
    reset = httpx.post(stack.url + "/reset_prefix_cache", headers=stack.admin_headers, timeout=5).json()
    assert reset == {"evicted": state["kv_blocks_cached"], "forgotten_held": 0}
    assert _scrape(stack)["streamchaos_kv_blocks_cached"] == 0
    _, usage3 = _stream(stack, ids, max_tokens=1)
    assert "prompt_tokens_details" not in usage3 and usage3["prompt_tokens"] == PROMPT_TOKENS


def test_a_long_text_prompt_counts_the_servers_tokens(stack: StackProcess) -> None:
    """About 7,000 tokens of text (a long document), tokenized by the stack: prompt_tokens says how many."""
    tok = Tokenizer.load()
    rng = random.Random(9)
    words = ["latency", "cache", "stream", "token", "abort", "prefill", "décodage", "キャッシュ", "поток", "🚀"]
    text = " ".join(rng.choice(words) for _ in range(2400))
    expected = len(tok.encode(text))
    assert 4000 < expected < 8192 - 16, expected
    _, usage = _stream(stack, text, max_tokens=16)
    assert usage["prompt_tokens"] == expected and usage["completion_tokens"] == 16


def test_a_prompt_over_the_context_is_refused(stack: StackProcess) -> None:
    r = httpx.post(stack.base_url + "/completions", json={"model": "tiny", "prompt": [400] * 8192, "max_tokens": 1},
                   timeout=10)
    assert r.status_code == 400 and "8192" in r.json()["error"]["message"]
