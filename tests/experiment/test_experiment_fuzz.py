"""Property: any YAML structure yields an Experiment or ExperimentInvalid, never another exception."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaos.experiment import Experiment, experiment_from_dict, parse_experiment
from chaos.model.errors import ExperimentInvalid, Problem

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
        assert result.text is not None and parse_experiment(result.text) == result  # the copy a run keeps for `verify`


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


# ---- through `streamchaos validate`, in process (issue 23.6 and the fuzz of 200 mutated experiments) ----

import io  # noqa: E402 - this part's own imports
import random  # noqa: E402
from pathlib import Path  # noqa: E402

from chaos.experiment import validate_command  # noqa: E402

_SHIPPED = sorted((Path(__file__).resolve().parents[2] / "experiments").glob("*.yaml"))


def _validate(path: Path) -> tuple[int, str]:
    out = io.StringIO()
    return validate_command([str(path)], out), out.getvalue()


@pytest.mark.parametrize("char", ["\x01", "\x07", "\x1b", "\x7f", "\ufffe"])
def test_a_control_character_is_a_located_error_not_a_traceback(tmp_path: Path, char: str) -> None:
    path = tmp_path / "ctl.yaml"
    path.write_text(f"name: x\nphases:\n  - name: p{char}\n    duration: 1s\n", encoding="utf-8")
    code, out = _validate(path)
    assert code == 2 and out.startswith(f"{path}:3:") and "is not allowed" in out, out


_WEIRD = [None, True, -1, 0, 10**40, 1e308, float("nan"), "", "\x00\x1b[31m", "1e999s", "5 parsecs", "-3s", "999999h",
          "150%", "10KB/s", [], {}, [1, [2, [3]]], {"<<": {"a": 1}}, "$x$", "app in (", "!!", "p99.9.9"]


def _mutate(doc: Any, rng: random.Random) -> Any:
    """One seeded mutation somewhere in ``doc``: delete, duplicate or retype a key, or replace a value."""
    if isinstance(doc, dict) and doc and rng.random() < 0.7:
        key = rng.choice(list(doc))
        roll = rng.random()
        if roll < 0.2:
            del doc[key]
        elif roll < 0.3:
            doc[f"{key}_copy" if rng.random() < 0.5 else key.upper()] = doc[key]
        elif roll < 0.5:
            doc[key] = rng.choice(_WEIRD)
        else:
            doc[key] = _mutate(doc[key], rng)
        return doc
    if isinstance(doc, list) and doc and rng.random() < 0.7:
        i = rng.randrange(len(doc))
        if rng.random() < 0.2:
            doc.append(doc[i])
        else:
            doc[i] = _mutate(doc[i], rng)
        return doc
    return rng.choice(_WEIRD)


@pytest.mark.parametrize("seed", range(200))
def test_a_mutated_shipped_experiment_validates_or_is_a_located_error(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    source = _SHIPPED[seed % len(_SHIPPED)]
    doc = yaml.safe_load(source.read_text(encoding="utf-8"))
    for _ in range(1 + rng.randrange(3)):
        doc = _mutate(doc, rng)
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True) if not isinstance(doc, str) else doc
    if rng.random() < 0.1:  # a raw control character where the dump put a quoted one
        cut = rng.randrange(len(text) + 1)
        text = text[:cut] + rng.choice("\x01\x08\x1b") + text[cut:]
    path = tmp_path / f"m{seed}.yaml"
    path.write_text(text, encoding="utf-8")
    code, out = _validate(path)  # any other exception fails the test with its traceback
    assert code in (0, 2), out
    if code == 2:
        assert out.startswith(str(path)) and "Traceback" not in out, out
