"""Statistics every study reports with: 95 % Student-t intervals over seeds, seed-paired differences (five seeds
are too few for a percentile bootstrap to cover), and the words a reading may use for an interval."""
from __future__ import annotations

import math

import numpy as np

NOT_RESOLVED = "not resolved"  # an interval spanning 0 with no equivalence margin declared before the runs


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of the mean with a Student-t interval; NaN interval below 2 values."""
    from scipy import stats
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if len(x) == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(x.mean())
    if len(x) < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return mean, mean - half, mean + half


def paired(a: dict, b: dict, level: float = 0.95) -> tuple[float, float, float]:
    """Seed-paired difference a − b over the seeds both have (``{seed: value}``): (mean, low, high)."""
    diffs = [a[s] - b[s] for s in a if s in b and a[s] is not None and b[s] is not None
             and math.isfinite(a[s]) and math.isfinite(b[s])]
    return t_interval(diffs, level)


def fmt_interval(stat: tuple[float, float, float], pattern: str) -> str:
    mean, low, high = stat
    if not math.isfinite(mean):
        return "-"
    if not math.isfinite(low):
        return pattern.format(mean)
    return f"{pattern.format(mean)} [{pattern.format(low)}, {pattern.format(high)}]"


def verdict(stat: tuple[float, float, float], lower_is_better: bool) -> str:
    """'better'/'worse' when the paired interval excludes zero, else 'not resolved': no study here declared an
    equivalence margin before its runs, so an interval that spans zero shows no difference either."""
    _, low, high = stat
    if not (math.isfinite(low) and math.isfinite(high)):
        return NOT_RESOLVED
    if high < 0:
        return "better" if lower_is_better else "worse"
    if low > 0:
        return "worse" if lower_is_better else "better"
    return NOT_RESOLVED
