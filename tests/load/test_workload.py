"""Workloads: seeded prompts in each script, JSONL files, request bodies, Gamma arrival gaps."""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest

from chaos.load.workload import (
    LoadSettings,
    PromptSettings,
    Workload,
    build_body,
    gamma_gaps,
    load_jsonl,
    synthetic_text,
)
from chaos.model.errors import ChaosError


def test_scripts_produce_their_characters() -> None:
    rng = random.Random(0)
    ascii_text = synthetic_text(rng, 200, "ascii")
    assert len(ascii_text) == 200 and ascii_text.isascii()
    cjk = synthetic_text(rng, 100, "cjk")
    assert len(cjk) == 100 and all(len(c.encode()) == 3 for c in cjk)
    emoji = synthetic_text(rng, 300, "emoji")
    assert len(emoji) >= 300 and all(not c.isascii() for c in emoji.replace("1", ""))
    assert "\u200d" in emoji  # ZWJ sequences are in the mix


def test_prompts_follow_the_mix_and_lengths_and_replay(make_spec: Callable[..., LoadSettings]) -> None:
    spec = make_spec(prompts=PromptSettings(min_chars=20, max_chars=40, mix=(("ascii", 0.5), ("cjk", 0.5))))
    work = Workload(spec, model="m", seed=5)
    prompts = [work.prompt(n).text or "" for n in range(400)]
    assert prompts == [Workload(spec, model="m", seed=5).prompt(n).text for n in range(400)]
    assert prompts != [Workload(spec, model="m", seed=6).prompt(n).text for n in range(400)]
    assert all(20 <= len(p) <= 40 for p in prompts)
    cjk_share = sum(not p.isascii() for p in prompts) / len(prompts)
    assert 0.4 < cjk_share < 0.6


def test_bodies_for_both_endpoints(make_spec: Callable[..., LoadSettings]) -> None:
    spec = make_spec(max_tokens=(3, 9), temperature=0.7)
    body, prompt = Workload(spec, model="tiny", seed=1).request(0)
    assert body["prompt"] == prompt.text and body["stream"] is True and body["model"] == "tiny"
    assert 3 <= body["max_tokens"] <= 9 and body["temperature"] == 0.7
    assert body["stream_options"] == {"include_usage": True} and body["ignore_eos"] is True
    chat, _ = Workload(make_spec(endpoint="chat", include_usage=False, ignore_eos=False), model="m", seed=1).request(0)
    assert chat["messages"][0]["role"] == "user" and "prompt" not in chat
    assert "stream_options" not in chat and "ignore_eos" not in chat
    drawn = {Workload(spec, model="m", seed=1).request(n)[0]["max_tokens"] for n in range(200)}
    assert drawn == set(range(3, 10))


def test_jsonl_prompts_and_expected_text(tmp_path: Path, make_spec: Callable[..., LoadSettings]) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps({"prompt": "hello", "expected_text": "world"}) + "\n\n"
        + json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n",
        encoding="utf-8",
    )
    prompts = load_jsonl(path)
    assert prompts[0].text == "hello" and prompts[0].expected_text == "world"
    assert prompts[1].as_messages() == [{"role": "user", "content": "hi"}] and prompts[1].as_text() == "hi"
    spec = make_spec(endpoint="chat", prompts=PromptSettings(source=str(path)))
    body, prompt = Workload(spec, model="m", seed=0).request(0)
    assert body["messages"] == [{"role": "user", "content": "hello"}] and prompt.expected_text == "world"
    assert build_body("completions", "m", prompts[1], max_tokens=1, temperature=0, ignore_eos=False,
                      include_usage=False)["prompt"] == "hi"


def test_bad_jsonl_says_where_and_what(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"text": "no"}\n', encoding="utf-8")
    with pytest.raises(ChaosError, match=r"bad.jsonl:2: expected a string \"prompt\""):
        load_jsonl(path)
    with pytest.raises(ChaosError, match="cannot read"):
        load_jsonl(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("burstiness", [1.0, 0.25, 4.0])
def test_gamma_gaps_have_the_mean_rate_and_the_burstiness(burstiness: float) -> None:
    rate = 50.0
    gen = gamma_gaps(random.Random(11), rate, burstiness)
    gaps = [next(gen) for _ in range(20000)]
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.05)
    # Gamma(k, θ) has coefficient of variation 1/sqrt(k): burstier below 1, smoother above
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
    assert cv == pytest.approx(burstiness**-0.5, rel=0.1)


def test_gamma_gaps_reject_nonsense() -> None:
    with pytest.raises(ChaosError, match="rate"):
        next(gamma_gaps(random.Random(0), 0, 1))
    with pytest.raises(ChaosError, match="burstiness"):
        next(gamma_gaps(random.Random(0), 1, 0))
