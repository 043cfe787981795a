"""The ecit_power report's cells: rates with exact intervals, size-adjusted thresholds, subset z shifts and the
rows a table reads (shared by the report and its tables)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from benchmarks.studies.ecit_power.beyond import beyond_nulls
from benchmarks.studies.ecit_power.plan import LEVEL, M
from benchmarks.studies.ecit_power.units import combined

EMPIRICAL, RELEASED = "empirical", "median"


def rate(hits: int, total: int) -> tuple | None:
    """(share, low, high, N) with an exact 95 % interval; None without trials."""
    from scipy.stats import binomtest
    if not total:
        return None
    ci = binomtest(int(hits), int(total)).proportion_ci(0.95)
    return hits / total, ci.low, ci.high, total


def cell(v: tuple | None) -> str:
    return "n/a" if v is None else f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}] (N={v[3]})"


def size_threshold(null_p: list[float], level: float = LEVEL) -> float | None:
    """The largest cut c with #{null p < c} <= level * N: the k-th smallest null p, k = floor(level N) + 1."""
    if len(null_p) < 1 / level:
        return None
    k = int(math.floor(level * len(null_p)))
    return float(np.sort(null_p)[k])


def mean_z(null_subsets: list[list[float]]) -> tuple[float, float, float] | None:
    """Mean z = Phi^-1(1 - p) of null subset p-values (0 if uniform), 95 % interval over datasets."""
    from scipy.stats import norm
    if len(null_subsets) < 2:
        return None
    per = np.array([norm.isf(np.clip(s, 1e-300, 1 - 1e-16)).mean() for s in null_subsets])
    mean = float(np.mean(norm.isf(np.clip(np.concatenate(null_subsets), 1e-300, 1 - 1e-16))))
    half = 1.96 * float(per.std(ddof=1)) / math.sqrt(len(per))
    return mean, mean - half, mean + half


class Rows:
    """Combined p-values per (sub-test, K, width, kind) from this study's records and ecit_beyond's null rows."""

    def __init__(self, records: list[dict], study_root: Path | None):
        self.records = records
        self.beyond = beyond_nulls(study_root)
        self.subsets: dict[tuple, list[list[float]]] = {}
        self._combined: dict[tuple, list[float]] = {}
        for n, recs in self.beyond.items():
            for sub in ("kci", "kci_lp"):
                self.subsets[(sub, n // M, EMPIRICAL, "null")] = [t for r in sorted(recs, key=lambda r: r["seed"])
                                                                 for t in r["tests"][sub]["null"]]
        for r in sorted(records, key=lambda r: (r["unit"], r["seed"] or 0)):
            u = r["unit"]
            if u.startswith(("fznull-", "width-null-", "power-")):
                kind = "alt" if u.startswith("power-") else "null"
                key_k = r["k"] if kind == "null" else f"{r['k']}e{r['setting']['effect_index']}"
                for sub, t in r["tests"].items():
                    base, _, width = sub.partition("@")
                    self.subsets.setdefault((base, key_k, width or EMPIRICAL, kind), []).extend(t[kind])

    def ps(self, sub: str, k, width: str, kind: str) -> list[float]:
        """Combined p-values (cached: scipy's stable cdf costs ~4 ms a value)."""
        key = (sub, k, width, kind)
        if key not in self._combined:
            self._combined[key] = [combined(s) for s in self.subsets.get(key, [])]
        return self._combined[key]

    def type1(self, sub: str, k: int, width: str = EMPIRICAL) -> tuple | None:
        ps = self.ps(sub, k, width, "null")
        return rate(sum(p <= LEVEL for p in ps), len(ps))

    def power(self, sub: str, k: int, e: int, width: str = EMPIRICAL, adjusted: bool = False) -> tuple | None:
        ps = self.ps(sub, f"{k}e{e}", width, "alt")
        cut = LEVEL
        if adjusted:
            cut = size_threshold(self.ps(sub, k, width, "null"))
            if cut is None:
                return None
            return rate(sum(p < cut for p in ps), len(ps))
        return rate(sum(p <= cut for p in ps), len(ps))

    def paired_rejects(self, sub: str, k: int, e: int, width: str = EMPIRICAL, adjusted: bool = False):
        """Per alternative dataset, 1 if rejected (same order in every sub-test and width: paired)."""
        ps = self.ps(sub, f"{k}e{e}", width, "alt")
        cut = size_threshold(self.ps(sub, k, width, "null")) if adjusted else None
        if adjusted and cut is None:
            return None
        return [float(p < cut) if adjusted else float(p <= LEVEL) for p in ps]


def paired_diff(a: list[float] | None, b: list[float] | None) -> tuple[float, float, float] | None:
    from benchmarks.study.stats import t_interval
    if not a or not b or len(a) != len(b) or len(a) < 2:
        return None
    return t_interval([x - y for x, y in zip(a, b)])


def _fmt(d: tuple | None) -> str:
    return "n/a" if d is None else f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]"
