"""Distribution-free statistics for verdicts: quantile and proportion confidence bounds, a rank test.

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

Looking more than once. A phase that runs until its verdicts decide (``duration: {min, max}``) judges
them at several looks and stops at the first where all are decided. Re-checking a fixed-n interval
so is not valid: each look has its own chance 1 - c of a wrong decision, and stopping at the first
decisive one collects those chances, so the verdict a run stops on is wrong more often than 1 - c
(``tests/sla/test_sequential.py`` measures it). Look k (1-based) therefore spends only
α_k = α / (k (k + 1)) of α = 1 - c (``spent_alpha``): the shares sum to α (1 - 1 / (K + 1)) < α over
any number of looks K, so by the union bound the chance that the verdict judged at any look, the one
the run stopped on included, is wrong is at most α, whatever rule chose when to stop.
``sequential_confidence`` is the confidence one look's interval is computed at.

Correlated samples. Samples taken one after another under load are not independent, and n of
them carry the information of fewer, n_eff (``sla.correlation``). Every interval here takes an
``n_eff``: the binomial is computed for n_eff trials and its ranks are scaled back to the n
samples at hand, rounded outward (the upper rank up, the lower rank down), so that with
n_eff = n nothing changes and with n_eff < n the interval widens as the variance of the count
does. ``judge_quantile`` and ``judge_share`` estimate n_eff from the samples in the order they
are given (the order the requests were sent) unless told the samples are independent.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from sla.correlation import EffectiveSize, effective_size, quantile_indicator

__all__ = [
    "ProportionBounds",
    "QuantileBounds",
    "RankShift",
    "judge_quantile",
    "judge_share",
    "proportion_bounds",
    "quantile_bounds",
    "rank_shift",
    "sample_quantile",
    "sample_size",
    "samples_needed",
    "samples_to_decide",
    "scaled_ranks",
    "sequential_confidence",
    "share_samples_to_decide",
    "spent_alpha",
]

Status = Literal["pass", "fail", "inconclusive"]
Samples = Sequence[float] | npt.NDArray[np.floating[Any]]
Side = Literal["upper", "lower"]


@functools.cache
def _scipy_stats() -> Any:
    """scipy.stats, imported on first use: it takes 1.1 s of CPU, and most processes that import the
    SLA catalogue never judge (validate, list, dry runs, rollback, the load's own processes)."""
    from scipy import stats

    return stats


def _binom() -> Any:
    return _scipy_stats().binom


def _beta() -> Any:
    return _scipy_stats().beta


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
    k = int(_binom().ppf(1.0 - alpha, n, q)) + 1  # a guess; fixed up exactly below
    k = min(max(k, 1), n)
    while k > 1 and _binom().sf(k - 2, n, q) <= alpha:
        k -= 1
    while _binom().sf(k - 1, n, q) > alpha:
        k += 1
    return k


def _lower_index(n: int, q: float, alpha: float) -> int | None:
    """Largest 1-based k with P(B <= k - 1) <= alpha; None when even k = 1 fails."""
    if n <= 0 or (1.0 - q) ** n > alpha:
        return None
    k = int(_binom().ppf(alpha, n, q))
    k = min(max(k, 1), n)
    while k < n and _binom().cdf(k, n, q) <= alpha:
        k += 1
    while k > 1 and _binom().cdf(k - 1, n, q) > alpha:
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


def spent_alpha(alpha: float, look: int) -> float:
    """The part of ``alpha`` look ``look`` (1-based) may spend: α / (k (k + 1)). Summed over looks 1..K it
    is α (1 - 1 / (K + 1)), below α for any K: a verdict judged at any look is wrong with chance at most α."""
    if look < 1:
        raise ValueError(f"looks are counted from 1, found {look!r}")
    return alpha / (look * (look + 1))


def sequential_confidence(confidence: float, look: int) -> float:
    """The confidence look ``look`` judges at, for a verdict at ``confidence`` when judged once."""
    _alpha(confidence, False)  # checks the range
    return 1.0 - spent_alpha(1.0 - confidence, look)


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
    n_eff: float | None = None  # the effective sample size the ranks were computed for; None: n


def _effective_trials(n: int, n_eff: float | None) -> int:
    """The binomial's number of trials for n samples worth n_eff: floor(n_eff) within [1, n]."""
    if n_eff is None or n_eff >= n:
        return n
    return max(1, min(n, math.floor(n_eff)))


def scaled_ranks(n: int, q: float, alpha: float, n_eff: float | None = None) -> tuple[int | None, int | None]:
    """(lower, upper) 1-based ranks among n samples worth n_eff independent ones.

    The binomial ranks for n_e = floor(n_eff) trials are fractions of the sample; scaled back to
    n samples they are rounded outward, so the interval is never narrower than n_e's.
    """
    n_e = _effective_trials(n, n_eff)
    lo_e = _lower_index(n_e, q, alpha)
    hi_e = _upper_index(n_e, q, alpha)
    if n_e == n:
        return lo_e, hi_e
    lo = None if lo_e is None else max(1, math.floor((lo_e - 1) * n / n_e) + 1)
    hi = None if hi_e is None else min(n, math.ceil(hi_e * n / n_e))
    return lo, hi


def quantile_bounds(
    samples: Samples, q: float, confidence: float = 0.95, *, two_sided: bool = True, n_eff: float | None = None
) -> QuantileBounds:
    """Order-statistic bounds for the q-quantile of the distribution ``samples`` came from.

    ``n_eff`` (default: the number of samples, i.e. independent samples) widens them for
    correlated samples; see the module docstring.
    """
    _check_q(q)
    alpha = _alpha(confidence, two_sided)
    ordered = np.sort(np.asarray(samples, dtype=float))
    n = int(ordered.size)
    lo, hi = scaled_ranks(n, q, alpha, n_eff)
    return QuantileBounds(
        n=n,
        q=q,
        confidence=confidence,
        lower=float(ordered[lo - 1]) if lo is not None else None,
        upper=float(ordered[hi - 1]) if hi is not None else None,
        lower_rank=lo,
        upper_rank=hi,
        n_eff=None if n_eff is None else float(min(n_eff, n)),
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
            return np.asarray((k >= 1) & (_binom().sf(k - 1, n, q) <= alpha), dtype=bool)
        # X_(k) > budget iff fewer than k are within: some k - 1 >= within has P(B <= k - 1) <= alpha
        return np.asarray(_binom().cdf(np.ceil(within), n, q) <= alpha, dtype=bool)

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


def sample_size(samples: Samples, q: float | None = None, *, independent: bool = False) -> EffectiveSize:
    """The effective size of ``samples`` (in the order they were taken) for the q-quantile's
    interval (its indicator series), or for a 0/1 series when ``q`` is None."""
    values = np.asarray(samples, dtype=float)
    if independent or values.size == 0:
        return EffectiveSize(int(values.size), float(values.size), 1.0, None, 0, method="assumed independent")
    return effective_size(quantile_indicator(values, q) if q is not None else values)


def _needed(effective: int | None, tau: float) -> int | None:
    """Effective samples → samples at this autocorrelation (τ samples per effective one)."""
    return None if effective is None else math.ceil(effective * tau - 1e-9)


def judge_quantile(
    samples: Samples, q: float, budget: float, confidence: float = 0.95, *, independent: bool = False
) -> tuple[Status, float | None, float | None, float | None, dict[str, Any]]:
    """Judge "the q-quantile is within ``budget``": (status, figure, lower, upper, evidence).

    ``samples`` come in the order they were taken: their autocorrelation (``sla.correlation``)
    sets the effective sample size the interval is computed for, unless ``independent``.
    ``pass`` only when the upper confidence bound is within the budget, ``fail`` only when the
    lower bound is over it; otherwise ``inconclusive``, and the evidence says how many samples
    would decide: ``bound_needs`` is where the missing bound starts to exist at all (p99 at 95%
    two-sided: 368 independent samples, τ times as many correlated ones), ``samples_needed``
    also projects the current share of samples within the budget forward (never less than
    ``bound_needs``; None when that share equals q).
    """
    values = np.asarray(samples, dtype=float)
    size = sample_size(values, q, independent=independent)
    bounds = quantile_bounds(values, q, confidence, n_eff=size.n_eff if size.n else None)
    figure = sample_quantile(values, q)
    evidence: dict[str, Any] = {
        "quantile": q,
        "confidence": confidence,
        "lower": bounds.lower,
        "upper": bounds.upper,
        "lower_rank": bounds.lower_rank,
        "upper_rank": bounds.upper_rank,
        **size.evidence(f"1{{x <= sample p{_pct(q)}}} in send order"),
    }
    if bounds.upper is not None and bounds.upper <= budget:
        return "pass", figure, bounds.lower, bounds.upper, evidence
    if bounds.lower is not None and bounds.lower > budget:
        return "fail", figure, bounds.lower, bounds.upper, evidence

    # Undecided: say which bound is missing or too wide and how many samples would help.
    evidence.update(_undecided(values, q, budget, confidence, size, bounds))
    return "inconclusive", figure, bounds.lower, bounds.upper, evidence


def _undecided(values: np.ndarray[Any, Any], q: float, budget: float, confidence: float, size: EffectiveSize,
               bounds: QuantileBounds) -> dict[str, Any]:
    """An undecided quantile verdict's evidence: the bound that would decide, how many samples would
    bring it (``bound_needs``; ``samples_needed`` projects the share within budget forward), and why."""
    n = bounds.n
    evidence: dict[str, Any] = {}
    share = float(np.count_nonzero(values <= budget)) / n if n else None
    side: Side = "upper" if share is None or share >= q else "lower"  # the bound that would decide
    bound_needs_eff = samples_needed(q, confidence, side)
    projected_eff = samples_to_decide(q, confidence, share) if share is not None else None
    bound_needs = _needed(bound_needs_eff, size.tau)
    assert bound_needs is not None
    projected = _needed(projected_eff, size.tau)
    needed: int | None = max(bound_needs, projected) if projected is not None else None
    if needed is None and n < bound_needs:
        needed = bound_needs
    evidence["share_within_budget"] = share
    evidence["bound_needs"] = bound_needs  # where the missing bound starts to exist at all
    evidence["bound_needs_effective"] = bound_needs_eff  # the same, in independent samples
    evidence["samples_needed"] = needed  # None: the budget sits on the estimate; no n is enough
    worth = ("" if size.tau == 1.0
             else f" (worth {size.n_eff:.0f} independent ones at lag-1 autocorrelation {size.rho_lag1:.2f})")
    if n == 0:
        evidence["reason"] = "no samples"
    elif _effective_trials(n, size.n_eff) < bound_needs_eff:
        evidence["reason"] = (
            f"{n} samples{worth} cannot bound the p{_pct(q)} from the {side} side at {_conf(confidence)} confidence; "
            f"at least {bound_needs} are needed"
        )
    else:
        evidence["reason"] = (
            f"the {_conf(confidence)} interval [{_fmt(bounds.lower)}, {_fmt(bounds.upper)}] from {n} samples{worth} "
            f"contains the budget {_fmt(budget)}; "
            + (f"about {needed} samples would decide it" if needed else "the budget sits on the estimate")
        )
    return evidence


@dataclass(frozen=True)
class ProportionBounds:
    """A Clopper-Pearson interval for a share, computed for ``n_eff`` effective trials."""

    successes: int
    n: int
    n_eff: float
    confidence: float
    lower: float | None
    upper: float | None


def proportion_bounds(
    successes: int, n: int, confidence: float = 0.95, *, two_sided: bool = True, n_eff: float | None = None
) -> ProportionBounds:
    """Clopper-Pearson (exact binomial) bounds for the share behind ``successes`` of ``n``.

    With ``n_eff`` < n the observed share is kept and the trials shrink to n_eff: the beta
    quantiles take the fractional counts ``share * n_eff`` as they come.
    """
    alpha = _alpha(confidence, two_sided)
    if n <= 0:
        return ProportionBounds(successes, n, 0.0, confidence, None, None)
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie between 0 and n ({n}), found {successes}")
    n_e = float(n) if n_eff is None else min(float(n), max(1.0, float(n_eff)))
    x = successes * n_e / n
    lower = 0.0 if successes == 0 else float(_beta().ppf(alpha, x, n_e - x + 1.0))
    upper = 1.0 if successes == n else float(_beta().ppf(1.0 - alpha, x + 1.0, n_e - x))
    return ProportionBounds(successes, n, n_e, confidence, lower, upper)


def _share_decides(share: float, floor: float, n_e: float, alpha: float) -> bool:
    x = share * n_e
    if share > floor:
        return x > 0 and float(_beta().ppf(alpha, x, n_e - x + 1.0)) >= floor
    return x < n_e and float(_beta().ppf(1.0 - alpha, x + 1.0, n_e - x)) < floor


def share_samples_to_decide(share: float, floor: float, confidence: float = 0.95) -> int | None:
    """Effective trials that would decide "share >= floor" if the observed share held; None when
    the share sits on the floor, or when no sample size can (a share of 100% never shows a
    floor of 100%)."""
    alpha = _alpha(confidence, True)
    if share == floor:
        return None
    powers = [float(2**k) for k in range(int(math.log2(_MAX_N)) + 1)]
    hi = next((p for p in powers if _share_decides(share, floor, p, alpha)), None)
    if hi is None:
        return None
    lo = hi / 2
    while hi - lo > 1:
        mid = math.floor((lo + hi) / 2)
        if _share_decides(share, floor, float(mid), alpha):
            hi = mid
        else:
            lo = mid
    return int(hi)


def judge_share(
    outcomes: Samples, floor: float, confidence: float = 0.95, *, independent: bool = False
) -> tuple[Status, float | None, float | None, float | None, dict[str, Any]]:
    """Judge "the share of successes is at least ``floor``" from 0/1 ``outcomes`` in the order
    they happened: (status, figure, lower, upper, evidence).

    ``pass`` when the lower Clopper-Pearson bound (for the series' effective size) is at least the
    floor, ``fail`` when the upper bound is under it, otherwise ``inconclusive`` with the
    number of samples that would decide it if the share held.
    """
    values = np.asarray(outcomes, dtype=float)
    n = int(values.size)
    successes = int(np.count_nonzero(values > 0.5))
    size = sample_size(values, None, independent=independent)
    bounds = proportion_bounds(successes, n, confidence, n_eff=size.n_eff if n else None)
    share = successes / n if n else None
    evidence: dict[str, Any] = {
        "successes": successes,
        "confidence": confidence,
        "lower": bounds.lower,
        "upper": bounds.upper,
        **size.evidence("the 0/1 outcomes in send order"),
    }
    if share is not None and bounds.lower is not None and bounds.lower >= floor:
        return "pass", share, bounds.lower, bounds.upper, evidence
    if share is not None and bounds.upper is not None and bounds.upper < floor:
        return "fail", share, bounds.lower, bounds.upper, evidence
    if share is None:
        evidence["reason"] = "no samples"
        evidence["samples_needed"] = None
        return "inconclusive", None, None, None, evidence
    needed = _needed(share_samples_to_decide(share, floor, confidence), size.tau)
    evidence["samples_needed"] = needed
    worth = "" if size.tau == 1.0 else f" (worth {size.n_eff:.0f} independent ones)"
    if needed is None:
        why = ("a share of 100% can never show a floor of 100%; lower the floor" if floor >= 1.0
               else "the floor sits on the estimate")
    else:
        why = f"about {needed} samples would decide it"
    evidence["reason"] = (
        f"the {_conf(confidence)} interval [{_fmt(bounds.lower)}, {_fmt(bounds.upper)}] from {n} samples{worth} "
        f"contains the floor {_fmt(floor)}; {why}"
    )
    return "inconclusive", share, bounds.lower, bounds.upper, evidence


def _conf(confidence: float) -> str:
    """``95%``, ``97.5%``, ``99.98%``: a confidence a look raised is never shown as 100%."""
    return f"{confidence * 100:.4g}%"


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
    result = _scipy_stats().mannwhitneyu(list(later), list(earlier), alternative="greater")
    p = float(result.pvalue)
    return RankShift(
        statistic=float(result.statistic),
        p_value=p,
        significant=p < alpha,
        n_later=len(later),
        n_earlier=len(earlier),
    )
