"""`streamchaos budgets` end to end: seeded healthy runs of a small experiment on the builtin stack,
budgets proposed from them and written into the experiment file, then a rerun that passes every
SLA that got a budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.api import run
from chaos.execution.budgets import load_baselines, propose, write_budgets
from chaos.experiment import load_experiment

# Budgets proposed from three runs, then judged on a fourth: the test compares runs minutes apart, so
# the box must not change under it. On the vLLM tier's worker (tests/conftest.py, ONE_WORKER) it never runs
# beside real vLLM, the suite's heaviest neighbour: two CI runs beside it read a rerun TTFT p50 of
# 10.8-11.5 ms against baselines of 8.0-8.8 ms, with lag-1 autocorrelation ~0.5 (647 samples worth
# 60), and the interval crossed the proposed budget: inconclusive.
pytestmark = pytest.mark.timeout(300)

EXPERIMENT = """\
# A short healthy run whose budgets are placeholders until `streamchaos budgets` fills them in.
name: budgets-baseline
seed: 1
target: {kind: builtin, model: tiny}
load:
  concurrency: 4
  max_tokens: 16
phases:
  - {name: steady, duration: 4s}
sla:
  - {kind: ttft, quantile: p50, budget: 10s}      # proposed from the runs
  - kind: itl
    quantile: p90
    budget: 10s
  - {kind: goodput, ttft: 2s, min_share: 10%}
  - {kind: fluidity, pace: 250ms, ttft: 2s}         # min_on_time defaults to 95%: a key is added
  - {kind: errors}                                 # a policy: left as it is
safety: {cleanup_window: 500ms, drain_timeout: 5s}
"""


def test_budgets_proposed_from_healthy_runs_pass_a_rerun(tmp_path: Path) -> None:
    path = tmp_path / "budgets-baseline.yaml"
    path.write_text(EXPERIMENT, encoding="utf-8")
    experiment = load_experiment(path)
    dirs = []
    for seed in (1, 2, 3):
        result = run(experiment, out_dir=tmp_path / f"base{seed}", seed=seed, handle_signals=False)
        assert result.exit_code == 0, [v for v in result.verdicts if not v.ok]
        dirs.append(tmp_path / f"base{seed}")

    runs = load_baselines(dirs)
    # 25% headroom, as a shared CI box needs (docs/slas.md): the rerun runs minutes after the baselines
    # beside other work. Without it CI run 7 read an ITL p90 of 7.9 ms against a proposed 8.3 ms
    # (the baselines' own figures had been lower), and the interval straddled it: inconclusive.
    proposals = propose(runs, false_fail=0.01, headroom=0.25)
    proposed = {p.name: p for p in proposals if p.text is not None}
    assert set(proposed) == {"ttft", "itl", "goodput", "fluidity"}, [(p.name, p.notes) for p in proposals]
    changed = write_budgets(path, proposals, runs)
    assert len(changed) == 4
    text = path.read_text(encoding="utf-8")
    assert "# proposed from the runs" in text and "min_on_time:" in text

    # the rerun twice as long as the baselines: its verdicts must be decided, not only right. A rerun
    # of the same 4 s beside the other worker's vLLM read a TTFT p50 of 11.5 ms against a proposed
    # 14.6 ms, but its 310 samples were worth 66 (lag-1 autocorrelation 0.49) and the interval's
    # upper end (15.9 ms) crossed the budget: inconclusive (a CI run)
    assert "duration: 4s" in text
    path.write_text(text.replace("duration: 4s", "duration: 8s"), encoding="utf-8")
    rerun = run(load_experiment(path), out_dir=tmp_path / "rerun", seed=4, handle_signals=False)
    verdicts = {v.name: v for v in rerun.verdicts}
    for name, p in proposed.items():
        v = verdicts[name]
        print(f"{name}: proposed {p.text} (runs {p.per_run}), rerun {v.status} figure {v.figure} n {v.samples}")
        assert v.status == "pass", (name, p.text, v.figure, v.evidence.get("reason"))
    # the budgets are real ones, not the 10 s placeholders (beside two busy processes the runs' 140
    # samples could not bound their pooled quantile and the proposal rose to 1.86 s, rightly: CI)
    assert proposed["ttft"].proposed is not None and proposed["ttft"].proposed < 5.0
    assert proposed["goodput"].proposed is not None and proposed["goodput"].proposed > 0.5
