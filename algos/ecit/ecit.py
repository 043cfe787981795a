"""E-CIT: split the rows into subsets of a fixed size, run the base test on each, combine the subset p-values.

With the subset size m fixed the cost is K * cost(m) = O(n) for K = n // m subsets, instead of O(n^3) for KCI on
all rows. Every random choice (the split, each subset test's own randomness) comes from the ``rng`` given, so the
same seed gives the same p-value, whichever process computes which subset.
"""
from __future__ import annotations

import threading

import numpy as np

from algos.ecit.base import as_columns, base_pvalue, check_base
from algos.ecit.combine import COMBINERS, combine as combine_pvalues
from algos.ecit.partition import partition


_GLOBAL_RNG = threading.Lock()  # numpy's global generator is one per process: threads must not interleave seeds


def subset_pvalue(x: np.ndarray, y: np.ndarray, z: np.ndarray | None, rows: np.ndarray, base: str,
                  seed: int, options: dict | None = None) -> float:
    """The base test on one subset; ``seed`` seeds numpy's global generator, which causal-learn draws from (KCI
    with approx=False or median widths), so a rerun of the subset gives the same p-value, also when other threads
    of the process test at the same time (a pool worker with several slots)."""
    xs, ys, zs = x[rows], y[rows], None if z is None else z[rows]
    with _GLOBAL_RNG:
        np.random.seed(seed % 2**32)
        return base_pvalue(xs, ys, zs, base, options)


def subset_seeds(rng: np.random.Generator, k: int) -> np.ndarray:
    return rng.integers(0, 2**32, size=k, dtype=np.uint64)


def _rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    if rng is None or isinstance(rng, (int, np.integer)):
        return np.random.default_rng(rng)
    if isinstance(rng, np.random.Generator):
        return rng
    raise ValueError(f"rng: expected a numpy Generator, an int seed or None, got {type(rng).__name__}")


def ecit_pvalue(x, y, z=None, base: str = "kci", subset_size: int = 400, combine: str = "stable",
                rng: np.random.Generator | int | None = None, alpha: float = 1.75,
                base_options: dict | None = None, return_subsets: bool = False):
    """p-value of X _||_ Y | Z by E-CIT. ``x``, ``y``, ``z``: 2-D arrays with one row per sample (``z`` None or 0
    columns: unconditional). ``combine`` in stable|cauchy|fisher|bonferroni (``alpha``: the stable law's index).
    ``return_subsets``: also return the subset p-values."""
    x = as_columns(x, "x")
    n = x.shape[0]
    y = as_columns(y, "y", n)
    z = as_columns(z, "z", n, allow_empty=True)
    check_base(base, x, y)
    if combine not in COMBINERS:
        raise ValueError(f"combine: unknown method {combine!r} (choose from {', '.join(COMBINERS)})")
    gen = _rng(rng)
    parts = partition(n, subset_size, gen)
    seeds = subset_seeds(gen, len(parts))
    zz = z if z.shape[1] else None
    pvalues = [subset_pvalue(x, y, zz, rows, base, int(s), base_options) for rows, s in zip(parts, seeds)]
    p = combine_pvalues(pvalues, combine, alpha)
    return (p, pvalues) if return_subsets else p

