"""The mechanical rules of ``vidd_plateau``, declared before any unit ran (plan.py's docstring says why each): the cap
from the pilot's curves, the plateau stop, reading a curve at a matched axis value, the tuning choice and the
edge extension of the grids. Pure functions of numbers, tested on synthetic curves (tests/test_study_vidd_plateau.py).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

# --------------------------------------------------------------------------------------------- the cap (pilot)

CAP_FRACTION = 0.9  # the cap is where the pilot's mean evaluation median first reaches 90 % of its rise
CAP_ROUND_S = 100.0  # rounded up to a multiple of this
CAP_BOUNDS_S = (300.0, 500.0)  # and clamped: the 9 core-hour budget bounds it above (plan.py: the arithmetic)


def mean_curve(curves: Sequence[tuple[Sequence[float], Sequence[float]]], grid: Sequence[float]) -> np.ndarray:
    """The mean over runs of ``(x, y)`` curves, each linearly interpolated on ``grid`` (held flat past its ends)."""
    return np.mean([np.interp(grid, np.asarray(x, float), np.asarray(y, float)) for x, y in curves], axis=0)


def cap_from_pilot(curves: Sequence[tuple[Sequence[float], Sequence[float]]], pilot_s: float, n_grid: int = 20,
                   fraction: float = CAP_FRACTION, round_s: float = CAP_ROUND_S,
                   bounds: tuple[float, float] = CAP_BOUNDS_S) -> dict:
    """The equal-CPU cap from the pilot's (training CPU-s, evaluation median) curves, each starting at the pretrained
    model (CPU 0): the first grid point where the seeds' mean curve reaches ``start + fraction * (max - start)``,
    rounded up to ``round_s`` and clamped to ``bounds``. Also whether the mean curve had flattened (the plateau rule
    on it) and whether the bounds cut the cap."""
    grid = np.linspace(0.0, pilot_s, n_grid + 1)
    mean = mean_curve(curves, grid)
    start, top = float(mean[0]), float(mean.max())
    target = start + fraction * (top - start)
    reached = float(grid[int(np.argmax(mean >= target - 1e-12))])
    raw = math.ceil(reached / round_s) * round_s if reached > 0 else round_s
    cap = float(min(bounds[1], max(bounds[0], raw)))
    return {"cap_s": cap, "reached_s": reached, "rounded_s": raw, "clamped": cap != raw, "start": start,
            "max": top, "target": target, "flattened": plateau_reached(list(grid), list(mean), pilot_s, min_frac=0.0),
            "grid": [float(g) for g in grid], "mean_reward_median": [float(m) for m in mean]}


# --------------------------------------------------------------------------------------------- the plateau stop

PLATEAU_MIN_FRACTION = 0.5  # never before half the cap: an early flat stretch of a noisy curve is not a plateau
PLATEAU_WINDOW = 0.25  # "no gain over the last 25 % of the run"


def plateau_reached(cpu: Sequence[float], reward: Sequence[float], cap_s: float,
                    min_frac: float = PLATEAU_MIN_FRACTION, window: float = PLATEAU_WINDOW) -> bool:
    """At the last point (training CPU ``c = cpu[-1]`` >= ``min_frac * cap_s``): no evaluation median in the last
    ``window`` of the run, ``(1 - window) c < cpu <= c``, exceeds the best one before it (the pretrained model's,
    at CPU 0, included)."""
    if len(cpu) < 3 or cpu[-1] < min_frac * cap_s:
        return False
    c = cpu[-1]
    before = [r for x, r in zip(cpu, reward) if x <= (1.0 - window) * c and math.isfinite(r)]
    inside = [r for x, r in zip(cpu, reward) if x > (1.0 - window) * c and math.isfinite(r)]
    return bool(before and inside and max(inside) <= max(before))


def largest_drop(reward: Sequence[float]) -> float:
    """The largest fall of a curve below its running best (0 for a curve that never falls)."""
    best, drop = -math.inf, 0.0
    for r in reward:
        if not math.isfinite(r):
            continue
        best = max(best, r)
        drop = max(drop, best - r)
    return drop


# --------------------------------------------------------------------------------------------- matched values

def value_at(axis: Sequence[float], value: Sequence[float], target: float) -> float | None:
    """``value`` where ``axis`` first reaches ``target`` along the run (linear between evaluation points; the curve
    starts at the pretrained model). None when the run never reaches it: outside its range, not comparable."""
    pts = [(a, v) for a, v in zip(axis, value) if math.isfinite(a) and math.isfinite(v)]
    for (a0, v0), (a1, v1) in zip(pts, pts[1:]):
        if a0 <= target <= a1:
            return v0 if a1 == a0 else v0 + (v1 - v0) * (target - a0) / (a1 - a0)
    if pts and pts[0][0] == target:
        return pts[0][1]
    return None


# --------------------------------------------------------------------------------------------- tuning

def cell_score(runs: Sequence[tuple[Sequence[float], Sequence[float]]], kappa: float) -> dict:
    """One grid cell over its tuning seeds: the mean reward at KL ``kappa`` (each run's reward-KL curve, first
    crossing) when every seed reaches ``kappa``; otherwise flagged short, with the mean final reward."""
    at = [value_at(kl, reward, kappa) for kl, reward in runs]
    final = float(np.mean([reward[-1] for _, reward in runs]))
    if all(a is not None for a in at):
        return {"reaches": True, "score": float(np.mean(at)), "final": final}
    return {"reaches": False, "score": final, "final": final}


def choose_cell(scores: dict[tuple[float, float], dict]) -> tuple[tuple[float, float], bool]:
    """The tuning rule: the highest reward at the declared KL among cells whose seeds all reach it; if none does,
    the highest final reward (``False``: no cell reached the declared KL)."""
    reaching = [c for c, s in scores.items() if s["reaches"]]
    pool = reaching or list(scores)
    return max(pool, key=lambda c: (scores[c]["score"], -c[0])), bool(reaching)


SIDES = (("lr", "low"), ("lr", "high"), ("knob", "low"), ("knob", "high"))


def edge_sides(choice: tuple[float, float], lrs: Sequence[float], knobs: Sequence[float]) -> list[tuple[str, str]]:
    """The grid edges a choice sits on: (axis, side) for axis ``lr`` or ``knob`` (the method's second knob)."""
    out = []
    for axis, values, v in (("lr", lrs, choice[0]), ("knob", knobs, choice[1])):
        if len(values) > 1 and math.isclose(v, min(values)):
            out.append((axis, "low"))
        if len(values) > 1 and math.isclose(v, max(values)):
            out.append((axis, "high"))
    return out


def extend(values: Sequence[float], ext: tuple[float, float], sides: Sequence[str]) -> tuple[float, ...]:
    """``values`` with the declared one-step extension ``ext = (below, above)`` added on each of ``sides``."""
    out = list(values)
    if "low" in sides:
        out.insert(0, ext[0])
    if "high" in sides:
        out.append(ext[1])
    return tuple(out)


def extension_cells(lrs: Sequence[float], knobs: Sequence[float], lr_ext: tuple[float, float],
                    knob_ext: tuple[float, float], sides: Sequence[tuple[str, str]]) -> list[tuple[float, float]]:
    """The cells one extension adds to a method's grid: the product of the extended axes less the base cells."""
    new_lrs = extend(lrs, lr_ext, [s for a, s in sides if a == "lr"])
    new_knobs = extend(knobs, knob_ext, [s for a, s in sides if a == "knob"])
    base = {(lr, k) for lr in lrs for k in knobs}
    return [(lr, k) for lr in new_lrs for k in new_knobs if (lr, k) not in base]
