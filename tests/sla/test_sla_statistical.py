"""The quantile verdicts agree with the truth on samples from known distributions, in 200 seeded trials.

A decisive verdict against the truth (pass while the true quantile is over the budget, fail while
it is within) may happen in at most 1 - confidence of the trials; with a clear margin the verdict
must also be decisive and right in at least the confidence share.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from sla.stats import judge_quantile

pytestmark = pytest.mark.timeout(120)

TRIALS = 200
CONFIDENCE = 0.95


def exp_quantile(q: float) -> float:
    return -math.log(1.0 - q)  # of Exp(1)


def run_trials(q: float, n: int, budget: float, draw: Callable[[np.random.Generator, int], np.ndarray]) -> Counter[str]:
    verdicts: Counter[str] = Counter()
    for seed in range(TRIALS):
        rng = np.random.default_rng(seed)
        verdicts[judge_quantile(draw(rng, n), q, budget, CONFIDENCE)[0]] += 1
    return verdicts


def exponential(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.exponential(size=n)


@pytest.mark.parametrize(
    ("q", "n", "margin"),
    [(0.5, 600, 0.3), (0.9, 1000, 0.3), (0.99, 2000, 0.35)],
)
def test_verdicts_agree_with_the_true_quantile(q: float, n: int, margin: float) -> None:
    truth = exp_quantile(q)
    over = run_trials(q, n, truth * (1 - margin), exponential)  # the true quantile is over this budget
    under = run_trials(q, n, truth * (1 + margin), exponential)  # and within this one
    assert over["pass"] <= (1 - CONFIDENCE) * TRIALS
    assert under["fail"] <= (1 - CONFIDENCE) * TRIALS
    # with this margin the verdict is decisive and right in at least the confidence share
    assert over["fail"] >= CONFIDENCE * TRIALS, over
    assert under["pass"] >= CONFIDENCE * TRIALS, under


@pytest.mark.parametrize(("q", "n"), [(0.5, 30), (0.9, 60), (0.99, 400)])
def test_near_the_truth_wrong_decisive_verdicts_stay_within_the_error_rate(q: float, n: int) -> None:
    # small samples and a budget 5% off the truth: mostly inconclusive, rarely wrong
    truth = exp_quantile(q)
    over = run_trials(q, n, truth * 0.95, exponential)
    under = run_trials(q, n, truth * 1.05, exponential)
    assert over["pass"] <= (1 - CONFIDENCE) / 2 * TRIALS + 4, over
    assert under["fail"] <= (1 - CONFIDENCE) / 2 * TRIALS + 4, under


@pytest.mark.parametrize(("q", "n"), [(0.5, 100), (0.9, 500), (0.99, 1000)])
def test_budget_exactly_at_the_true_quantile_is_rarely_decided(q: float, n: int) -> None:
    # Both decisive verdicts are unwarranted here; two-sided 95% bounds allow 2.5% each.
    verdicts = run_trials(q, n, exp_quantile(q), exponential)
    decisive = verdicts["pass"] + verdicts["fail"]
    assert decisive <= (1 - CONFIDENCE) * TRIALS + 6, verdicts  # 5% of 200 = 10, plus slack
    assert verdicts["fail"] <= (1 - CONFIDENCE) / 2 * TRIALS + 4, verdicts  # fail says "over": wrong here


def test_distribution_free_on_a_heavy_tail() -> None:
    # lognormal with sigma 1.5: median exp(0); the interval assumes nothing about the shape
    def lognormal(rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.lognormal(mean=0.0, sigma=1.5, size=n)

    over = run_trials(0.5, 600, 0.7, lognormal)
    under = run_trials(0.5, 600, 1.4, lognormal)
    assert over["pass"] == 0 and under["fail"] == 0
    assert over["fail"] >= CONFIDENCE * TRIALS and under["pass"] >= CONFIDENCE * TRIALS
