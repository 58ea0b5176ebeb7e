"""Distribution-free statistics for verdicts: quantile confidence bounds and a rank test.

Quantile budgets are judged from order statistics. For n independent samples of a continuous
distribution with q-quantile ξ, the number of samples below ξ is Binomial(n, q), so

    P(X_(k) >= ξ) = P(B <= k - 1)        and        P(X_(k) <= ξ) = P(B >= k).

The upper bound is the smallest order statistic that lies above ξ with probability at least
1 - α, the lower bound the largest that lies below it with probability at least 1 - α. Nothing
is assumed about the distribution; the price is that a bound only exists once n is large enough
(q^n <= α for the upper one), which is why a p99 budget on 50 samples is inconclusive.

A ``pass`` needs the upper bound within the budget, a ``fail`` needs the lower bound over it.
With a two-sided interval at confidence c (α = (1 - c) / 2 on each side), a decisive verdict
is wrong with probability at most α whatever the truth, and at most 1 - c even when the budget
sits exactly on the true quantile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from scipy import stats as _scipy_stats

__all__ = [
    "QuantileBounds",
    "RankShift",
    "judge_quantile",
    "quantile_bounds",
    "rank_shift",
    "sample_quantile",
    "samples_needed",
    "samples_to_decide",
]

Status = Literal["pass", "fail", "inconclusive"]
Samples = Sequence[float] | npt.NDArray[np.floating[Any]]
Side = Literal["upper", "lower"]

_binom = _scipy_stats.binom
# The binomial search caps here: a budget that needs more samples than this is reported as such.
_MAX_N = 10**9


def _alpha(confidence: float, two_sided: bool) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, found {confidence!r}")
    miss = 1.0 - confidence
    return miss / 2.0 if two_sided else miss


def _check_q(q: float) -> None:
    if not 0.0 < q < 1.0:
        raise ValueError(f"a quantile must lie strictly between 0 and 1 (0.99 for p99), found {q!r}")


def _upper_index(n: int, q: float, alpha: float) -> int | None:
    """Smallest 1-based k with P(B >= k) <= alpha, B ~ Bin(n, q); None when even k = n fails."""
    if n <= 0 or q**n > alpha:
        return None
    k = int(_binom.ppf(1.0 - alpha, n, q)) + 1  # a guess; fixed up exactly below
    k = min(max(k, 1), n)
    while k > 1 and _binom.sf(k - 2, n, q) <= alpha:
        k -= 1
    while _binom.sf(k - 1, n, q) > alpha:
        k += 1
    return k


def _lower_index(n: int, q: float, alpha: float) -> int | None:
    """Largest 1-based k with P(B <= k - 1) <= alpha; None when even k = 1 fails."""
    if n <= 0 or (1.0 - q) ** n > alpha:
        return None
    k = int(_binom.ppf(alpha, n, q))
    k = min(max(k, 1), n)
    while k < n and _binom.cdf(k, n, q) <= alpha:
        k += 1
    while k > 1 and _binom.cdf(k - 1, n, q) > alpha:
        k -= 1
    return k


def samples_needed(q: float, confidence: float = 0.95, side: Side = "upper", *, two_sided: bool = True) -> int:
    """The smallest n for which the ``side`` bound of the q-quantile exists at this confidence.

    ``samples_needed(0.99, 0.95, "upper", two_sided=False)`` is 299: q^n <= 0.05 first holds there.
    """
    _check_q(q)
    alpha = _alpha(confidence, two_sided)
    p = q if side == "upper" else 1.0 - q  # the bound exists once p^n <= alpha
    n = max(1, math.ceil(math.log(alpha) / math.log(p)))
    while p ** (n - 1) <= alpha and n > 1:  # guard against rounding in the logarithms
        n -= 1
    while p**n > alpha:
        n += 1
    return n


@dataclass(frozen=True)
class QuantileBounds:
    """A distribution-free confidence interval for one quantile; a missing side is None."""

    n: int
    q: float
    confidence: float
    lower: float | None
    upper: float | None
    lower_rank: int | None  # 1-based order statistic used for the lower bound
    upper_rank: int | None


def quantile_bounds(samples: Samples, q: float, confidence: float = 0.95, *, two_sided: bool = True) -> QuantileBounds:
    """Order-statistic bounds for the q-quantile of the distribution ``samples`` came from."""
    _check_q(q)
    alpha = _alpha(confidence, two_sided)
    ordered = np.sort(np.asarray(samples, dtype=float))
    n = int(ordered.size)
    lo = _lower_index(n, q, alpha)
    hi = _upper_index(n, q, alpha)
    return QuantileBounds(
        n=n,
        q=q,
        confidence=confidence,
        lower=float(ordered[lo - 1]) if lo is not None else None,
        upper=float(ordered[hi - 1]) if hi is not None else None,
        lower_rank=lo,
        upper_rank=hi,
    )


def sample_quantile(samples: Samples, q: float) -> float | None:
    """The sample q-quantile (linear interpolation, numpy's default); None for no samples."""
    if len(samples) == 0:
        return None
    return float(np.quantile(np.asarray(samples, dtype=float), q))


def samples_to_decide(q: float, confidence: float, share_within: float, *, two_sided: bool = True) -> int | None:
    """Projected n that would decide a budget, if the share of samples within it stays the same.

    ``share_within`` is the empirical share of samples at or below the budget. Returns None when
    no sample size can decide (the share equals q) or the projection exceeds ``_MAX_N``.
    """
    _check_q(q)
    alpha = _alpha(confidence, two_sided)
    if share_within == q:
        return None

    heading_for_pass = share_within > q

    def decides(n: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
        within = n * share_within  # expected count at or below the budget (not rounded: no bias)
        if heading_for_pass:
            # X_(k) <= budget iff at least k samples are within: some k <= within has P(B >= k) <= alpha
            k = np.floor(within)
            return np.asarray((k >= 1) & (_binom.sf(k - 1, n, q) <= alpha), dtype=bool)
        # X_(k) > budget iff fewer than k are within: some k - 1 >= within has P(B <= k - 1) <= alpha
        return np.asarray(_binom.cdf(np.ceil(within), n, q) <= alpha, dtype=bool)

    powers = 2 ** np.arange(0, int(math.log2(_MAX_N)) + 1, dtype=np.int64)
    ok = decides(powers.astype(float))
    if not ok.any():
        return None
    hi = int(powers[int(np.argmax(ok))])
    lo = hi // 2
    while lo + 1 < hi:  # the condition is monotone up to rounding; this is an estimate
        mid = (lo + hi) // 2
        if decides(np.array([float(mid)]))[0]:
            hi = mid
        else:
            lo = mid
    return hi


def judge_quantile(
    samples: Samples, q: float, budget: float, confidence: float = 0.95
) -> tuple[Status, float | None, float | None, float | None, dict[str, Any]]:
    """Judge "the q-quantile is within ``budget``": (status, figure, lower, upper, evidence).

    ``pass`` only when the upper confidence bound is within the budget, ``fail`` only when the
    lower bound is over it; otherwise ``inconclusive``, and the evidence says how many samples
    would decide: ``bound_needs`` is where the missing bound starts to exist at all (p99 at 95%
    two-sided: 368), ``samples_needed`` also projects the current share of samples within the
    budget forward (never less than ``bound_needs``; None when that share equals q).
    """
    bounds = quantile_bounds(samples, q, confidence)
    figure = sample_quantile(samples, q)
    n = bounds.n
    evidence: dict[str, Any] = {
        "n": n,
        "quantile": q,
        "confidence": confidence,
        "lower": bounds.lower,
        "upper": bounds.upper,
        "lower_rank": bounds.lower_rank,
        "upper_rank": bounds.upper_rank,
    }
    if bounds.upper is not None and bounds.upper <= budget:
        return "pass", figure, bounds.lower, bounds.upper, evidence
    if bounds.lower is not None and bounds.lower > budget:
        return "fail", figure, bounds.lower, bounds.upper, evidence

    # Undecided: say which bound is missing or too wide and how many samples would help.
    share = float(np.count_nonzero(np.asarray(samples, dtype=float) <= budget)) / n if n else None
    side: Side = "upper" if share is None or share >= q else "lower"  # the bound that would decide
    bound_needs = samples_needed(q, confidence, side)
    projected = samples_to_decide(q, confidence, share) if share is not None else None
    needed: int | None = max(bound_needs, projected) if projected is not None else None
    if needed is None and n < bound_needs:
        needed = bound_needs
    evidence["share_within_budget"] = share
    evidence["bound_needs"] = bound_needs  # where the missing bound starts to exist at all
    evidence["samples_needed"] = needed  # None: the budget sits on the estimate; no n is enough
    if n == 0:
        evidence["reason"] = "no samples"
    elif n < bound_needs:
        evidence["reason"] = (
            f"{n} samples cannot bound the p{_pct(q)} from the {side} side at {confidence:.0%} confidence; "
            f"at least {bound_needs} are needed"
        )
    else:
        evidence["reason"] = (
            f"the {confidence:.0%} interval [{_fmt(bounds.lower)}, {_fmt(bounds.upper)}] contains the budget "
            f"{_fmt(budget)}; "
            + (f"about {needed} samples would decide it" if needed else "the budget sits on the estimate")
        )
    return "inconclusive", figure, bounds.lower, bounds.upper, evidence


def _pct(q: float) -> str:
    return f"{q * 100:g}"


def _fmt(x: float | None) -> str:
    return "none" if x is None else f"{x:.6g}"


@dataclass(frozen=True)
class RankShift:
    """One-sided Mann-Whitney U: is ``later`` stochastically greater than ``earlier``?"""

    statistic: float
    p_value: float
    significant: bool
    n_later: int
    n_earlier: int


def rank_shift(later: Samples, earlier: Samples, alpha: float = 0.05) -> RankShift:
    """Mann-Whitney U test, alternative "later is greater", at significance ``alpha``."""
    if len(later) == 0 or len(earlier) == 0:
        raise ValueError("the rank test needs at least one sample on each side")
    result = _scipy_stats.mannwhitneyu(list(later), list(earlier), alternative="greater")
    p = float(result.pvalue)
    return RankShift(
        statistic=float(result.statistic),
        p_value=p,
        significant=p < alpha,
        n_later=len(later),
        n_earlier=len(earlier),
    )
