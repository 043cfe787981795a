"""The base conditional independence tests run on each subset: causal-learn's KCI and Fisher-z, and ``kci_lp`` (KCI's
statistic with a local-permutation null, :mod:`algos.ecit.local_perm`), on arrays.

``base_pvalue(x, y, z, base)`` tests X _||_ Y | Z on the rows given (2-D arrays, one row per sample; ``z`` may be
None or have 0 columns). KCI takes multi-column X and Y; Fisher-z one column each. Options go to causal-learn's
test class unchanged (e.g. KCI's ``kernelX``, ``est_width``, ``approx``); ``kci_lp`` takes ``n_perm``,
``bin_size`` and ``est_width`` (:func:`width_options` names the released code's width for both) and draws its
permutations from numpy's global generator (seeded per subset by :func:`algos.ecit.ecit.subset_pvalue`), like
causal-learn's own random draws.
"""
from __future__ import annotations

import numpy as np

BASES = ("kci", "fisherz", "kci_lp")
# KCI's kernel width, for both KCI and kci_lp: causal-learn's default "empirical" (1.2 / 0.7 / 0.4 by n, Z's shape), or
# "median" (sqrt(2) * the median distance of each kernel's input), the one the released E-CIT code passes to
# causal-learn for every KCI, subset and full-data (GuanZhengkang/ECIT ecit/cit/kcit.py:8,32)
KCI_WIDTHS = ("empirical", "median")
RELEASED_WIDTH = "median"


def width_options(width: str) -> dict:
    """The base options that give KCI and kci_lp the named kernel width (:data:`KCI_WIDTHS`); ``{}`` for the
    default, so records made without the option keep their meaning."""
    if width not in KCI_WIDTHS:
        raise ValueError(f"kernel width: choose from {', '.join(KCI_WIDTHS)}, got {width!r}")
    return {} if width == "empirical" else {"est_width": width}


def as_columns(a, name: str, n: int | None = None, allow_empty: bool = False) -> np.ndarray:
    """``a`` as a float 2-D array (a 1-D array is one column); one clear error for the wrong shape or values."""
    if a is None:
        if allow_empty:
            return np.zeros((n or 0, 0))
        raise ValueError(f"{name}: missing")
    arr = np.asarray(a, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D array (one row per sample), got shape {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name}: has {arr.shape[0]} rows, x has {n}")
    if arr.shape[1] == 0 and not allow_empty:
        raise ValueError(f"{name}: has no columns")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: contains NaN or inf")
    return arr


def check_base(base: str, x: np.ndarray, y: np.ndarray) -> None:
    if base not in BASES:
        raise ValueError(f"base: unknown test {base!r} (choose from {', '.join(BASES)})")
    if base == "fisherz" and (x.shape[1] != 1 or y.shape[1] != 1):
        raise ValueError(f"base 'fisherz' tests one column against one column, got x {x.shape[1]}, y {y.shape[1]}")


def base_pvalue(x: np.ndarray, y: np.ndarray, z: np.ndarray | None, base: str = "kci",
                options: dict | None = None) -> float:
    """p-value of the base test of X _||_ Y | Z on these rows (arrays already checked by :func:`as_columns`)."""
    if base == "kci_lp":
        from algos.ecit.local_perm import kci_lp_pvalue
        rng = np.random.default_rng(np.random.randint(0, 2**32, dtype=np.uint64))
        return kci_lp_pvalue(x, y, z, rng, **(options or {}))
    from causallearn.utils.cit import CIT

    z = np.zeros((len(x), 0)) if z is None else z
    data = np.hstack([x, y, z])
    ix = list(range(x.shape[1]))
    iy = list(range(x.shape[1], x.shape[1] + y.shape[1]))
    iz = list(range(x.shape[1] + y.shape[1], data.shape[1]))
    # causal-learn hashes str(data) for its cache file; printed in full that costs ~8 ms per subset, more than a
    # Fisher-z test itself. A summarised str is enough (we use no cache file).
    with np.printoptions(threshold=16, edgeitems=2):
        test = CIT(data, base, **(options or {}))
    if base == "fisherz":
        ix, iy = ix[0], iy[0]
    return float(test(ix, iy, iz))
