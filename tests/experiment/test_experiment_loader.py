"""The experiment loader on the tables of good and bad files, and on the typed model it builds."""

from __future__ import annotations

import pickle
from dataclasses import FrozenInstanceError
from pathlib import Path

import experiment_cases as cases
import pytest

from chaos.experiment import (
    Experiment,
    LoadSpec,
    experiment_from_dict,
    load_experiment,
    parse_experiment,
    validate_file,
)
from chaos.model.errors import ExperimentInvalid

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("case", cases.BAD_CASES, ids=lambda c: c.id)
def test_bad_file_reports_every_problem_with_location_and_key_path(case: cases.Bad) -> None:
    with pytest.raises(ExperimentInvalid) as info:
        parse_experiment(case.text, "bad.yaml")
    got = [(p.line, p.column, p.path) for p in info.value.problems]
    assert got == [e[:3] for e in case.expected]
    for problem, (_, _, _, fragment) in zip(info.value.problems, case.expected, strict=True):
        assert fragment in problem.message
        assert problem.file == "bad.yaml"
    assert info.value.exit_code == 2


def test_several_mistakes_come_back_in_file_order() -> None:
    with pytest.raises(ExperimentInvalid) as info:
        parse_experiment(cases.MANY.text)
    positions = [(p.line, p.column) for p in info.value.problems]
    assert len(positions) == 8
    assert positions == sorted(positions)


@pytest.mark.parametrize("case", cases.GOOD_CASES, ids=lambda c: c.id)
def test_good_file_parses(case: cases.Good) -> None:
    experiment = parse_experiment(case.text, "good.yaml")
    assert isinstance(experiment, Experiment)
    assert experiment.phases
    assert experiment.source == "good.yaml"


def test_minimal_file_gets_every_default() -> None:
    experiment = parse_experiment(cases.MINIMAL.text)
    assert experiment.name == "minimal"
    assert experiment.source is None
    assert experiment.load == LoadSpec()
    assert experiment.load.concurrency == 4 and experiment.load.rate is None
    assert not experiment.proxy.enabled
    assert experiment.target.kind == "builtin" and experiment.target.model == "tiny"
    assert experiment.duration == 1.0
    assert experiment.sla == ()


def test_full_file_parses_units_into_base_units() -> None:
    e = parse_experiment(cases.FULL.text)
    assert e.seed == 42 and e.description == "every section given"
    assert e.target.kind == "openai" and e.target.startup_timeout == 90.0
    assert e.target.extra_args == ("--foo", "bar")
    assert e.proxy.enabled and e.proxy.server == "embedded" and e.proxy.name == "sc-proxy"
    assert e.load.endpoint == "chat" and e.load.concurrency is None
    assert e.load.rate == pytest.approx(10.0)  # 600/m
    assert e.load.max_tokens == (8, 64) and e.load.request_timeout == 2.5
    assert e.load.lag_threshold == pytest.approx(0.01) and e.load.workers == 2
    assert e.load.prompts.mix == (("ascii", 0.5), ("cjk", 0.25), ("emoji", 0.25))
    assert [p.name for p in e.phases] == ["baseline", "jitter"]
    assert e.duration == pytest.approx(2.25)
    latency, latency2, hangups = e.phases[1].faults
    assert latency.name == "test.latency" and latency2.name == "test.latency-2" and hangups.name == "hangups"
    assert latency.params == {"latency": 0.1, "jitter": 0.02, "toxicity": pytest.approx(0.3)}
    assert hangups.params["after_tokens"] == (1, 8)
    assert [s.name for s in e.sla] == ["test.slo", "test.slo-2", "tail"]
    assert e.sla[0].phases is None and e.sla[1].phases == ("jitter",) and e.sla[1].expect == "fail"
    assert e.sla[2].params == {"quantile": 0.9, "budget": 1.0}
    assert e.safety.max_duration == 60.0 and e.safety.scrape_interval == pytest.approx(0.1)
    assert e.safety.allow_gpu_clock_changes is True


def test_anchors_and_merge_keys_share_fault_parameters() -> None:
    e = parse_experiment(cases.ANCHORS.text)
    assert e.proxy.enabled  # `proxy:` with no value still turns the proxy on
    first, second = (p.faults[0] for p in e.phases)
    assert first.params["latency"] == second.params["latency"] == 0.05
    assert second.params["jitter"] == 0.01 and first.params["jitter"] == 0.0
    assert {first.name, second.name} == {"test.latency", "test.latency-2"}


def test_experiment_is_immutable_and_picklable() -> None:
    e = parse_experiment(cases.FULL.text)
    with pytest.raises(FrozenInstanceError):
        e.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        e.sla[0].params["budget"] = 9  # type: ignore[index]
    clone = pickle.loads(pickle.dumps(e.sla))
    assert clone == e.sla


def test_from_dict_reports_key_paths_without_positions() -> None:
    with pytest.raises(ExperimentInvalid) as info:
        experiment_from_dict({"name": "x", "phases": [{"name": "a", "duration": "1s",
                                                       "faults": [{"kind": "test.hangup"}]}]})
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.column) == ("<dict>", 0, 0)
    assert problem.path == "phases[0].faults[0]"
    assert "give exactly one of after_tokens, after (found: none)" in problem.message


def test_from_dict_rejects_non_string_keys() -> None:
    with pytest.raises(ExperimentInvalid) as info:
        experiment_from_dict({"name": "x", "phases": [{"name": "a", "duration": "1s"}],
                              3: "x"})  # type: ignore[dict-item]
    assert [p.message for p in info.value.problems] == ["keys must be names (strings), found 3"]


def test_prompt_file_is_resolved_relative_to_the_experiment(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "prompts.jsonl").write_text('{"prompt": "hello"}\n', encoding="utf-8")
    path = tmp_path / "exp.yaml"
    path.write_text(
        "name: x\nload:\n  prompts:\n    source: data/prompts.jsonl\nphases: [{name: a, duration: 1s}]\n",
        encoding="utf-8",
    )
    e = load_experiment(path)
    assert e.load.prompts.source == str((tmp_path / "data" / "prompts.jsonl").resolve())
    assert e.source == str(path)
    missing = tmp_path / "missing.yaml"
    missing.write_text(path.read_text().replace("data/prompts.jsonl", "data/nope.jsonl"), encoding="utf-8")
    (problem,) = validate_file(missing)
    assert (problem.line, problem.column, problem.path) == (4, 13, "load.prompts.source")
    assert "'data/nope.jsonl' not found" in problem.message


def test_unreadable_files_are_problems_not_tracebacks(tmp_path: Path) -> None:
    (problem,) = validate_file(tmp_path / "absent.yaml")
    assert problem.file == str(tmp_path / "absent.yaml") and "cannot read" in problem.message
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"name: \xff\xfe\n")
    (problem,) = validate_file(binary)
    assert "not UTF-8" in problem.message
    (problem,) = validate_file(tmp_path)  # a directory
    assert "cannot read" in problem.message


@pytest.mark.parametrize(
    ("text", "where", "fragment"),
    [
        ("name: !!int abc\nphases: [{name: a, duration: 1s}]\n", (1, 7, "name"), "cannot read 'abc' as int"),
        ("name: !custom x\nphases: [{name: a, duration: 1s}]\n", (1, 7, "name"), "could not determine a constructor"),
        ("name: x\nphases: &p [{name: a, duration: 1s, faults: *p}]\n", (2, 9, "phases[0].faults"), "(a cycle)"),
        ("name: x\n[a]: b\nphases: [{name: a, duration: 1s}]\n", (2, 1, ""), "a key must be a plain name"),
        ("name: x\nphases: [{name: a, duration: 1s}]\n---\nname: y\n", (3, 1, ""), "expected a single document"),
    ],
    ids=["bad-int-tag", "unknown-tag", "alias-cycle", "list-as-key", "two-documents"],
)
def test_yaml_structure_mistakes_are_located(text: str, where: tuple[int, int, str], fragment: str) -> None:
    with pytest.raises(ExperimentInvalid) as info:
        parse_experiment(text)
    (problem,) = info.value.problems
    assert (problem.line, problem.column, problem.path) == where
    assert fragment in problem.message
