"""Reward-oracle queries and their accounting: every method is compared at one budget of distinct oracle queries.

An oracle is a batched callable ``tokens [B, L] -> (rewards [B], info)``; ``info`` holds counts such as invalid
molecules. The oracles are deterministic, so a sequence queried twice in one call costs one query.

Non-finite rewards (NaN, inf: a failing surrogate, an overflowing score) are never passed on as numbers: the counter
returns NaN for them and counts them in ``info["n_nonfinite"]``, and every consumer skips NaN rows (VIDD drops the
transition, DDPO/DDPP/RW_MLE the trajectory, best-of-N never selects it, evaluation statistics leave it out).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
from torch import Tensor

RewardFn = Callable[[Tensor], tuple[np.ndarray, dict]]


class RewardCounter:
    """Wraps a batched reward oracle and counts every query against an optional budget.

    Identical token rows inside one call are scored once, so ``n_queries`` is the number of distinct sequences sent
    to the oracle. The oracle's own ``info`` counts (invalid molecules, errors, ...) are summed in ``info``.
    """

    def __init__(self, reward_fn: RewardFn, budget: int | None = None) -> None:
        self.reward_fn = reward_fn
        self.budget = budget
        self.n_queries = 0
        self.info: dict[str, float] = {}

    @property
    def remaining(self) -> int | float:
        return math.inf if self.budget is None else self.budget - self.n_queries

    def __call__(self, tokens: Tensor) -> tuple[Tensor, dict]:
        """Rewards ``[B]`` (float32, CPU; NaN where the oracle returned a non-finite value) and this call's info."""
        if tokens.shape[0] == 0:
            return torch.zeros(0), {}
        unique, inverse = torch.unique(tokens.cpu(), dim=0, return_inverse=True)
        if unique.shape[0] > self.remaining:
            raise RuntimeError(f"reward budget exceeded: {unique.shape[0]} queries, {self.remaining} left")
        raw, info = self.reward_fn(unique)
        self.n_queries += unique.shape[0]
        rewards, n_bad = finite_or_nan(raw, unique.shape[0])
        info = dict(info)
        info["n_nonfinite"] = info.get("n_nonfinite", 0) + n_bad
        for key, value in info.items():
            if isinstance(value, (int, float)) and key != "n_queries":
                self.info[key] = self.info.get(key, 0) + value
        return rewards[inverse], info


def finite_or_nan(rewards, n: int) -> tuple[Tensor, int]:
    """``rewards`` as a float32 tensor of length ``n`` with every non-finite value (or one that overflows float32)
    replaced by NaN, and how many there were."""
    values = np.asarray(rewards, dtype=np.float64).reshape(-1)
    if len(values) != n:
        raise ValueError(f"oracle returned {len(values)} rewards for {n} sequences")
    bad = ~np.isfinite(values) | (np.abs(values) > np.finfo(np.float32).max)
    return torch.as_tensor(np.where(bad, np.nan, values), dtype=torch.float32), int(bad.sum())


def distinct_rows(*tensors: Tensor) -> int:
    """Number of distinct rows over ``tensors``: the oracle queries a :class:`RewardCounter` call would cost."""
    rows = torch.cat(tensors)
    return 0 if rows.shape[0] == 0 else torch.unique(rows, dim=0).shape[0]


def largest_prefix_within(current: Tensor, following: Tensor, budget: int) -> int:
    """Largest ``n`` such that the first ``n`` transitions' value queries (distinct rows) fit in ``budget``."""
    low, high = 0, current.shape[0]  # the cost of a prefix never decreases with its length: bisect
    while low < high:
        mid = (low + high + 1) // 2
        if distinct_rows(current[:mid], following[:mid]) <= budget:
            low = mid
        else:
            high = mid - 1
    return low
