"""The ecit_power report (plan: :mod:`benchmarks.studies.ecit_power.plan`): whatever records exist, partial tables
marked as such; ecit_beyond's null rows and Sachs graphs read from its records."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from benchmarks.studies.ecit_power.beyond import beyond_nulls, beyond_sachs
from benchmarks.studies.ecit_power.plan import LEVEL, M, STUDY, TUNE_SEEDS, TUNED
from benchmarks.studies.ecit_power.sachs import sachs_lines
from benchmarks.studies.ecit_power.units import combined, tuned_effects

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


def report(records: list[dict], out_dir: Path) -> str:
    from benchmarks.studies.ecit_power.report_tables import (dial_lines, equal_cpu_lines, power_lines, predictions,
                                                             reading, tuning_lines, width_lines)
    plan = STUDY.plan()
    by = {r["unit"]: r for r in records}
    reported = [u for u in plan if u.role == "report"]
    done = sum(u.name in by for u in reported)
    study_root = Path(out_dir).parent
    partial = done < len(reported)
    lines = ["## E-CIT at many subsets: the power the exact null costs, where it breaks, the released width (issue 51)",
             "", f"Records: `benchmarks/studies/ecit_power/records/` ({sum(u.name in by for u in plan)} of {len(plan)} "
             f"units; reported units {done} of {len(reported)}"
             + (": **partial**, every table reads only the records there are" if partial else "")
             + f"), {sum(r.get('cpu_s', 0.0) for r in records) / 3600:.2f} core-hours. Plan, predictions and the "
             "authors' first objection fixed in `benchmarks/studies/ecit_power/plan.py` before any reported unit "
             "ran; reused rows read from ecit_beyond's records (its null datasets, subsets and seeds: the same "
             "data). Command: `nice -n 19 python -m benchmarks.study ecit_power run`, then `... ecit_power report`. "
             f"Subsets of {M} rows, combiner {TUNED}, level {LEVEL}; intervals exact binomial 95 %, pooled over seeds "
             "10-14.", "",
             "**The authors' first objection**: \"power at an effect shrunk for each K hides what E-CIT is for (at a "
             "fixed effect its power goes to 1 as K grows), and you test with a sub-test and a width that are not "
             "ours.\" The answer in the design: a fixed effect saturates (both tests read ~1.00 at K = 160 and the "
             "null's cost is invisible), so the effects are tuned per K to mid power on tuning seeds, and the tuning "
             "table below is the fixed-effect view across K; the released width (`est_width='median'`) is a named "
             "option and the K = 160 rows run under both widths; kci_lp is the released KCI statistic with another "
             "null, and gamma KCI's size-adjusted power is the control that isolates what that null costs; the "
             "paper's own comparison (E-CIT against the base test on all rows) is made at equal CPU.", ""]
    rows = Rows(records, study_root)
    tunes = {u: r for u, r in by.items() if r["role"] == "tune"}
    tuned = tuned_effects(tunes, TUNE_SEEDS) if len(tunes) >= len(TUNE_SEEDS) else None
    lines += tuning_lines(tunes, tuned)
    lines += power_lines(rows, tuned, by)
    lines += width_lines(rows)
    lines += equal_cpu_lines(records)
    lines += dial_lines(records)
    lines += sachs_lines(beyond_sachs(study_root))
    lines += predictions(rows, records, partial)
    lines += reading(rows, records)
    return "\n".join(lines)

