"""Statistics every study reports with: 95 % Student-t intervals over seeds and seed-paired differences (five seeds
are too few for a percentile bootstrap to cover)."""
from __future__ import annotations

import math

from benchmarks.lift_finetune_stats import fmt_interval, t_interval, verdict

__all__ = ["t_interval", "paired", "fmt_interval", "verdict"]


def paired(a: dict, b: dict, level: float = 0.95) -> tuple[float, float, float]:
    """Seed-paired difference a − b over the seeds both have (``{seed: value}``): (mean, low, high)."""
    diffs = [a[s] - b[s] for s in a if s in b and a[s] is not None and b[s] is not None
             and math.isfinite(a[s]) and math.isfinite(b[s])]
    return t_interval(diffs, level)
