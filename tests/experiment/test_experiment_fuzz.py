"""Property: any YAML structure yields an Experiment or ExperimentInvalid, never another exception."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaos.errors import ExperimentInvalid, Problem
from chaos.experiment import Experiment, experiment_from_dict, parse_experiment

pytestmark = pytest.mark.timeout(120)

_KEYS = [
    "name", "description", "seed", "target", "proxy", "load", "phases", "sla", "safety", "kind", "duration",
    "faults", "url", "concurrency", "rate", "max_tokens", "prompts", "mix", "ascii", "cjk", "min_chars",
    "max_chars", "expect", "budget", "quantile", "latency", "jitter", "after", "after_tokens", "fraction",
    "scrape_interval", "max_duration", "enabled", "server", "<<", "phase",
]
_KINDS = ["test.latency", "test.hangup", "test.slo", "ttft", "kv_cleanup", "early_close", "client.disconnect",
          "network.latency", "nope", "builtin", "openai"]
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-10**6, max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["250ms", "1s", "2m", "-1s", "20/s", "30%", "150%", "p99", "", "a", "[1, 8]", "0", "1e999s",
                     "10KB/s", "64KiB", "pass", "fail", "synthetic", "http://127.0.0.1:1/v1", *_KINDS]),
    st.text(max_size=8),
)
_KEY = st.one_of(st.sampled_from(_KEYS), st.text(max_size=6))


def _tree(depth: int = 4) -> st.SearchStrategy[Any]:
    return st.recursive(
        _SCALARS,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(_KEY, inner, max_size=5),
        ),
        max_leaves=24,
    )


def _mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any] = _SCALARS) -> st.SearchStrategy[Any]:
    """Usually a valid value, sometimes anything: both branches of the loader get exercised."""
    return st.one_of(good, good, good, bad)


# Documents that are nearly experiments reach the deep checks (and the valid branch) far more often.
_FAULT = st.one_of(
    st.fixed_dictionaries({"kind": _mostly(st.just("test.hangup"), st.sampled_from(_KINDS))}, optional={
        "after": _mostly(st.sampled_from(["1s", "20ms"])), "fraction": _mostly(st.sampled_from(["50%", 0.1])),
        "name": _mostly(st.sampled_from(["h", "g"])), "after_tokens": _SCALARS, "latency": _SCALARS}),
    st.dictionaries(_KEY, _SCALARS, max_size=4),
)
_PHASE = st.fixed_dictionaries(
    {"name": _mostly(st.sampled_from(["a", "b", "a"])), "duration": _mostly(st.sampled_from(["1s", "250ms"]))},
    optional={"faults": st.lists(_FAULT, max_size=3)},
)
_SLA = st.fixed_dictionaries({"kind": _mostly(st.just("test.slo"), st.sampled_from(_KINDS))}, optional={
    "budget": _mostly(st.sampled_from(["1s", "5ms"])), "phases": _mostly(st.sampled_from(["a", ["a", "b"]]), _tree()),
    "expect": _mostly(st.sampled_from(["pass", "fail"])), "quantile": _SCALARS})
_NEAR = st.fixed_dictionaries(
    {"name": _mostly(st.just("fuzz")), "phases": st.lists(_PHASE, min_size=1, max_size=3)},
    optional={
        "sla": st.lists(_SLA, max_size=3),
        "load": st.dictionaries(_KEY, _tree(), max_size=4),
        "target": st.dictionaries(_KEY, _SCALARS, max_size=4),
        "proxy": _tree(),
        "safety": st.dictionaries(_KEY, _SCALARS, max_size=3),
        "seed": _mostly(st.integers(0, 100)),
    },
)
_DOCS = st.one_of(_tree(), _NEAR, st.dictionaries(_KEY, _tree(), max_size=6))


def _check(problems: list[Problem]) -> None:
    assert problems, "ExperimentInvalid must carry at least one problem"
    for p in problems:
        assert isinstance(p, Problem) and p.message
        assert str(p)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_DOCS)
def test_any_yaml_document_is_an_experiment_or_invalid(doc: Any) -> None:
    text = yaml.safe_dump(doc, allow_unicode=True)
    try:
        result = parse_experiment(text, "fuzz.yaml")
    except ExperimentInvalid as exc:
        _check(exc.problems)
        assert all(p.file == "fuzz.yaml" for p in exc.problems)
    else:
        assert isinstance(result, Experiment) and result.phases


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_NEAR)
def test_any_near_experiment_dict_is_an_experiment_or_invalid(doc: dict[str, Any]) -> None:
    try:
        result = experiment_from_dict(doc)
    except ExperimentInvalid as exc:
        _check(exc.problems)
    else:
        assert isinstance(result, Experiment)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("name: phases-[]{}&*!<>|'\"#\n\t ,?:1s%")), max_size=80))
def test_any_text_is_an_experiment_or_invalid(text: str) -> None:
    try:
        parse_experiment(text)
    except ExperimentInvalid as exc:
        _check(exc.problems)


def _param_names() -> list[str]:
    from faults.base import REGISTRY as FAULTS
    from sla.base import REGISTRY as VERIFIERS

    names = {p.name for cls in FAULTS.values() for p in cls.schema.params}
    names |= {p.name for spec in VERIFIERS.values() for p in spec.schema.params}
    return sorted(names)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_registered_kind_survives_arbitrary_parameters(data: st.DataObject) -> None:
    # Each registered kind (real ones included, as they land) gets random values for real parameter
    # names; its schema and its cross-section `problems` must answer with problems, not exceptions.
    from faults.base import REGISTRY as FAULTS
    from sla.base import REGISTRY as VERIFIERS

    params = st.dictionaries(st.sampled_from(_param_names()), st.one_of(_SCALARS, _tree()), max_size=4)
    fault = {**data.draw(params), "kind": data.draw(st.sampled_from(sorted(FAULTS)))}
    check = {**data.draw(params), "kind": data.draw(st.sampled_from(sorted(VERIFIERS)))}
    doc: dict[str, Any] = {"name": "x", "phases": [{"name": "a", "duration": "1s", "faults": [fault]}], "sla": [check]}
    if data.draw(st.booleans()):
        doc["proxy"] = {}
    try:
        experiment_from_dict(doc)
    except ExperimentInvalid as exc:
        _check(exc.problems)
