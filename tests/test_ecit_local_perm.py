"""kci_lp (KCI's statistic with a local-permutation null) and the binomial tail-count combiner (issue 42)."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from algos.ecit import combine, ecit_pvalue
from algos.ecit.combine import binomial_combine
from algos.ecit.local_perm import kci_lp_pvalue, kci_statistic_parts, z_cells


def _triplet(rng, n, dz, dependent=False):
    z = rng.normal(size=(n, dz)) if dz else None
    s = z.sum(axis=1, keepdims=True) if dz else 0.0
    x = np.tanh(s) + 0.5 * rng.standard_t(3, size=(n, 1))
    y = np.cos(s) + 0.5 * rng.standard_t(3, size=(n, 1)) + (0.8 * x if dependent else 0.0)
    return x, y, z


@pytest.mark.parametrize("dz", [0, 1, 2])
def test_statistic_is_causal_learns_kci_statistic(dz):
    from causallearn.utils.KCI.KCI import KCI_CInd, KCI_UInd
    x, y, z = _triplet(np.random.default_rng(dz), 150, dz)
    if dz:
        t = KCI_CInd()
        ref = t.KCI_V_statistic(*t.kernel_matrix(x, y, z))[0]
    else:
        t = KCI_UInd()
        ref = t.HSIC_V_statistic(*t.kernel_matrix(x, y))[0]
    kxx, w = kci_statistic_parts(x, y, z)
    assert np.sum(kxx * w) == pytest.approx(ref, rel=1e-6)


@pytest.mark.parametrize("dz", [1, 3])
def test_cells_partition_the_rows_into_small_groups_close_in_z(dz):
    z = np.random.default_rng(0).normal(size=(203, dz))
    cells = z_cells(z, 8)
    rows = np.sort(np.concatenate(cells))
    assert np.array_equal(rows, np.arange(203))
    assert max(len(c) for c in cells) <= (8 if dz > 1 else 9) and min(len(c) for c in cells) >= 4
    # cells are local: the mean within-cell spread is far below the overall spread
    spread = np.mean([np.ptp(z[c], axis=0).max() for c in cells])
    assert spread < 0.5 * np.ptp(z, axis=0).max()


def test_unconditional_null_is_uniform_and_dependence_is_found():
    rng = np.random.default_rng(1)
    ps = [kci_lp_pvalue(*_triplet(rng, 40, 0), rng, n_perm=19) for _ in range(300)]
    assert stats.kstest(ps, "uniform").pvalue > 1e-3
    assert abs(np.mean(stats.norm.isf(ps))) < 0.2   # continuous: no mass at p = 1 (randomised p-value)
    assert all(kci_lp_pvalue(*_triplet(rng, 200, 0, True), rng) < 0.02 for _ in range(3))


def test_conditional_null_holds_where_x_and_y_both_depend_on_z():
    """X and Y both driven by Z, independent given it. With X | Z noisy (R^2 ~ 0.8) the local-permutation p-values
    are uniform in bulk and tail; with X nearly a function of Z (R^2 ~ 0.98) a cell of 8 rows still spans enough of
    Z to move X, and the null turns conservative (p-values piled up high), never liberal."""
    rng = np.random.default_rng(2)

    def pvalues(noise, reps):
        out = []
        for _ in range(reps):
            z = rng.normal(size=(200, 1))
            x = 2 * z + noise * rng.normal(size=(200, 1))
            y = z ** 2 + noise * rng.normal(size=(200, 1))
            out.append(kci_lp_pvalue(x, y, z, rng, n_perm=39))
        return np.array(out)

    noisy = pvalues(1.0, 150)
    assert np.mean(noisy <= 0.05) <= 0.11 and 0.4 < np.mean(noisy) < 0.6
    tight = pvalues(0.3, 60)
    assert np.mean(tight <= 0.05) <= 0.05 and np.mean(tight) > 0.55
    x, y, z = _triplet(rng, 300, 1, dependent=True)
    assert kci_lp_pvalue(x, y, z, rng) < 0.05


def test_kci_lp_as_an_ecit_base_is_seeded_and_checked():
    x, y, z = _triplet(np.random.default_rng(3), 600, 1)
    a = ecit_pvalue(x, y, z, base="kci_lp", subset_size=200, rng=7, return_subsets=True)
    b = ecit_pvalue(x, y, z, base="kci_lp", subset_size=200, rng=7, return_subsets=True)
    c = ecit_pvalue(x, y, z, base="kci_lp", subset_size=200, rng=8, return_subsets=True)
    assert a == b and len(a[1]) == 3 and a[1] != c[1]
    with pytest.raises(ValueError, match="bin_size"):
        kci_lp_pvalue(x, y, z, np.random.default_rng(0), bin_size=1)


def test_binomial_combiner_is_exactly_uniform_against_binomial_counts():
    """P(G(C') <= a) = a for C' ~ Binomial(K, t), computed exactly over the counts and the uniform draw."""
    for k in (10, 160):
        for a in (0.01, 0.05, 0.2):
            total = 0.0
            for c in range(k + 1):
                lo = stats.binom.sf(c, k, 0.05)
                pm = stats.binom.pmf(c, k, 0.05)
                # G(c) = lo + u * pm <= a  <=>  u <= (a - lo) / pm
                total += pm * float(np.clip((a - lo) / pm, 0.0, 1.0)) if pm > 0 else 0.0
            assert total == pytest.approx(a, abs=1e-9)
    assert binomial_combine([0.5] * 10, u=0.0) == pytest.approx(stats.binom.sf(0, 10, 0.05))


@pytest.mark.slow
def test_binomial_combiner_holds_the_level_under_a_bulk_shift_where_stouffer_fails():
    """Simulated nulls with the measured kind of shift (z ~ N(0.15, 0.8): bulk moved, 5 % tail at ~0.03), not the
    measured table: the tail count keeps the level at every K, Stouffer's sum does not; uniform nulls give ~5 %;
    a too-heavy tail (the one thing it assumes away) breaks it; real signal is found."""
    rng = np.random.default_rng(4)
    reps = 2000
    for k in (10, 40, 160):
        shifted = stats.norm.sf(rng.normal(0.15, 0.8, size=(reps, k)))
        binom = np.mean([combine(p, "binomial") <= 0.05 for p in shifted])
        stouffer = np.mean([combine(p, "stable", 2.0) <= 0.05 for p in shifted])
        assert binom <= 0.05 + 0.015, (k, binom)
        if k == 160:
            assert stouffer > 0.4
        uniform = rng.uniform(size=(reps, k))
        assert abs(np.mean([combine(p, "binomial") <= 0.05 for p in uniform]) - 0.05) < 0.015
    heavy = stats.norm.sf(rng.normal(0.0, 1.3, size=(reps, 160)))     # P(p <= 0.05) ~ 0.10 > t
    assert np.mean([combine(p, "binomial") <= 0.05 for p in heavy]) > 0.5
    signal = stats.norm.sf(rng.normal(1.0, 1.0, size=(200, 40)))
    assert np.mean([combine(p, "binomial") <= 0.05 for p in signal]) > 0.9


@pytest.mark.parametrize("dz", [0, 1, 2])
def test_released_median_width_is_causal_learns_median_width(dz):
    """The released code's width (GuanZhengkang/ECIT ecit/cit/kcit.py:8,32: est_width='median') as the named option:
    kci_lp's statistic equals causal-learn's KCI statistic under that width, and differs from the default's."""
    from causallearn.utils.KCI.KCI import KCI_CInd, KCI_UInd

    from algos.ecit import RELEASED_WIDTH, width_options
    x, y, z = _triplet(np.random.default_rng(10 + dz), 150, dz)
    opts = width_options(RELEASED_WIDTH)
    assert opts == {"est_width": "median"} and width_options("empirical") == {}
    if dz:
        t, d = KCI_CInd(**opts), KCI_CInd()
        ref, default = (c.KCI_V_statistic(*c.kernel_matrix(x, y, z))[0] for c in (t, d))
    else:
        t, d = KCI_UInd(**opts), KCI_UInd()
        ref, default = (c.HSIC_V_statistic(*c.kernel_matrix(x, y))[0] for c in (t, d))
    kxx, w = kci_statistic_parts(x, y, z, est_width="median")
    assert np.sum(kxx * w) == pytest.approx(ref, rel=1e-6)
    assert abs(np.sum(kxx * w) - default) > 1e-3 * abs(default)
    with pytest.raises(ValueError, match="est_width"):
        kci_statistic_parts(x, y, z, est_width="manual")
    with pytest.raises(ValueError, match="kernel width"):
        width_options("widest")


def test_median_width_reaches_both_sub_tests_through_ecit_base_options():
    x, y, z = _triplet(np.random.default_rng(4), 400, 1)   # null: kci_lp's p is not just its tie-breaking draw
    for base in ("kci", "kci_lp"):
        a = ecit_pvalue(x, y, z, base=base, subset_size=200, rng=3, return_subsets=True)[1]
        b = ecit_pvalue(x, y, z, base=base, subset_size=200, rng=3, return_subsets=True,
                        base_options={"est_width": "median"})[1]
        assert a != b   # same subsets and seeds: only the width differs
