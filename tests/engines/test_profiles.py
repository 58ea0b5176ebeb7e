"""Engine profiles: detection from warm-up evidence, request shaping, refusals read, credentials."""

from __future__ import annotations

from dataclasses import replace

import pytest

from chaos.execution.credentials import resolve
from chaos.execution.preflight import END_WAIT_S, end_assumed, rejected_fields, sent_fields, shape_for, should_cut
from chaos.model.engines import PROFILES, Evidence, identify
from chaos.model.errors import UsageError
from chaos.model.experiment import LoadSpec
from chaos.model.observations import EndRule, StreamRecord

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    "evidence,name,why",
    [
        (Evidence(health={"status": "ok", "server": "streamchaos"}), "builtin", '"server": "streamchaos"'),
        (Evidence(owned_by=("vllm",), server_header="uvicorn"), "vllm", 'owned_by "vllm"'),
        (Evidence(owned_by=("sglang",)), "sglang", 'owned_by "sglang"'),
        (Evidence(owned_by=("llamacpp",)), "llamacpp", 'owned_by "llamacpp"'),
        (Evidence(info={"model_id": "m", "router": "text-generation-router"}), "tgi", "/info router"),
        (Evidence(headers={"x-litellm-version": "1.108.7"}), "litellm", "x-litellm-version"),
        (Evidence(liveliness='"I\'m alive!"', owned_by=("openai",)), "litellm", "/health/liveliness"),
        (Evidence(owned_by=("local",),
                  preflight_error='{"detail":"Unexpected fields in the request: {\'ignore_eos\'}"}'),
         "transformers-serve", "preflight refused"),
        (Evidence(metric_names=("process_cpu_seconds", "sglang:num_running_reqs")), "sglang",
         "metric sglang:num_running_reqs"),
        (Evidence(metric_names=("tgi_queue_size",)), "tgi", "metric tgi_queue_size"),
        (Evidence(owned_by=("openai",), server_header="uvicorn"), "openai", "no engine-specific sign"),
        (Evidence(), "openai", "no engine-specific sign"),
    ],
)
def test_identify_names_the_profile_and_why(evidence: Evidence, name: str, why: str) -> None:
    profile, reason = identify(evidence)
    assert profile.name == name and why in reason


def test_profiles_say_what_the_engines_do() -> None:
    assert PROFILES["transformers-serve"].end == EndRule(finish_reason=True, done=False)
    assert "ignore_eos" not in PROFILES["transformers-serve"].accepts
    assert all(p.end.done for n, p in PROFILES.items() if n != "transformers-serve")
    assert PROFILES["vllm"].usage_series[0][0] == "vllm:kv_cache_usage_perc"
    assert PROFILES["openai"].accepts == {"ignore_eos", "min_tokens", "stream_options"}


def test_shape_for_leaves_out_what_a_profile_does_not_accept() -> None:
    load = LoadSpec()
    assert sent_fields(load) == ["ignore_eos", "stream_options"]
    shaped, dropped = shape_for(load, PROFILES["transformers-serve"])
    assert shaped.ignore_eos is False and shaped.include_usage is True
    assert list(dropped) == ["ignore_eos"] and "transformers-serve profile" in dropped["ignore_eos"]
    same, nothing = shape_for(load, PROFILES["vllm"])
    assert same == load and nothing == {}
    assert shape_for(replace(load, ignore_eos=False), PROFILES["tgi"])[1] == {}


@pytest.mark.parametrize(
    "message,present,named",
    [
        ("Unexpected fields in the request: {'ignore_eos'}", ["ignore_eos", "stream_options"], ["ignore_eos"]),
        ("1 validation error: stream_options Extra inputs are not permitted", ["ignore_eos", "stream_options"],
         ["stream_options"]),
        ("Unrecognized request argument supplied: ignore eos", ["ignore_eos"], ["ignore_eos"]),
        ("max_tokens must be at most 64", ["ignore_eos", "stream_options"], []),
        ("Unexpected fields: {'ignore_eos'}", ["stream_options"], []),  # not sent: cannot be the cause
    ],
)
def test_rejected_fields_reads_the_refusal(message: str, present: list[str], named: list[str]) -> None:
    assert rejected_fields(message, present) == named


@pytest.mark.parametrize(
    "since_s,events,max_tokens,cut",
    [
        (0.5, 50, 100_000, False),  # too soon to judge the rate
        (1.0, 100, 100_000, True),  # 100 events/s: the end is ~1000 s away
        (1.0, 100, 150, False),  # 100 events/s: the end is half a second away, so it is awaited
        (1.0, 100, 1_500, False),  # ~15 s at this rate: within twice the wait, awaited until the wait is up
        (END_WAIT_S, 900, 1_500, True),  # the wait is up
        (1.0, 3, None, True),  # no max_tokens: endless, nothing to wait for
        (3.0, 0, 100_000, False),  # no content event yet counted: nothing to project from
    ],
)
def test_the_preflight_cuts_a_stream_only_when_its_end_is_far_off(since_s: float, events: int, max_tokens: int | None,
                                                                   cut: bool) -> None:
    assert should_cut(since_s, events, max_tokens) is cut


def test_a_cut_preflight_says_which_end_of_stream_rule_is_assumed() -> None:
    assert end_assumed(PROFILES["vllm"]).endswith("the vllm profile's rule is assumed: a complete stream ends with "
                                                  "a finish_reason, then [DONE]")
    assert "a finish_reason ([DONE] not required)" in end_assumed(PROFILES["transformers-serve"])
    assert end_assumed(PROFILES["builtin"]).startswith("the end-of-stream rule was not observed")


def test_a_stream_without_done_is_complete_only_under_a_rule_that_does_not_require_it() -> None:
    ended = StreamRecord(id="a", phase="p", finish_reason="length", done_seen=False, status=200, t_end=5)
    assert not ended.complete and ended.is_complete(EndRule(done=False))
    refused = replace(ended, status=422)
    assert not refused.is_complete(EndRule(done=False))


def test_credentials_come_from_the_environment_and_say_where_from() -> None:
    env = {"KEY": "sk-1", "MKEY": "mt-2"}
    creds = resolve(None, "KEY", "api_key", environ=env)
    assert creds.api_key == "sk-1" and creds.metrics_token == "sk-1"
    assert creds.describe() == {"api_key": "env:KEY", "metrics_auth": "the target's (env:KEY)"}
    assert "sk-1" not in repr(creds)
    assert resolve("inline", "KEY", "none", cli_api_key_env="MKEY", environ=env).api_key == "mt-2"  # the CLI wins
    assert resolve(None, None, "env:MKEY", environ=env).metrics_headers() == {"Authorization": "Bearer mt-2"}
    assert resolve("inline", None, "none", environ=env).metrics_headers() == {}
    with pytest.raises(UsageError, match="NOPE is not set"):
        resolve(None, "NOPE", "api_key", environ=env)
