"""What the E-CIT studies share (``ecit``, ``ecit_beyond`` and later ones): the triplet data every calibration unit
draws (``DATA``: X -> Z -> Y with Student-t noise; X and Y independent given Z unless ``dependent``), the seed of
each dataset, the subset p-values E-KCI combines, and how far null p-values sit from uniform (``null_shift``)."""
from __future__ import annotations

import time

import numpy as np

DATA = {"dz": 1, "noise": "t3", "effect": 0.5, "nonlinear": True}


def _seed(*words: int) -> int:
    return int(np.random.SeedSequence([int(w) for w in words]).generate_state(1, dtype=np.uint64)[0] % 2**63)


def _triplet(seed: int, n: int, rep: int, dependent: bool, kind: dict = DATA) -> np.ndarray:
    from envs.causal import make_dataset
    return make_dataset({"kind": "triplet", "n": n, "seed": _seed(seed, n, rep, int(dependent)),
                         "dependent": dependent, **kind}).data


def _subset_pvalues(data: np.ndarray, m: int, split_seed: int, base: str = "kci") -> tuple[list[float], float]:
    from algos.ecit import ecit_pvalue
    start = time.process_time()
    _, subs = ecit_pvalue(data[:, :1], data[:, 1:2], data[:, 2:], base=base, subset_size=m, rng=split_seed,
                          return_subsets=True)
    return [float(p) for p in subs], time.process_time() - start


def null_shift(null_tests: list[list[float]], level: float = 0.05) -> dict[str, float]:
    """Mean z = Phi^-1(1 - p) of null p-values (0 if uniform) with a 95 % interval over datasets (a dataset's
    subsets share its functions and coefficients, so subsets are not independent draws), the share <= level, and
    the sd of z."""
    from scipy.stats import norm
    ps = np.concatenate([np.asarray(t, dtype=float) for t in null_tests])
    z = norm.isf(np.clip(ps, 1e-300, 1.0 - 1e-16))
    per = np.array([float(norm.isf(np.clip(np.asarray(t, dtype=float), 1e-300, 1.0 - 1e-16)).mean())
                    for t in null_tests])
    half = 1.96 * float(per.std(ddof=1)) / np.sqrt(len(per)) if len(per) > 1 else float("nan")
    mean = float(z.mean())
    return {"count": int(z.size), "datasets": len(null_tests), "mean": mean, "low": mean - half,
            "high": mean + half, "sd": float(z.std(ddof=1)) if z.size > 1 else float("nan"),
            "share_below_level": float(np.mean(ps <= level))}
