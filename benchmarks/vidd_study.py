"""What the VIDD benchmarks (benchmarks/vidd_molecule.py, benchmarks/vidd_dna.py) share: the labelled method variants
and their tuning grids, one resumable run (fine-tune, evaluate at oracle-query milestones), best-of-N curves, and the
statistics (bootstrap intervals over seeds, seed-paired differences).

A run is (variant, grid setting, seed); its result is one JSON file in the output folder, written when the run ends,
so an interrupted study resumes where it stopped. Every variant is tuned over a grid of the same size (3 values of
one hyper-parameter) on tuning seeds that are never reported.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from algos.vidd.config import VIDDConfig
from algos.vidd.finetune import finetune

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Variant:
    """A labelled method: the algos method, the config overrides that define it and the grid it is tuned over."""

    name: str
    label: str
    method: str
    overrides: dict = field(default_factory=dict)
    grid_key: str = "alpha"
    grid: tuple = (0.03, 0.1, 0.3)

    def config(self, base: VIDDConfig, value) -> VIDDConfig:
        return dataclasses.replace(base, **{**COMMON, **self.overrides, self.grid_key: value})


# every setting a variant may change, at the value it has unless the variant says otherwise (so that the base
# config's own choices never leak into a variant): beta 1, K = 5, lr 1e-3, the eq. 7 target
COMMON = dict(alpha=0.1, beta=1.0, refresh_interval=5, lr=1e-3, next_value="denoised", value_model="teacher",
              value_estimator="one_step", timesteps_per_trajectory=None, self_normalize_weights=False,
              exact_teacher_term=False, updates_per_batch=1, value_denominator=True, distill_target="next_state",
              standardize_weights=True, max_log_weight=None, ddpo_clip=0.2, ddpo_inner_steps=2, ddpo_lr=None)
# Alg. 1 as written: values r(x0hat) of p_out's one-step denoising for x_t and xbar_{t-1}, all T steps, raw weights
# (batch-normalised: an Adam-invariant constant), one gradient step per batch, K = 5, beta = 1.
ALG1 = dict(next_value="denoised", value_model="teacher", value_estimator="one_step", timesteps_per_trajectory=None,
            self_normalize_weights=False, exact_teacher_term=False, updates_per_batch=1)
# the tuned hybrid of the earlier benchmark: numerator r of the roll-in's own final sample, per-step normalised
# weights, the exact-teacher control variate, 4 gradient steps per batch
HYBRID = dict(next_value="completion", value_model="teacher", value_estimator="one_step",
              timesteps_per_trajectory=None, self_normalize_weights=True, exact_teacher_term=True, updates_per_batch=4)

VARIANTS: dict[str, Variant] = {v.name: v for v in [
    Variant("vidd_alg1", "VIDD, Algorithm 1 as written", "vidd", ALG1),
    Variant("vidd_released", "VIDD, released code (1 random step/trajectory, x0 target)", "vidd",
            dict(distill_target="final_sample", timesteps_per_trajectory=1, value_model="student",
                 value_estimator="greedy", standardize_weights=True, updates_per_batch=1)),
    Variant("vidd_hybrid", "VIDD, tuned hybrid", "vidd", HYBRID),
    Variant("vidd_hybrid_nodenom", "ablation: tuned hybrid without v(x_t)", "vidd",
            {**HYBRID, "value_denominator": False}),
    Variant("standard_ft", "standard FT (Alg. 1, beta 0, K = inf)", "standard_ft", ALG1),
    Variant("ddpo", "DDPO (released clip 1e-4, 1 step/batch)", "ddpo",
            dict(ddpo_clip=1e-4, ddpo_inner_steps=1, timesteps_per_trajectory=None), "ddpo_lr", (3e-4, 1e-3, 3e-3)),
    Variant("ddpp", "DDPP", "ddpp", dict(beta=0.5, timesteps_per_trajectory=1, updates_per_batch=1)),
    Variant("rw_mle", "RW_MLE (reward-weighted MLE)", "rw_mle",
            dict(timesteps_per_trajectory=1, standardize_weights=True, updates_per_batch=1), "alpha", (0.3, 1.0, 3.0)),
]}


# ------------------------------------------------------------------------------------------ one run

def run_name(variant: str, value, seed: int) -> str:
    return f"{variant}__{value:g}__seed{seed}"


def run_one(out: Path, variant: Variant, value, seed: int, base: VIDDConfig, pre: torch.nn.Module, reward_fn,
            evaluate: Callable[[torch.nn.Module, int], dict], milestones: list[int]) -> dict:
    """Fine-tune ``variant`` at grid ``value`` with ``seed`` (skipped if its JSON exists), evaluating the student at
    each oracle-query milestone and at the end; returns the stored result."""
    path = out / f"{run_name(variant.name, value, seed)}.json"
    if path.is_file():
        return json.loads(path.read_text())
    cfg = variant.config(base, value)
    curve: list[dict] = []
    start = time.perf_counter()

    def eval_fn(model: torch.nn.Module) -> dict:
        return evaluate(model, seed)

    result = finetune(variant.method, pre, reward_fn, cfg, seed=seed, eval_fn=eval_fn, eval_at_queries=milestones)
    for h in result.history:
        if any(k.startswith("eval/") for k in h) and not (curve and h.get("final") and
                                                          curve[-1]["iteration"] == h["iteration"]):
            curve.append({"queries": h["reward_queries"], "trajectories": h["trajectories"],
                          "iteration": h["iteration"], **{k[5:]: v for k, v in h.items() if k.startswith("eval/")}})
    wall = time.perf_counter() - start
    refreshes = sum(1 for h in result.history if h.get("teacher_refreshed"))
    record = {"variant": variant.name, "label": variant.label, "method": variant.method, "grid_key": variant.grid_key,
              "value": value, "seed": seed, "queries": result.reward_queries, "trajectories": result.trajectories,
              "iterations": result.iterations, "teacher_refreshes": refreshes, "wall_s": wall,
              "reward_info": result.reward_info, "final": curve[-1], "curve": curve,
              "config": dataclasses.asdict(cfg)}
    path.write_text(json.dumps(record, indent=1, default=float))
    log.info("%s %s=%g seed %d: median %.3f NLL %.1f div %.3f | %d queries, %d it, %d refreshes, %.0f s",
             variant.name, variant.grid_key, value, seed, record["final"]["reward_median"], record["final"]["nll"],
             record["final"].get("diversity", float("nan")), result.reward_queries, result.iterations, refreshes, wall)
    return record


def best_of_n_curve(out: Path, seed: int, pre: torch.nn.Module, sample_tokens: Callable, score: Callable,
                    n_outputs: int, max_n: int) -> dict:
    """Best-of-N from p_pre for N = 1, 2, 4, ..., max_n on nested subsets of one draw of ``n_outputs * max_n``
    candidates (N = 1: the pretrained model's own samples). ``score(tokens) -> (rewards, metrics of the set)``.
    Each N costs ``N`` oracle calls per output sample at inference time."""
    path = out / f"best_of_n__seed{seed}.json"
    if path.is_file():
        return json.loads(path.read_text())
    start = time.perf_counter()
    tokens = sample_tokens(pre, n_outputs * max_n, seed).reshape(n_outputs, max_n, -1)
    rewards, _ = score(tokens.reshape(n_outputs * max_n, -1), metrics=False)
    rewards = torch.as_tensor(np.asarray(rewards, dtype=np.float64)).reshape(n_outputs, max_n)
    points = []
    n = 1
    while n <= max_n:
        best = rewards[:, :n].nan_to_num(-math.inf).argmax(dim=1)
        chosen = tokens[torch.arange(n_outputs), best]
        _, metrics = score(chosen, metrics=True)
        points.append({"N": n, "inference_queries_per_sample": n, "queries": n * n_outputs, **metrics})
        n *= 2
    record = {"seed": seed, "n_outputs": n_outputs, "points": points, "wall_s": time.perf_counter() - start}
    path.write_text(json.dumps(record, indent=1, default=float))
    return record


# ------------------------------------------------------------------------------------------ statistics

def bootstrap_ci(values, n_boot: int = 10_000, level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``values`` (one per seed) and the percentile bootstrap interval of the mean."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    if not len(x):
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(x.mean()), float(lo), float(hi)


def t_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t interval of ``values`` (e.g. seed-paired differences)."""
    from scipy import stats
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        return float(x.mean()) if len(x) else float("nan"), float("nan"), float("nan")
    half = stats.t.ppf((1 + level) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def paired(a: dict[int, float], b: dict[int, float]) -> tuple[float, float, float, int]:
    """Seed-paired differences ``a - b`` over the seeds both have: mean, t-interval, n."""
    seeds = sorted(set(a) & set(b))
    mean, lo, hi = t_interval([a[s] - b[s] for s in seeds])
    return mean, lo, hi, len(seeds)


def verdict(lo: float, hi: float, direction: int) -> str:
    """``holds`` when the interval excludes 0 in the claimed direction (+1: a > b, -1: a < b)."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "n/a"
    if (direction > 0 and lo > 0) or (direction < 0 and hi < 0):
        return "holds"
    if (direction > 0 and hi < 0) or (direction < 0 and lo > 0):
        return "reversed"
    return "not shown"


def select_setting(records: list[dict], key: str = "reward_median", min_validity: float = 0.9,
                   min_uniqueness: float = 0.5) -> dict[str, float]:
    """Per variant, the grid value with the best mean final ``key`` over the tuning seeds, among the settings whose
    samples stay valid and unique (a collapsed model does not win the grid); the best overall if none qualifies."""
    by_variant: dict[str, dict] = {}
    for r in records:
        by_variant.setdefault(r["variant"], {}).setdefault(r["value"], []).append(r["final"])
    chosen = {}
    for variant, settings in by_variant.items():
        def score(value, require: bool) -> float:
            finals = settings[value]
            ok = all(f.get("validity", 1) >= min_validity and f.get("uniqueness", 1) >= min_uniqueness
                     for f in finals)
            return float(np.mean([f[key] for f in finals])) if ok or not require else -math.inf
        best = max(settings, key=lambda v: score(v, True))
        if score(best, True) == -math.inf:
            best = max(settings, key=lambda v: score(v, False))
        chosen[variant] = best
    return chosen


def load_records(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*__seed*.json")) if not p.name.startswith("best")]
