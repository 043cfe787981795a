"""Splitting the rows into subsets for the ensemble: a seeded random permutation cut into K = n // m near-equal
parts (never consecutive rows: real data is often grouped, e.g. by experimental condition)."""
from __future__ import annotations

import numpy as np


def num_subsets(n: int, subset_size: int) -> int:
    if subset_size < 4:
        raise ValueError(f"subset_size: must be >= 4 rows, got {subset_size}")
    if n < 1:
        raise ValueError(f"partition: no rows (n = {n})")
    return max(1, n // subset_size)


def partition(n: int, subset_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Row indices of K = max(1, n // subset_size) disjoint subsets covering all n rows (sizes differ by <= 1)."""
    return np.array_split(rng.permutation(n), num_subsets(n, subset_size))
