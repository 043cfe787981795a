"""AttnRL vs GRPO vs entropy branching on step-delimited DAG arithmetic; LM rollouts on the shared pool.

    python -m experiments.run experiment=attnrl                                    # compare mode (attnrl, grpo)
    python -m experiments.run experiment=attnrl experiment.methods=[] experiment.method=entropy_tree
    python -m experiments.run experiment=attnrl scale=paper experiment.hf_model=/models/<local HF dir>
    python -m experiments.run experiment=attnrl ... resume=true                    # a killed run continues

One run:
    1. SFT: pretrain the policy on reference solutions (:mod:`experiments.attnrl.sft_stage`; cached as
       ``<run>/sft_model.pt``, or loaded from ``experiment.sft_model``), so RL starts good on short problems and
       poor on long ones;
    2. for each method (compare mode: one after another, every one from the same SFT model) one Ray Train fit runs
       the learner (:mod:`experiments.attnrl.learner`, data-parallel over ``train.num_workers``, resumable mid-run):
       ``algos.attnrl.train.train`` whose ``generate_fn`` sends every generation call to the pool's "lm" samplers
       (split over the workers of the pool's ``gpu`` group, or its default one), with the weights published by version:
       call m of AttnRL's one-step off-policy pipeline carries the initial samples of batch m+1 and the continuations
       of batch m and is sampled by the weights after m updates. Workers compute FCI from the decoding pass and score
       rewards;
    3. greedy evaluation through the pool every ``eval_every_updates``; metrics per update to Parquet; the driver
       plots accuracy vs generated tokens and accuracy by difficulty afterwards (:mod:`experiments.attnrl.plots`).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from algos.attnrl.config import METHODS
from experiments.attnrl.config import Config, check  # noqa: F401 - the registry reads Config, check and run here


def loop_config(cfg: dict, ctx, method: str, sft_path: Path) -> dict:
    return {"experiment": dataclasses.asdict(ctx.typed["experiment"]), "pool": dataclasses.asdict(ctx.typed["pool"]),
            "run_path": str(ctx.run_dir.path), "run_id": ctx.run_id,
            "method": method, "seed": cfg["seed"], "torch_threads": cfg["torch_threads"], "sft_path": str(sft_path)}


def method_summary(df, method: str, token_budget: int) -> dict[str, Any]:
    """One method's results; ``budget_share`` is the share of ``token_budget`` it generated (at most 1: a batch
    that could cross the budget never starts, so a study sees the shortfall here)."""
    rows = df[df["method_id"] == METHODS.index(method)]
    ev = rows.dropna(subset=["eval_accuracy"])
    last = ev.iloc[-1]
    diff_cols = sorted((c for c in ev.columns if c.startswith("eval_acc_d")), key=lambda c: int(c[10:]))
    updates = rows[rows["step"] > 0]
    valid = updates["valid_prompt_ratio"].dropna() if "valid_prompt_ratio" in updates else []
    tokens = int(rows["generated_tokens"].max())
    return {"accuracy": float(last["eval_accuracy"]),
            "accuracy_by_difficulty": {c[10:]: float(last[c]) for c in diff_cols if not math.isnan(last[c])},
            "generated_tokens": tokens, "budget_share": tokens / token_budget,
            "steps": int(rows["policy_version"].max()),
            "valid_ratio": float(valid.mean()) if len(valid) else float("nan"),
            "wall_s": float(rows["wall_s"].max())}


def run(cfg: dict, ctx) -> dict[str, Any]:
    from cluster.metrics import read_metrics
    from cluster.train import fit, stage0
    from experiments.attnrl.learner import train_fn
    from experiments.attnrl.plots import plot_results
    from experiments.attnrl.sft_stage import sft_stage

    exp: Config = ctx.typed["experiment"]
    run_path = ctx.run_dir.path
    sft_path, sft_info, sft_acc, sft_by_d = stage0(sft_stage, exp, run_path, cfg["seed"], train=ctx.typed["train"])
    print(f"AttnRL SFT ({sft_info.get('steps')} steps, {sft_path}): greedy accuracy {sft_acc:.3f} {sft_by_d}",
          flush=True)
    ctx.pool  # create the pool (named) before the learners attach to it
    for method in exp.run_methods:
        fit(train_fn, loop_config(cfg, ctx, method, sft_path), name=f"learner-{method}",
            storage_path=ctx.run_dir.checkpoints, train=ctx.typed["train"])
    df = read_metrics(run_path)
    budget = exp.rl_config(exp.run_methods[0], cfg["seed"]).token_budget
    summary: dict[str, Any] = {
        "sft": {"accuracy": sft_acc, "accuracy_by_difficulty": {str(d): a for d, a in sft_by_d.items()}},
        "methods": {m: method_summary(df, m, budget) for m in exp.run_methods},
        "token_budget": budget,
    }
    summary["plots"] = plot_results(run_path, df, summary)
    for m, s in summary["methods"].items():
        print(f"AttnRL {m}: accuracy {s['accuracy']:.3f} (SFT {sft_acc:.3f}) after {s['steps']} updates, "
              f"{s['generated_tokens']} generated tokens ({s['budget_share']:.0%} of the budget {budget}), "
              f"valid ratio {s['valid_ratio']:.2f}, {s['wall_s']:.0f} s",
              flush=True)
    return summary
