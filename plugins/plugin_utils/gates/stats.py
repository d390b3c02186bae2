"""Exact binomial arithmetic for the accuracy gate (standard library only).

A benchmark run of n independent items with true accuracy p gives a number of correct answers
X ~ Binomial(n, p).  A floor f is a rule "fail when X < f"; its false-alarm rate for a healthy
deployment is P(X < f) = cdf(f - 1).  ``floor_for`` picks the highest floor whose false-alarm rate
stays at or below alpha, so a healthy deployment fails at most alpha of the time and any real
drop large enough to matter is caught as early as the sample size allows.
"""
from __future__ import annotations

import math


def pmf(k: int, n: int, p: float) -> float:
    if k < 0 or k > n:
        return 0.0
    return math.comb(n, k) * p ** k * (1.0 - p) ** (n - k)


def cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return min(1.0, sum(pmf(i, n, p) for i in range(k + 1)))


def false_alarm(n: int, p: float, floor: int) -> float:
    """P(X < floor): how often a deployment with true accuracy p fails the floor."""
    return cdf(floor - 1, n, p)


def floor_for(n: int, p: float, alpha: float) -> int:
    """The highest floor f with P(X < f) <= alpha for X ~ Binomial(n, p)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError("accuracy p must be in [0, 1], got %r" % p)
    if not 0.0 < alpha < 1.0:
        raise ValueError("alpha must be in (0, 1), got %r" % alpha)
    floor = 0
    total = 0.0
    for k in range(n + 1):
        total += pmf(k, n, p)  # total = P(X <= k) = false-alarm rate of floor k + 1
        if total > alpha:
            break
        floor = k + 1
    return floor


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact two-sided confidence interval for a binomial proportion (bisection on the cdf)."""
    if n <= 0:
        return (0.0, 1.0)
    tail = (1.0 - confidence) / 2.0
    lower = 0.0 if k <= 0 else _bisect(lambda p: 1.0 - cdf(k - 1, n, p) >= tail)
    upper = 1.0 if k >= n else _bisect(lambda p: cdf(k, n, p) < tail)
    return (lower, upper)


def _bisect(at_or_above) -> float:
    """The p in [0, 1] where the monotone predicate at_or_above(p) switches from False to True."""
    lo, hi = 0.0, 1.0
    for _attempt in range(60):
        mid = (lo + hi) / 2.0
        if at_or_above(mid):
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2.0


def hypergeom_cdf(x: int, total: int, successes: int, draws: int) -> float:
    """P(X <= x) when drawing `draws` of `total` items of which `successes` are successes."""
    denom = math.comb(total, draws)
    low = max(0, draws - (total - successes))
    return min(1.0, sum(math.comb(successes, i) * math.comb(total - successes, draws - i)
                        for i in range(low, x + 1)) / denom)


def drop_p_value(k: int, n: int, k_ref: int, n_ref: int) -> float:
    """One-sided exact (Fisher) test that this run's accuracy k/n is below the reference run's k_ref/n_ref.

    Both runs are binomial samples; under "same accuracy", given the total number correct, this run's count
    is hypergeometric. Small values mean a real drop. Unlike plugging k_ref/n_ref in as the truth, this
    accounts for the reference run's own sampling noise.
    """
    return hypergeom_cdf(k, n + n_ref, k + k_ref, n)


def min_passing(n: int, k_ref: int, n_ref: int, alpha: float) -> int:
    """The smallest count of correct answers out of n that passes the reference test at level alpha."""
    for k in range(n + 1):
        if drop_p_value(k, n, k_ref, n_ref) >= alpha:
            return k
    return n + 1
