"""Combining the p-values of independent subset tests into one p-value.

The stable combination (E-CIT, Guan & Kuang, ICLR 2026, Definition 2): with ``F`` the cdf of the symmetric
alpha-stable law S(alpha, 0, 1, 0),

    T = (1/K) * sum_k F^{-1}(p_k),        p = F(T / K^(1/alpha - 1))

because the mean of K independent S(alpha, 0, 1, 0) draws is S(alpha, 0, K^(1/alpha - 1), 0): under the null each
F^{-1}(p_k) is such a draw, so p is uniform again. alpha = 1 is the Cauchy combination and alpha = 2 is Stouffer's
(F = N(0, 2)); small p-values map to the far left tail, so one tiny p-value can carry the result when alpha is small,
while alpha -> 2 averages the evidence.

Baselines: Fisher's method (chi-square with 2K degrees of freedom) and Bonferroni (K times the smallest p-value).

``binomial``: a count of subset p-values at or below a threshold t, valid when the subset p-values are right only in
their tail (:func:`binomial_combine`); the E-CIT study (issue 28) measured KCI subset p-values whose bulk is shifted
while their 5 % tail holds, and every sum-of-quantiles combiner above multiplies such a shift by sqrt(K).
"""
from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats

COMBINERS = ("stable", "cauchy", "fisher", "bonferroni", "binomial")
BINOMIAL_THRESHOLD = 0.05
P_FLOOR, P_CEIL = 1e-300, 1.0 - 1e-16  # 0 and 1 together would give -inf + inf
_TABLE_EDGE = 200.0  # beyond |x| = 200 the stable tail's leading term is within 0.1 % (checked for alpha >= 1.5)


def _checked(pvalues) -> np.ndarray:
    p = np.asarray(pvalues, dtype=np.float64).reshape(-1)
    if p.size == 0:
        raise ValueError("combine: no p-values to combine")
    if not np.all(np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError(f"combine: p-values must lie in [0, 1], got {p[~((p >= 0) & (p <= 1))][:5].tolist()}")
    return np.clip(p, P_FLOOR, P_CEIL)


def _tail_constant(alpha: float) -> float:
    """C with P(X < -x) ~ C x^-alpha as x -> inf for X ~ S(alpha, 0, 1, 0)."""
    return math.gamma(alpha) * math.sin(math.pi * alpha / 2) / math.pi


@functools.lru_cache(maxsize=8)
def _lower_table(alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """(log F(x), x) on x in [-200, 0] for the symmetric stable law, increasing in both (scipy's cdf, computed once
    per alpha and process: its quantile costs ~7 ms a value, the table lookup microseconds)."""
    x = -np.concatenate([np.geomspace(_TABLE_EDGE, 1.0, 300), np.linspace(1.0, 0.0, 101)[1:]])
    cdf = stats.levy_stable.cdf(x, alpha, 0.0)
    cdf[-1] = 0.5
    return np.log(cdf), x


def stable_cdf(x: np.ndarray | float, alpha: float) -> np.ndarray:
    """cdf of S(alpha, 0, 1, 0) (scipy's S1 = S0 when beta = 0), with the power-law tail beyond |x| = 200 where
    scipy's integral returns 0."""
    x = np.asarray(x, dtype=np.float64)
    if alpha == 1.0:
        return 0.5 + np.arctan(x) / np.pi
    if alpha == 2.0:
        return stats.norm.cdf(x / math.sqrt(2.0))
    far = np.abs(x) > _TABLE_EDGE
    lower = np.where(far, _tail_constant(alpha) * np.maximum(np.abs(x), _TABLE_EDGE) ** -alpha,
                     stats.levy_stable.cdf(-np.abs(np.where(far, 0.0, x)), alpha, 0.0))
    return np.where(x <= 0, lower, 1.0 - lower)


def stable_quantile(p: np.ndarray, alpha: float) -> np.ndarray:
    """Inverse of :func:`stable_cdf` (p in (0, 1)), by symmetry from the lower half."""
    p = np.asarray(p, dtype=np.float64)
    if alpha == 1.0:
        return np.tan(np.pi * (p - 0.5))
    if alpha == 2.0:
        return math.sqrt(2.0) * stats.norm.ppf(p)
    lower = np.minimum(p, 1.0 - p)
    log_f, x = _lower_table(alpha)
    inside = np.interp(np.log(lower), log_f, x)
    tail = -(_tail_constant(alpha) / lower) ** (1.0 / alpha)
    q = np.where(np.log(lower) < log_f[0], tail, inside)
    return np.where(p <= 0.5, q, -q)


def stable_combine(pvalues, alpha: float = 1.75) -> float:
    """The stable combination of independent p-values (module docstring); ``alpha`` in (0, 2]."""
    if not 0.0 < alpha <= 2.0:
        raise ValueError(f"stable combination: alpha must be in (0, 2], got {alpha}")
    p = _checked(pvalues)
    k = p.size
    statistic = float(np.mean(stable_quantile(p, alpha)))
    return float(np.clip(stable_cdf(statistic / k ** (1.0 / alpha - 1.0), alpha), 0.0, 1.0))


def cauchy_combine(pvalues) -> float:
    """The Cauchy combination (ACAT): the stable combination with alpha = 1."""
    return stable_combine(pvalues, 1.0)


def fisher_combine(pvalues) -> float:
    """Fisher's method: -2 sum log p ~ chi-square(2K) under the null."""
    p = _checked(pvalues)
    return float(stats.chi2.sf(-2.0 * np.sum(np.log(p)), 2 * p.size))


def bonferroni_combine(pvalues) -> float:
    """K times the smallest p-value, capped at 1 (valid under any dependence, conservative)."""
    p = _checked(pvalues)
    return float(min(1.0, p.size * p.min()))


def binomial_combine(pvalues, threshold: float = BINOMIAL_THRESHOLD, u: float | None = None) -> float:
    """The tail count: C = #{k : p_k <= t} against Binomial(K, t), randomised within the observed count.

    Derivation. Assume only what a base test calibrated at one level gives: under the null each subset p-value has
    q_k = P(p_k <= t) <= t at the threshold t, and the K subsets are independent (disjoint rows of i.i.d. data;
    the subset tests' own randomness independent). Nothing is assumed about the p-values' law elsewhere, so any shift
    of their bulk (the measured mean z of +0.12..+0.16 with a right tail) is allowed. Then C = sum_k B_k with
    independent B_k ~ Bernoulli(q_k). Couple B_k = 1{V_k <= q_k} with V_k i.i.d. U(0, 1): B_k <= B'_k = 1{V_k <= t},
    so C <= C' ~ Binomial(K, t) pointwise, i.e. C is stochastically smaller than Binomial(K, t). With U ~ U(0, 1)
    independent of the data and G(c) = P(C' > c) + U P(C' = c), the randomised p-value G(C) satisfies
    P(G(C') <= a) = a exactly for C' ~ Binomial(K, t) (the randomised probability integral transform of a discrete
    law), and G is non-increasing in c, so P(G(C) <= a) <= P(G(C') <= a) = a for every a: valid at every level, for
    every K, under any bulk shift. It is exact (type-I error = a) when q_k = t.
    What it gives up: only the count below t is used, so it has less power than an averaging combiner when the
    evidence is spread thinly over many subsets; and it is invalid if the tail itself is too heavy (q_k > t), the
    one thing it assumes. ``u``: the uniform draw (None: a draw seeded from the p-values, so the same inputs give
    the same output)."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"binomial combination: threshold must be in (0, 1), got {threshold}")
    p = _checked(pvalues)
    if u is None:
        u = float(np.random.default_rng(np.frombuffer(p.tobytes(), dtype=np.uint32)).random())
    count = int(np.sum(p <= threshold))
    k = p.size
    return float(stats.binom.sf(count, k, threshold) + u * stats.binom.pmf(count, k, threshold))


def combine(pvalues, method: str = "stable", alpha: float = 1.75, threshold: float = BINOMIAL_THRESHOLD) -> float:
    """One p-value from independent subset p-values; ``method`` in :data:`COMBINERS` (``alpha`` is the stable law's
    index, used by ``stable`` only; ``threshold`` the tail point t of ``binomial``)."""
    if method == "stable":
        return stable_combine(pvalues, alpha)
    if method == "cauchy":
        return cauchy_combine(pvalues)
    if method == "fisher":
        return fisher_combine(pvalues)
    if method == "bonferroni":
        return bonferroni_combine(pvalues)
    if method == "binomial":
        return binomial_combine(pvalues, threshold)
    raise ValueError(f"combine: unknown method {method!r} (choose from {', '.join(COMBINERS)})")


