"""One home per SLA kind: every fact the rest of streamchaos reads about a kind is declared on its spec
(``sla/base.py``: ``FACTS`` and the abstract methods), ``@verifier`` refuses a kind that leaves one
out, a kind written in one test-local class is judged, listed, loaded, proposed a budget, drawn and
probed with no other module touched, and TTFT is one sample for the verifier, the budget proposer and
the report's CDF."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import pytest

import sla
from chaos.model.context import HaltSpec
from chaos.model.observations import NS, ErrorInfo, Observations, StreamRecord
from chaos.model.params import Param, Schema
from sla.base import FACTS, REGISTRY, BudgetRule, Need, SlaSpec, Verdict, missing_facts, verifier
from sla.common import CONFIDENCE, QuantileParam
from sla.stats import judge_quantile, sample_quantile

pytestmark = pytest.mark.timeout(120)

# a parsed value of each parameter kind, for specs built without a YAML file
_SAMPLE_VALUE: dict[str, Any] = {"duration": 1.0, "fraction": 0.5, "rate": 1.0, "float": 1.0, "int": 1,
                                 "str": None, "quantile": 0.9, "bool": False}


def a_spec(cls: type[SlaSpec]) -> SlaSpec:
    """A spec of ``cls`` with every parameter at its default, else a plain value of its kind; of each
    exactly-one-of group only the first given."""
    values = {p.name: p.default if p.default is not None else _SAMPLE_VALUE[p.kind] for p in cls.schema.params}
    for group in cls.schema.one_of + cls.schema.at_most_one_of:
        for name in group[1:]:
            values[name] = None
    return cls.from_params(values)


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_every_kind_declares_each_fact(kind: str, synth: Any) -> None:
    cls = REGISTRY[kind]
    assert missing_facts(cls) == [] and all(hasattr(cls, name) for name in FACTS)
    assert isinstance(cls.timing, bool) and isinstance(cls.capacity_fit, bool)
    assert cls.better in ("lower", "higher")
    assert isinstance(cls.needs, tuple) and set(cls.needs) <= set(get_args(Need))
    assert cls.sample_label is None or (isinstance(cls.sample_label, str) and cls.sample_label)
    spec = a_spec(cls)
    rule = spec.budget_rule()
    assert isinstance(rule, BudgetRule) and rule.method in ("quantile", "share", "floor", "policy")
    assert (rule.key is None and rule.why) if rule.method == "policy" else (rule.key in spec.params and rule.unit)
    if rule.method == "quantile":  # what sla.budgets reads of a quantile kind
        assert {"quantile", "confidence"} <= set(spec.params)
    halt = spec.probe_halt(9.0, 3.0, 20)
    assert halt is None or (isinstance(halt, HaltSpec) and halt.window == 9.0 and halt.min_streams == 20)
    obs = synth.obs([synth.stream(f"r{i}", sent=i * 0.1) for i in range(30)], phases=[synth.phase("load", 0, 5)])
    values = spec.samples(obs, "load")
    assert values is None or all(isinstance(v, float) for v in values)
    if cls.sample_label is not None:  # the report draws them: they must be there to draw
        assert values, kind
    if rule.method in ("quantile", "share"):  # the proposer reads them
        assert values is not None, kind


def _partial(**facts: Any) -> type[SlaSpec]:
    @dataclass(frozen=True, kw_only=True)
    class Partial(SlaSpec):
        kind = "test_partial"
        summary = "test-only"
        schema = Schema(())

        def judge(self, obs: Observations, phase: str | None) -> Verdict:
            raise AssertionError("never judged")

    for name, value in facts.items():
        setattr(Partial, name, value)
    return Partial


def test_a_kind_that_forgets_a_fact_is_refused_at_registration() -> None:
    with pytest.raises(AssertionError, match=r"'test_partial' does not declare timing, better, capacity_fit, needs, "
                                             r"sample_label, budget_rule, probe_halt, samples"):
        verifier(_partial())
    with pytest.raises(AssertionError, match=r"does not declare capacity_fit,"):
        verifier(_partial(timing=True, better="lower", needs=(), sample_label=None))
    assert "test_partial" not in REGISTRY


# -- a throwaway kind: one class and @verifier, nothing else ------------------------------------------


@dataclass(frozen=True, kw_only=True)
class E2e(SlaSpec):
    """The whole class a newcomer writes; ``@verifier`` is applied by the fixture below, not at import,
    so that no other test sees the kind."""

    kind = "test_e2e"
    summary = "test-only: a quantile of end-to-end time, from sent to the last content, against a budget"
    schema = Schema((QuantileParam("quantile", default=0.5, doc="which quantile"),
                     Param("budget", "duration", required=True, doc="the most the quantile may be"), CONFIDENCE))
    timing = True
    better = "lower"
    capacity_fit = True
    needs = ()
    sample_label = "end-to-end time"

    quantile: float
    budget: float
    confidence: float

    def samples(self, obs: Observations, phase: str | None) -> list[float]:
        streams = sorted(obs.population(phase), key=lambda st: st.t_sent or 0)
        return [(st.t_content[-1] - st.t_sent) / NS for st in streams if st.t_content and st.t_sent is not None]

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        values = self.samples(obs, phase)
        status, figure, _, _, evidence = judge_quantile(values, self.quantile, self.budget, self.confidence)
        return Verdict(self.kind, phase, status, figure, self.budget, "s", len(values), evidence)

    def budget_rule(self) -> BudgetRule:
        return BudgetRule("quantile", "budget", "s")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return None


@pytest.fixture
def e2e_kind() -> Iterator[type[SlaSpec]]:
    cls = verifier(E2e)
    try:
        yield cls
    finally:
        del REGISTRY[cls.kind]  # unregistered: no other test sees it


EXPERIMENT = """\
name: throwaway
phases:
  - {name: steady, duration: 10s}
sla:
  - {kind: test_e2e, name: e2e, quantile: p50, budget: 500ms}
capacity: {max: 8}
"""


def _run(synth: Any, seed: int, n: int = 200) -> Observations:
    import numpy as np

    rng = np.random.default_rng(seed)
    streams = [synth.stream(f"r{i}", phase="steady", sent=i * 0.05, ttft=0.05, itl=float(rng.uniform(0.01, 0.02)))
               for i in range(n)]
    return synth.obs(streams, phases=[synth.phase("steady", 0.0, n * 0.05 + 1)])


def test_a_throwaway_kind_is_judged_listed_loaded_proposed_drawn_and_probed(
        e2e_kind: type[SlaSpec], synth: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from chaos.capacity.probes import judged_entries, probe_halts
    from chaos.cli import main
    from chaos.execution.budgets import Baseline, propose
    from chaos.execution.verify import judge_entry
    from chaos.experiment import parse_experiment
    from chaos.output.reports.compare import higher_is_better
    from chaos.output.reports.distributions import render_distributions
    from chaos.output.support import render_markdown

    obs = _run(synth, 0)
    assert sla.judge(obs, "test_e2e", {"budget": "500ms"}, "steady").status == "pass"  # ~0.2 s
    assert sla.judge(obs, "test_e2e", {"budget": "100ms"}, "steady").status == "fail"

    assert main(["list", "slas"]) == 0
    assert "test_e2e" in capsys.readouterr().out

    experiment = parse_experiment(EXPERIMENT, "throwaway.yaml")
    (entry,) = experiment.sla
    assert isinstance(entry.spec, e2e_kind) and entry.params["budget"] == 0.5
    assert judge_entry(entry, obs, "steady").status == "pass"

    runs = [Baseline(tmp_path / f"run{s}", experiment, _run(synth, s)) for s in range(2)]
    (proposal,) = propose(runs)
    assert proposal.key == "budget" and proposal.proposed is not None and 0.1 < proposal.proposed < 0.5, proposal

    verdict = entry.spec.judge(obs, "steady")
    report = {"phases": [{"name": "steady"}], "verdicts": [verdict.to_dict() | {"name": "e2e"}],
              "sla": [{"name": "e2e", "kind": "test_e2e", "params": entry.spec.params}]}
    page = render_distributions(report, obs)
    assert 'data-plot="cdf-e2e"' in page and "end-to-end time (ms)" in page

    assert experiment.capacity is not None and judged_entries(experiment, experiment.capacity) == (entry,)
    assert probe_halts(experiment.sla, experiment.capacity, 9.0) == ()
    assert not higher_is_better("test_e2e")
    assert "| `test_e2e` | yes |" in render_markdown([], ["test_e2e"])


# -- one TTFT sample ------------------------------------------------------------------------------------


def _censored(synth: Any, id: str, sent: float, waited: float) -> StreamRecord:
    """A stream that waited ``waited`` seconds for content and timed out: its TTFT exceeds the wait."""
    stream = synth.stream(id, phase="steady", sent=sent, ttft=None, error=ErrorInfo("timeout", "read timed out"))
    stream.t_end = synth.ns(sent + waited)
    return stream


def test_the_verifier_the_budget_proposer_and_the_report_read_one_ttft_sample(synth: Any, tmp_path: Path) -> None:
    from chaos.execution.budgets import Baseline, propose
    from chaos.experiment import parse_experiment
    from chaos.output.reports.distributions import render_distributions
    from sla.ttft import judged_in_send_order, ttft_samples

    streams = [synth.stream(f"r{i}", phase="steady", sent=i * 0.05, ttft=0.05 + 0.001 * (i % 7)) for i in range(60)]
    streams += [_censored(synth, "late1", 1.0, 0.9), _censored(synth, "late2", 1.5, 1.2),  # past the budget
                _censored(synth, "early", 2.0, 0.01)]  # cut before the budget: its TTFT is unknown
    obs = synth.obs(streams, phases=[synth.phase("steady", 0.0, 4.0)])
    experiment = parse_experiment("name: one\nphases: [{name: steady, duration: 4s}]\n"
                                  "sla: [{kind: ttft, quantile: p50, budget: 200ms}]\n", "one.yaml")
    spec = experiment.sla[0].spec
    values = spec.samples(obs, "steady")
    assert values is not None and len(values) == 62

    # the data tells the three readings apart: the report's old sample (content only) and the proposer's
    # old one (every censored wait) each differ from what the verdict judges
    population = obs.population("steady")
    assert len(ttft_samples(population)[0]) == 60 and len(judged_in_send_order(population, 0.0)) == 63

    verdict = spec.judge(obs, "steady")
    assert verdict.samples == len(values) and verdict.figure == sample_quantile(values, 0.5)

    (proposal,) = propose([Baseline(tmp_path, experiment, obs)])
    assert proposal.samples_per_run == len(values)

    report = {"phases": [{"name": "steady"}], "verdicts": [verdict.to_dict()],
              "sla": [{"name": "ttft", "kind": "ttft", "params": spec.params}]}
    drawn = re.findall(r"steady \(n=(\d+)\)", render_distributions(report, obs))
    assert drawn and {int(n) for n in drawn} == {len(values)}, drawn
