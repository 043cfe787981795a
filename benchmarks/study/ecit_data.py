"""What the E-CIT studies share (``ecit``, ``ecit_beyond`` and later ones): the triplet data every calibration unit
draws (``DATA``: X -> Z -> Y with Student-t noise; X and Y independent given Z unless ``dependent``), the seed of
each dataset, and the subset p-values E-KCI combines."""
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
