"""The unit every fine-tuning method of the VIDD budget studies runs (``vidd_budget``, ``vidd_budget_molecule``): its
tuning cell or the one its tuning records chose, one run to the budget with evaluations at the budget's fractions,
and the diagnostics of its weights and iterations."""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from benchmarks.studies.vidd_budget.plan import (ALL_METHODS, FRACTIONS, STUDY_NAME, TUNE_SEEDS, VIDD_FAMILY, grid_of,
                                                 method_config, name_of, tune_name)
from benchmarks.study.core import StudyError, UnitContext
from benchmarks.study.vidd_common import MIN_UNIQUENESS, MIN_VALIDITY, Task, nll_ceiling, spec_of


def tuning_cells(method: str, records: dict[str, dict]) -> dict[tuple[float, float | None], dict]:
    """Per grid cell, the mean over tuning seeds of what the rule reads; refuses (one line) when a record is missing."""
    cells = {}
    for lr, alpha in grid_of(method):
        names = [tune_name(method, lr, alpha, s) for s in TUNE_SEEDS]
        missing = [n for n in names if n not in records]
        if missing:
            raise StudyError(f"{STUDY_NAME}: {method} has no tuning record {missing[0]}; run its tuning units first "
                             "(a reported unit never falls back to a default setting)")
        finals = [records[n]["metrics"] for n in names]
        cells[(lr, alpha)] = {k: float(np.mean([f[k] for f in finals]))
                              for k in ("reward_median", "nll", "validity", "uniqueness")}
    return cells


def select_cell(cells: dict, ceiling: float) -> tuple[tuple[float, float | None], bool]:
    ok = [c for c, r in cells.items()
          if r["nll"] <= ceiling and r["validity"] >= MIN_VALIDITY and r["uniqueness"] >= MIN_UNIQUENESS]
    if ok:
        return max(ok, key=lambda c: cells[c]["reward_median"]), True
    return min(cells, key=lambda c: cells[c]["nll"]), False


DIAGNOSTICS = ("transitions_per_iteration", "weight_ess", "weight_ess_fraction", "weight_abs_dev_mean",
               "group_size_min", "group_size_mean")


def diagnostics(history: list[dict]) -> dict:
    """Means over a run's iterations of the weight diagnostics (those a method records) and of transitions per
    teacher refresh."""
    out = {}
    for key in DIAGNOSTICS:
        vals = [h[key] for h in history if key in h and math.isfinite(h[key])]
        if vals:
            out[key] = float(np.mean(vals))
    per_refresh = [h["transitions_per_refresh"] for h in history if "transitions_per_refresh" in h]
    if per_refresh:
        out["transitions_per_refresh"] = float(np.mean(per_refresh))
    return out


def budget_unit(ctx: UnitContext) -> dict:
    """One (method, cell, seed): fine-tune to the budget; reported units evaluate at each of :data:`FRACTIONS`. A
    unit whose setting fixes ``lr`` (the molecule check, ``vidd_budget_molecule``) runs it without tuning records."""
    from algos.vidd.finetune import finetune
    spec = spec_of(ctx.study)
    method = ctx.setting["method"]
    tuning = None
    if ctx.unit.role == "report" and "lr" in ctx.setting:
        lr, alpha = float(ctx.setting["lr"]), ctx.setting["alpha"]
        tuning = {"qualified": None, "chosen": {"lr": lr, "alpha": alpha}, "grid": {}, "fixed": True}
        budget = int(spec.size(ctx, "budget"))
    elif ctx.unit.role == "tune":
        lr, alpha = float(ctx.setting["lr"]), ctx.setting["alpha"]
        budget = int(spec.size(ctx, "tune_budget"))
    else:
        records = ctx.records()
        cells = tuning_cells(method, records)
        (lr, alpha), qualified = select_cell(cells, nll_ceiling(spec, records))
        tuning = {"qualified": qualified, "chosen": {"lr": lr, "alpha": alpha},
                  "grid": {f"lr{name_of(c[0])}" + ("" if c[1] is None else f"-a{name_of(c[1])}"): v
                           for c, v in cells.items()}}
        budget = int(spec.size(ctx, "budget"))
    task = Task(spec, ctx)
    cfg = method_config(ctx, method, lr, alpha, budget, spec)
    milestones = [] if tuning is None else [int(f * budget) for f in FRACTIONS[:-1]]
    n_curve, n_eval = spec.size(ctx, "curve_samples"), spec.size(ctx, "eval_samples")
    points: list[dict] = []

    def eval_fn(model) -> dict:
        return task.evaluate(model, ctx.seed, n_curve, stream=1 + len(points))

    def log_fn(iteration: int, metrics: dict) -> None:
        if "eval/reward_median" in metrics:
            points.append(metrics)
        if iteration % 10 == 0:
            ctx.progress(metrics["reward_queries"], budget, "queries", iteration=iteration)

    t0 = time.perf_counter()
    result = finetune(ALL_METHODS[method][0], task.pre, task.reward, cfg, seed=int(ctx.seed), log_fn=log_fn,
                      eval_fn=eval_fn if milestones else None, eval_at_queries=milestones, final_eval=False)
    train_s = time.perf_counter() - t0
    final = task.evaluate(result.model, ctx.seed, n_eval, stream=0)
    refreshes = sum(1 for h in result.history if h.get("teacher_refreshed"))
    if method in VIDD_FAMILY and tuning is not None and refreshes < spec.size(ctx, "min_refreshes"):
        raise StudyError(f"{ctx.study}/{ctx.unit.name}: {refreshes} teacher refreshes, fewer than "
                         f"{spec.size(ctx, 'min_refreshes')}: not reported")
    if result.reward_queries > budget:
        raise StudyError(f"{ctx.study}/{ctx.unit.name}: {result.reward_queries} queries exceed the budget {budget}")
    curves = {"queries": [p["reward_queries"] for p in points] + [result.reward_queries],
              **{k: [p[f"eval/{k}"] for p in points] + [final[k]]
                 for k in ("reward_median", "nll", "eval_reward_median") if k in final}}
    metrics = {**final, "queries": result.reward_queries, "iterations": result.iterations,
               "teacher_refreshes": refreshes, "trajectories": result.trajectories, "lr": lr,
               "alpha": alpha, "train_s": train_s}
    body = {"metrics": metrics, "curves": curves, "diagnostics": diagnostics(result.history),
            "config": {k: v for k, v in dataclasses.asdict(cfg).items() if not isinstance(v, list)}}
    if tuning is not None:
        body["tuning"] = tuning
    return body
