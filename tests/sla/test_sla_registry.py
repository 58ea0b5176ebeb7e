"""The verifier registry as the experiment loader and reports see it: complete, typed, light to import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sla
from chaos.model.errors import ExperimentInvalid
from chaos.model.observations import Observations

pytestmark = pytest.mark.timeout(60)

KINDS = {"ttft", "itl", "early_close", "kv_cleanup", "abort_propagation", "errors", "integrity", "throughput",
         "recovery", "goodput", "fluidity", "streaming", "capacity", "relay", "abort_path", "context_kept",
         "tool_calls"}
ROOT = Path(__file__).resolve().parents[2]


def test_import_registers_every_verifier() -> None:
    assert set(sla.REGISTRY) == KINDS
    for kind, spec in sla.REGISTRY.items():
        assert spec.kind == kind
        assert spec.summary
        assert all(p.doc for p in spec.schema.params), kind  # `streamchaos list slas` shows each one


def test_importing_sla_starts_nothing_heavy() -> None:
    # sla is judged offline (`streamchaos verify`): it must not pull in the engine, the server or the runner
    code = (
        "import sys, sla; heavy = ['torch', 'starlette', 'uvicorn', 'httpx', 'chaos.stack', 'chaos.load', 'faults'];"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m in heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("kind", "params", "unit"),
    [
        ("ttft", {"budget": "1s"}, "s"),
        ("itl", {"budget": "1s"}, "s"),
        ("early_close", {}, "fraction"),
        ("errors", {}, "fraction"),
        ("integrity", {}, "count"),
        ("throughput", {"min_tokens_per_s": 1}, "tokens/s"),
        ("throughput", {"min_requests_per_s": 1}, "requests/s"),
        ("kv_cleanup", {}, "s"),
        ("abort_propagation", {}, "s"),
        ("recovery", {}, "ratio"),
        ("goodput", {"ttft": "1s", "min_share": "90%"}, "fraction"),
        ("goodput", {"min_rate": "1/s"}, "requests/s"),
        ("fluidity", {"pace": "50ms"}, "fraction"),
    ],
)
def test_empty_observations_are_inconclusive_with_the_kinds_unit(kind: str, params: dict[str, Any], unit: str) -> None:
    verdict = sla.judge(Observations(), kind, params)
    assert verdict.status == "inconclusive"
    assert verdict.unit == unit
    assert verdict.sla == kind
    json.dumps(verdict.to_dict(), allow_nan=False)  # report.json stays strict JSON
    assert sla.Verdict.from_dict(json.loads(json.dumps(verdict.to_dict()))) == verdict


def test_judge_parses_raw_params_or_takes_parsed_ones(synth: Any) -> None:
    obs = synth.obs([synth.stream(f"r{i}", ttft=0.3) for i in range(30)])
    assert sla.judge(obs, "ttft", {"quantile": "p50", "budget": "250ms"}).status == "fail"
    parsed = {"quantile": 0.5, "budget": 0.5, "confidence": 0.95}
    assert sla.judge(obs, "ttft", parsed, parsed=True).status == "pass"


def test_unknown_kind_and_bad_params_are_experiment_errors() -> None:
    with pytest.raises(ExperimentInvalid, match=r"unknown SLA kind 'tfft' \(did you mean 'ttft'\?\)"):
        sla.judge(Observations(), "tfft", {})
    with pytest.raises(ExperimentInvalid, match="missing required key 'budget'"):
        sla.judge(Observations(), "ttft", {})
    with pytest.raises(ExperimentInvalid, match="budget.*unit"):
        sla.judge(Observations(), "ttft", {"budget": 5})  # bare 5: seconds or milliseconds?
    with pytest.raises(ExperimentInvalid, match="did you mean 'max_stall'"):
        sla.judge(Observations(), "itl", {"budget": "1s", "max_stal": "1s"})


def test_quantile_param_shows_its_unit_in_the_catalogue() -> None:
    quantile = next(p for p in sla.REGISTRY["ttft"].schema.params if p.name == "quantile")
    assert quantile.unit == "quantile, e.g. 0.99 or p99"
    assert quantile.default == 0.99


def test_each_verifier_is_a_frozen_spec_whose_fields_are_its_schema() -> None:
    from dataclasses import FrozenInstanceError, fields

    for kind, cls in sla.REGISTRY.items():
        assert sorted(f.name for f in fields(cls)) == sorted(cls.schema.names()), kind
        values, problems = cls.schema.parse({})
        if not problems:  # a kind with every parameter defaulted: its spec from the defaults alone
            spec = sla.spec_for(kind, {}, parsed=False)
            assert spec.params == values, kind
            with pytest.raises(FrozenInstanceError):
                setattr(spec, cls.schema.params[0].name, None)


def test_a_verifier_whose_fields_and_schema_disagree_is_refused_at_registration() -> None:
    from dataclasses import dataclass

    from chaos.model.params import Param, Schema
    from sla.base import SlaSpec, Verdict, verifier

    @dataclass(frozen=True, kw_only=True)
    class Drifted(SlaSpec):
        kind = "test.drifted"
        summary = "test-only"
        schema = Schema((Param("budget", "duration", required=True, doc="the most it may be"),))

        budjet: float  # a typo: what users write (budget) would never reach the verifier

        def judge(self, obs: Observations, phase: str | None) -> Verdict:
            raise AssertionError("never judged")

    with pytest.raises(AssertionError, match="not its schema's parameters"):
        verifier(Drifted)
    assert "test.drifted" not in sla.REGISTRY


def test_a_spec_parses_raw_values_and_names_the_wrong_key() -> None:
    from sla.ttft import Ttft

    assert Ttft.parse({"budget": "500ms", "quantile": "p90"}) == Ttft(quantile=0.9, budget=0.5, confidence=0.95)
    with pytest.raises(ExperimentInvalid, match=r"sla ttft\.budgte: unknown key \(did you mean 'budget'\?\)"):
        Ttft.parse({"budgte": "500ms"})
