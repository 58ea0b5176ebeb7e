"""`load.workload:`, the chat pass-through keys and SLA entries' `turns:` as the loader reads them: the typed
settings they become, and every mistake located at file:line with what would be right, before any load."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from chaos.experiment import Experiment, LoadSpec, WorkloadSpec, parse_experiment
from chaos.load.wire import decode, encode, settings_from_json, settings_to_json
from chaos.load.workload import LoadSettings
from chaos.load.workloads import WorkloadSettings
from chaos.model.errors import ExperimentInvalid
from chaos.model.turns import Turns, parse_turns

pytestmark = pytest.mark.timeout(30)

TRACES = Path(__file__).resolve().parents[2] / "experiments" / "traces"


def experiment(load: str, extra: str = "", where: Path | None = None) -> Experiment:
    text = f"name: w\n{load}phases: [{{name: a, duration: 2s}}]\n{extra}"
    path = "w.yaml" if where is None else str(where)
    return parse_experiment(text, path)


def problems(load: str, extra: str = "", where: Path | None = None) -> list[str]:
    with pytest.raises(ExperimentInvalid) as info:
        experiment(load, extra, where)
    return [str(p) for p in info.value.problems]


def test_no_workload_is_single_and_the_load_spec_is_unchanged() -> None:
    exp = experiment("load: {concurrency: 2}\n")
    assert exp.load == LoadSpec(concurrency=2)
    assert exp.load.workload == WorkloadSpec() and exp.load.workload.kind == "single"
    assert LoadSettings.of(exp.load).workload == WorkloadSettings()


def test_sessions_parse_into_typed_settings_that_cross_pipes_and_the_shard_protocol() -> None:
    exp = experiment("load:\n  endpoint: chat\n  workload: {kind: sessions, turns: [2, 5], think_time: [500ms, 2s], "
                     "on_cut: end, system_chars: 200}\n  reasoning: false\n"
                     "  tools: [{type: function, function: {name: lookup, parameters: {type: object}}}]\n"
                     "  tool_choice: {type: function, function: {name: lookup}}\n")
    spec = exp.load.workload
    assert (spec.kind, spec.turns, spec.think_time, spec.on_cut, spec.system_chars) == (
        "sessions", (2, 5), (0.5, 2.0), "end", 200)
    assert spec.tokenizer == ("builtin", "tiny")  # the builtin target's own tokenizer counts the prompts
    settings = LoadSettings.of(exp.load)
    assert settings_from_json(decode(encode(settings_to_json(settings)))) == settings
    assert pickle.loads(pickle.dumps(settings)) == settings
    assert settings.tools[0]["function"]["name"] == "lookup" and settings.reasoning is False
    assert settings.tool_choice == {"type": "function", "function": {"name": "lookup"}}


def test_a_mooncake_trace_has_no_default_concurrency_its_timestamps_are_the_schedule() -> None:
    exp = experiment(f"load:\n  workload: {{kind: trace, path: {TRACES / 'sample-mooncake.jsonl'}}}\n"
                     "target: {max_model_len: 8192, kv_blocks: 4096}\n")
    load = exp.load
    assert load.concurrency is None and load.rate is None
    assert load.workload.path == str((TRACES / "sample-mooncake.jsonl").resolve())
    assert load.workload.context_tokens == 8192


def test_a_trace_path_is_relative_to_the_experiment_file(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": 10, "output_length": 4, "hash_ids": [1]}\n')
    exp = experiment("load:\n  workload: {kind: trace, path: t.jsonl}\n", where=tmp_path / "e.yaml")
    assert exp.load.workload.path == str(tmp_path / "t.jsonl")


@pytest.mark.parametrize(("load", "located", "fragment"), [
    ("load:\n  workload: {kind: sesions}\n", "w.yaml:3:", "did you mean 'sessions'"),
    ("load:\n  workload: {kind: sessions, prefixes: 3}\n", "w.yaml:3:", "only a workload of kind shared_prefix"),
    ("load:\n  workload: {kind: sessions, think_time: [3s, 1s]}\n", "w.yaml:3:", "0 <= low <= high"),
    ("load:\n  workload: {kind: sessions, on_cut: retry}\n", "w.yaml:3:", "resume, end"),
    ("load:\n  workload: {kind: trace}\n", "w.yaml:3:", "missing required key 'path'"),
    ("load:\n  workload: {kind: trace, path: nowhere.jsonl}\n", "w.yaml:3:", "trace file 'nowhere.jsonl' not found"),
    ("load:\n  workload: {kind: trace, path: x.jsonl, layout: sharegtp}\n", "w.yaml:3:", "did you mean 'sharegpt'"),
    ("load:\n  workload: {kind: shared_prefix}\n", "w.yaml:3:", "prefix_tokens"),
    ("load:\n  workload: {kind: shared_prefix, prefix_tokens: 8, prefix_chars: 9}\n", "w.yaml:3:", "at most one"),
    ("load:\n  tools: [{type: function, function: {name: f}}]\n", "w.yaml:3:", "set load.endpoint: chat"),
    ("load:\n  endpoint: chat\n  tool_choice: sometimes\n", "w.yaml:4:", "auto, required, none"),
    (f"load:\n  workload: {{kind: sessions}}\n  prompts: {{source: {TRACES / 'sample-mooncake.jsonl'}}}\n", "w.yaml:4:",
     "source: synthetic"),
])
def test_a_wrong_workload_is_a_located_error(load: str, located: str, fragment: str) -> None:
    found = problems(load)
    assert any(p.startswith(located) and fragment in p for p in found), found


def test_lengths_a_builtin_target_cannot_hold_are_refused_before_any_load() -> None:
    found = problems("load:\n  max_tokens: 300\n  workload: {kind: sessions, turns: [2, 8]}\n")
    assert any("w.yaml:4:" in p and "2400 tokens" in p and "max_model_len 1024" in p for p in found), found
    found = problems("load:\n  workload: {kind: shared_prefix, prefix_tokens: 1000}\n")
    assert any("w.yaml:3:" in p and "1032 tokens" in p for p in found), found
    # the sample trace's prompts run to 3K+ tokens: the default 1024 context cannot hold them
    found = problems(f"load:\n  workload: {{kind: trace, path: {TRACES / 'sample-mooncake.jsonl'}}}\n")
    assert any("w.yaml:3:" in p and "max_model_len 1024" in p and "request 1" in p for p in found), found


def test_prefix_tokens_need_a_tokenizer_the_target_has() -> None:
    found = problems("target: {kind: openai, url: 'http://127.0.0.1:9/v1'}\n"
                     "load:\n  workload: {kind: shared_prefix, prefix_tokens: 64}\n")
    assert any("w.yaml:4:" in p and "give prefix_chars instead" in p for p in found), found
    exp = experiment("target: {kind: openai, url: 'http://127.0.0.1:9/v1'}\n"
                     "load:\n  workload: {kind: shared_prefix, prefix_chars: 64}\n")
    assert exp.load.workload.tokenizer is None


def test_a_rate_beside_a_mooncake_trace_is_refused(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": 10, "output_length": 4, "hash_ids": [1]}\n')
    found = problems("load:\n  rate: 5\n  workload: {kind: trace, path: t.jsonl}\n", where=tmp_path / "e.yaml")
    assert any(":3:" in p and "timestamps are its schedule" in p for p in found), found


def test_a_trace_line_that_does_not_parse_names_both_files(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": 10, "output_length": 4, "hash_ids": [1]}\n'
                                      '{"timestamp": 5, "input_length": "ten"}\n')
    found = problems("load:\n  workload: {kind: trace, path: t.jsonl}\n", where=tmp_path / "e.yaml")
    assert any(p.startswith(f"{tmp_path / 'e.yaml'}:3:") and "t.jsonl:2" in p for p in found), found


@pytest.mark.parametrize(("raw", "turns", "text"), [
    ("2+", Turns((), 2), "2+"), (1, Turns((1,), None), "1"), ([1], Turns((1,), None), "1"),
    ([2, 3], Turns((2, 3), None), "2, 3"), ("2-4", Turns((2, 3, 4), None), "2, 3, 4"),
    ([1, "4+"], Turns((1,), 4), "1, 4+"),
])
def test_turns_selectors_parse(raw: object, turns: Turns, text: str) -> None:
    assert parse_turns(raw) == turns and turns.text() == text
    assert parse_turns([p.strip() for p in text.split(",")]) == turns  # as the evidence writes it back


def test_an_sla_entry_takes_turns_and_a_wrong_one_is_located() -> None:
    exp = experiment("load: {endpoint: chat, workload: {kind: sessions}}\n",
                     "sla:\n  - {kind: ttft, budget: 1s, turns: 2+}\n  - {kind: context_kept}\n")
    entries = exp.sla
    assert entries[0].turns == Turns((), 2) and entries[1].turns is None
    found = problems("load: {workload: {kind: sessions}}\n", "sla:\n  - {kind: ttft, budget: 1s, turns: 0+}\n")
    assert any("w.yaml:5:" in p and "count from 1" in p for p in found), found
