"""Order-statistic quantile bounds, sample-size arithmetic, and the rank test, against first principles."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from sla.stats import judge_quantile, quantile_bounds, rank_shift, samples_needed, samples_to_decide

pytestmark = pytest.mark.timeout(60)


def brute_force_ranks(n: int, q: float, alpha: float) -> tuple[int | None, int | None]:
    """The defining conditions, checked for every k: (largest k with P(B<=k-1)<=a, smallest k with P(B>=k)<=a)."""
    lower = [k for k in range(1, n + 1) if binom.cdf(k - 1, n, q) <= alpha]
    upper = [k for k in range(1, n + 1) if binom.sf(k - 1, n, q) <= alpha]
    return (max(lower) if lower else None, min(upper) if upper else None)


@pytest.mark.parametrize("n", [1, 5, 20, 59, 100, 367, 368, 500])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_bounds_use_the_order_statistics_the_binomial_defines(n: int, q: float) -> None:
    samples = list(range(1, n + 1))  # sample value k is the k-th order statistic
    bounds = quantile_bounds(samples, q, 0.95)
    expected_lower, expected_upper = brute_force_ranks(n, q, 0.025)
    assert bounds.lower_rank == expected_lower
    assert bounds.upper_rank == expected_upper
    assert bounds.lower == (float(expected_lower) if expected_lower else None)
    assert bounds.upper == (float(expected_upper) if expected_upper else None)


def test_samples_needed_is_computed_from_the_binomial() -> None:
    # p99 one-sided at 95%: 0.99^n <= 0.05 first at n = 299; two-sided (2.5% a side): 368
    assert samples_needed(0.99, 0.95, "upper", two_sided=False) == 299
    assert samples_needed(0.99, 0.95, "upper") == 368
    assert samples_needed(0.999, 0.95, "upper") == math.ceil(math.log(0.025) / math.log(0.999))
    assert samples_needed(0.5, 0.95, "upper") == 6  # 0.5^6 = 0.0156 <= 0.025 < 0.5^5
    assert samples_needed(0.99, 0.95, "lower") == 1
    # the bound exists exactly from there on
    assert quantile_bounds(range(367), 0.99).upper is None
    assert quantile_bounds(range(368), 0.99).upper is not None


def test_too_few_samples_are_never_a_lucky_pass() -> None:
    for n in (0, 1, 5, 50, 367):
        samples = [0.001] * n  # all far inside the budget
        status, _, _, upper, evidence = judge_quantile(samples, 0.99, budget=10.0)
        assert status == "inconclusive"
        assert upper is None
        assert evidence["samples_needed"] == 368
    assert judge_quantile([0.001] * 368, 0.99, budget=10.0)[0] == "pass"


def test_empty_sample_is_inconclusive_with_no_figure() -> None:
    status, figure, lower, upper, evidence = judge_quantile([], 0.5, budget=1.0)
    assert (status, figure, lower, upper) == ("inconclusive", None, None, None)
    assert evidence["reason"] == "no samples"


def test_clearly_over_budget_fails_even_with_few_samples() -> None:
    # the lower bound of p99 exists from one sample on; 50 samples all over budget decide a fail
    status, figure, lower, _, _ = judge_quantile([2.0] * 50, 0.99, budget=0.5)
    assert status == "fail"
    assert figure == 2.0
    assert lower == 2.0


def test_straddling_interval_is_inconclusive_and_projects_a_sample_size() -> None:
    rng = np.random.default_rng(3)
    samples = rng.exponential(size=200)
    true_p90 = math.log(10)
    status, _, lower, upper, evidence = judge_quantile(samples, 0.9, budget=true_p90)
    assert status == "inconclusive"
    assert lower is not None and upper is not None and lower <= true_p90 < upper
    assert evidence["samples_needed"] is None or evidence["samples_needed"] > 200


def test_projection_matches_the_bound_when_every_sample_is_inside() -> None:
    assert samples_to_decide(0.99, 0.95, 1.0) == 368
    assert samples_to_decide(0.9, 0.95, 0.9) is None  # the budget sits on the quantile: no n decides
    # a share a little above q needs more samples than one far above it
    near = samples_to_decide(0.9, 0.95, 0.92)
    far = samples_to_decide(0.9, 0.95, 0.99)
    assert near is not None and far is not None and near > far


def test_sample_quantile_is_the_figure() -> None:
    samples = [float(x) for x in range(1, 101)]
    _, figure, _, _, _ = judge_quantile(samples, 0.5, budget=1000.0)
    assert figure == pytest.approx(50.5)


def test_rank_shift_detects_a_later_distribution_and_only_in_one_direction() -> None:
    rng = np.random.default_rng(7)
    earlier = rng.exponential(0.1, size=40)
    later = rng.exponential(0.1, size=40) + 0.3
    assert rank_shift(later, earlier).significant
    assert not rank_shift(earlier, later).significant  # one-sided: faster is not a regression
    same = rank_shift(rng.exponential(0.1, size=40), rng.exponential(0.1, size=40))
    assert 0.0 <= same.p_value <= 1.0
    with pytest.raises(ValueError, match="at least one sample"):
        rank_shift([], [1.0])


def test_invalid_quantile_and_confidence_are_refused() -> None:
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        quantile_bounds([1.0], 1.0)
    with pytest.raises(ValueError, match="confidence"):
        quantile_bounds([1.0], 0.5, confidence=1.0)
