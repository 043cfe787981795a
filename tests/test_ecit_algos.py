"""E-CIT's pure parts (algos/ecit): the combiners on numbers, the partition, the entry point's errors and seeding."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from algos.ecit import combine, ecit_pvalue, partition, stable_cdf, stable_quantile
from algos.ecit.combine import P_FLOOR


def test_stable_combination_with_alpha_1_is_the_cauchy_combination():
    p = np.array([0.01, 0.3, 0.7, 0.95])
    acat = 0.5 + math.atan(np.mean(np.tan(np.pi * (0.5 - p)))) / math.pi  # Liu & Xie's statistic, upper tail
    assert combine(p, "stable", alpha=1.0) == pytest.approx(1 - acat, rel=1e-12)
    assert combine(p, "cauchy") == pytest.approx(combine(p, "stable", alpha=1.0), rel=1e-12)
    assert combine([0.5, 0.5], "cauchy") == pytest.approx(0.5)


def test_stable_combination_with_alpha_2_is_stouffer():
    p = [stats.norm.cdf(-1.0), stats.norm.cdf(-1.0)]
    assert combine(p, "stable", alpha=2.0) == pytest.approx(stats.norm.cdf(-math.sqrt(2.0)), rel=1e-9)


def test_stable_quantile_matches_scipy_in_the_body_and_inverts_the_cdf_in_the_tails():
    for alpha in (1.5, 1.75):
        for p in (1e-3, 0.01, 0.2, 0.5, 0.8, 0.999):
            assert stable_quantile(p, alpha) == pytest.approx(stats.levy_stable.ppf(p, alpha, 0.0), rel=1e-3, abs=1e-6)
        for p in (1e-30, 1e-8, 1e-4, 0.05, 0.6, 1 - 1e-6):
            assert float(stable_cdf(stable_quantile(p, alpha), alpha)) == pytest.approx(p, rel=2e-3)
    # beyond the table the lower tail is the power law C x^-alpha, C = Gamma(a) sin(pi a / 2) / pi
    c = math.gamma(1.75) * math.sin(math.pi * 1.75 / 2) / math.pi
    assert float(stable_cdf(-1e6, 1.75)) == pytest.approx(c * 1e6 ** -1.75, rel=1e-12)


def test_one_tiny_p_value_dominates_heavy_tailed_combinations_and_averages_out_under_stouffer():
    p = [1e-12, 0.5, 0.9, 0.99]
    assert combine(p, "stable", alpha=1.0) == pytest.approx(4.0e-12, rel=1e-3)  # K * p_min for tiny p_min
    assert combine(p, "stable", alpha=1.75) == pytest.approx(4.0e-12, rel=1e-2)  # power tail: same leading term
    assert combine(p, "stable", alpha=2.0) == pytest.approx(0.0433, abs=2e-4)


def test_fisher_and_bonferroni_known_values():
    x = -2 * (math.log(0.01) + math.log(0.02))
    assert combine([0.01, 0.02], "fisher") == pytest.approx(math.exp(-x / 2) * (1 + x / 2), rel=1e-10)  # chi2(4)
    assert combine([0.01, 0.5, 0.2], "bonferroni") == pytest.approx(0.03)
    assert combine([0.6, 0.7], "bonferroni") == 1.0


@pytest.mark.parametrize("method,alpha", [("stable", 1.75), ("stable", 1.0), ("stable", 2.0), ("fisher", 1.75),
                                          ("bonferroni", 1.75)])
def test_combining_uniform_p_values_gives_a_uniform_p_value(method, alpha):
    rng = np.random.default_rng(7)
    reps, k = 1500, 8
    combined = np.array([combine(rng.uniform(size=k), method, alpha) for _ in range(reps)])
    assert stats.kstest(combined, "uniform").pvalue > 1e-3 or method == "bonferroni"
    rate = np.mean(combined <= 0.05)
    hi = 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps)
    lo = 0.0 if method == "bonferroni" else 0.05 - 3 * math.sqrt(0.05 * 0.95 / reps)  # Bonferroni is conservative
    assert lo <= rate <= hi, rate


def test_combine_rejects_bad_p_values_and_names():
    with pytest.raises(ValueError, match="lie in"):
        combine([0.2, 1.3])
    with pytest.raises(ValueError, match="no p-values"):
        combine([])
    with pytest.raises(ValueError, match="unknown method"):
        combine([0.2], "harmonic")
    with pytest.raises(ValueError, match="alpha"):
        combine([0.2], "stable", alpha=2.5)
    assert combine([0.0, 1.0], "cauchy") < 1e-250  # p = 0 and p = 1 together: clipped, not inf - inf
    assert combine([0.0, 0.3], "fisher") >= 0.0 and P_FLOOR > 0


def test_partition_covers_every_row_once_in_near_equal_parts():
    parts = partition(1003, 100, np.random.default_rng(0))
    assert len(parts) == 10 and {len(p) for p in parts} <= {100, 101}
    assert sorted(np.concatenate(parts).tolist()) == list(range(1003))
    assert len(partition(50, 100, np.random.default_rng(0))) == 1  # fewer rows than a subset: one test on all
    with pytest.raises(ValueError, match="subset_size"):
        partition(100, 2, np.random.default_rng(0))


def _triplet(n: int, dependent: bool, seed: int):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 1))
    x = z + rng.normal(size=(n, 1))
    y = 0.8 * z + rng.normal(size=(n, 1)) + (0.3 * x if dependent else 0.0)
    return x, y, z


def test_ecit_is_seeded_by_its_rng_and_detects_dependence():
    x, y, z = _triplet(1200, True, 0)
    p1, subs = ecit_pvalue(x, y, z, base="kci", subset_size=300, rng=3, return_subsets=True)
    assert len(subs) == 4 and p1 < 0.01
    assert ecit_pvalue(x, y, z, base="kci", subset_size=300, rng=3) == p1
    assert ecit_pvalue(x, y, z, base="kci", subset_size=300, rng=4) != p1  # another split
    assert ecit_pvalue(x, y, z, base="fisherz", subset_size=300, combine="fisher", rng=0) < 1e-3


def test_ecit_fisherz_is_calibrated_on_linear_gaussian_nulls():
    ps = [ecit_pvalue(*_triplet(600, False, s), base="fisherz", subset_size=150, rng=s) for s in range(200)]
    assert 0.0 <= np.mean(np.array(ps) <= 0.05) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 200)
    assert stats.kstest(ps, "uniform").pvalue > 1e-3


def test_ecit_rejects_bad_inputs_with_one_clear_error():
    x, y, z = _triplet(200, False, 0)
    with pytest.raises(ValueError, match="base: unknown"):
        ecit_pvalue(x, y, z, base="gcm")
    with pytest.raises(ValueError, match="combine: unknown"):
        ecit_pvalue(x, y, z, base="fisherz", combine="mean")
    with pytest.raises(ValueError, match="one column"):
        ecit_pvalue(np.hstack([x, x]), y, z, base="fisherz")
    with pytest.raises(ValueError, match="y: has 100 rows"):
        ecit_pvalue(x, y[:100], z, base="fisherz")
    with pytest.raises(ValueError, match="NaN"):
        ecit_pvalue(np.full_like(x, np.nan), y, z, base="fisherz")
    with pytest.raises(ValueError, match="2-D"):
        ecit_pvalue(x[None], y, z, base="fisherz")
    with pytest.raises(ValueError, match="subset_size"):
        ecit_pvalue(x, y, z, base="fisherz", subset_size=1)
    with pytest.raises(ValueError, match="rng"):
        ecit_pvalue(x, y, z, base="fisherz", rng="seed")
    assert 0.0 <= ecit_pvalue(x, y, None, base="fisherz", subset_size=50, rng=0) <= 1.0  # unconditional


def test_subset_tests_are_reproducible_under_threads_with_random_base_options():
    """KCI with approx=False draws its null from numpy's global generator: seeded per subset, under a lock."""
    from concurrent.futures import ThreadPoolExecutor

    from algos.ecit import subset_pvalue
    x, y, z = _triplet(300, False, 1)
    rows = np.arange(150)
    opts = {"approx": False}

    def one(seed: int) -> float:
        return subset_pvalue(x, y, z, rows, "kci", seed, opts)

    alone = [one(s) for s in (1, 2, 1)]
    assert alone[0] == alone[2] != alone[1]  # the seed decides the simulated null
    with ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(one, [1, 2] * 4))
    assert threaded == [alone[0], alone[1]] * 4
