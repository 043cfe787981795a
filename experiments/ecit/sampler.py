"""Pool sampler "cit": the base conditional independence test on subsets of one dataset (E-CIT's parallel part).

config (one sampler per base test, cached by the pool worker; small and JSON-able, never data):
    base      "kci" | "fisherz" | "kci_lp"
    options   causal-learn options of the base test (e.g. {"kernelZ": "Gaussian", "approx": true})
data, either
    published: the (n, d) array put once by ``pool.publish(key, data)`` and named by ``imap(..., weights=key)``;
               each worker fetches it once per version (``load_weights``)
    or in the request: ``"data": <envs.causal.datasets spec>`` (a kind and a seed, or a path), rebuilt by the
               worker and cached (envs.causal.make_dataset)
request:
    x, y, z        column lists (z may be empty)
    split_seed     the E-CIT split: the rows are cut as ``algos.ecit.ecit_pvalue(..., rng=split_seed)`` cuts them
    subset_size    m
    subsets        [start, stop): which of the K = n // m subsets this request tests
    or full: true  the base test on all rows (the full-data baseline) instead of subsets
    -> {"pvalues": [...], "cpu_s": [...] (thread CPU seconds per test), "num_samples": tests}
A request depends on nothing but its fields and the data, so a retried request returns the same p-values.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from algos.ecit import BASES, partition, subset_pvalue, subset_seeds


class SubsetTestSampler:
    KEYS = {"base", "options"}

    def __init__(self, config: dict) -> None:
        unknown = sorted(set(config) - self.KEYS)
        if unknown or config.get("base") not in BASES:
            raise ValueError(f"cit sampler config: unknown keys {unknown} or base {config.get('base')!r} not in "
                             f"{list(BASES)}")
        self.base, self.options = config["base"], dict(config.get("options") or {})
        self.published: np.ndarray | None = None
        self.version = 0
        self._split: tuple[tuple, list[np.ndarray], np.ndarray] | None = None

    def load_weights(self, data: Any, version: int) -> None:
        data = np.asarray(data, dtype=np.float64)
        if data.ndim != 2:
            raise ValueError(f"cit sampler: published data must be 2-D (rows x columns), got shape {data.shape}")
        self.published, self.version = data, version

    def _data(self, request: dict) -> np.ndarray:
        if request.get("data") is not None:
            from envs.causal import make_dataset
            return make_dataset(request["data"]).data
        if self.published is None:
            raise ValueError("cit request: no 'data' spec and no published data (imap(..., weights=key))")
        return self.published

    def _parts(self, n: int, split_seed: int, subset_size: int) -> tuple[list[np.ndarray], np.ndarray]:
        key = (n, split_seed, subset_size)
        if self._split is None or self._split[0] != key:  # consecutive requests usually share a split
            gen = np.random.default_rng(split_seed)
            parts = partition(n, subset_size, gen)
            self._split = (key, parts, subset_seeds(gen, len(parts)))
        return self._split[1], self._split[2]

    def sample(self, request: dict) -> dict:
        data = self._data(request)
        cols = {k: [int(c) for c in request.get(k) or []] for k in ("x", "y", "z")}
        if not cols["x"] or not cols["y"]:
            raise ValueError(f"cit request: x and y need at least one column, got {cols}")
        x, y = data[:, cols["x"]], data[:, cols["y"]]
        z = data[:, cols["z"]] if cols["z"] else None
        pvalues, cpu = [], []
        if request.get("full"):
            start = time.thread_time()
            pvalues.append(subset_pvalue(x, y, z, np.arange(len(data)), self.base,
                                         int(request.get("split_seed", 0)), self.options))
            cpu.append(time.thread_time() - start)
        else:
            parts, seeds = self._parts(len(data), int(request["split_seed"]), int(request["subset_size"]))
            lo, hi = (int(v) for v in request["subsets"])
            if not 0 <= lo < hi <= len(parts):
                raise ValueError(f"cit request: subsets [{lo}, {hi}) outside the {len(parts)} subsets of the split")
            for i in range(lo, hi):
                start = time.thread_time()
                pvalues.append(subset_pvalue(x, y, z, parts[i], self.base, int(seeds[i]), self.options))
                cpu.append(time.thread_time() - start)
        return {"pvalues": pvalues, "cpu_s": cpu, "num_samples": len(pvalues)}
