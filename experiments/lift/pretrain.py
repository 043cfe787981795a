"""LIFT stage 1: large-batch, high-UTD SAC pretraining; env rollouts on the shared pool, learner on Ray Train.

    python -m experiments.run experiment=lift_pretrain env=pendulum scale=smoke
    python -m experiments.run experiment=lift_pretrain env=humanoid scale=paper cluster=remote

The driver; the config is ``experiments.lift.pretrain_config``, the learner (one round = collect, remember, update,
publish) ``experiments.lift.pretrain_learner``. The run writes ``policy.pt``, ``agent.pt`` (the full SAC state) and
the Parquet replay of every rank (``data/replay-rank*``, with the physics state on MuJoCo tasks): what stage 2-3
start from.
"""
from __future__ import annotations

from typing import Any

from envs.control.tasks import TASKS
from experiments.lift.plots import plot_learning_curve
from experiments.lift.pretrain_config import task_of
from experiments.lift.pretrain_config import Config, check  # noqa: F401 - the registry's hooks on the entry module


def run(cfg: dict, ctx) -> dict[str, Any]:
    from cluster.metrics import read_metrics
    from cluster.train import fit
    from experiments.lift.driver_common import loop_config
    from experiments.lift.pretrain_learner import train_fn

    task = task_of(cfg)
    ctx.pool  # create the pool (named) before the learner attaches to it
    result = fit(train_fn, loop_config(cfg, ctx, task, change=ctx.typed["experiment"].change), name="learner",
                 storage_path=ctx.run_dir.checkpoints, train=ctx.typed["train"])
    df = read_metrics(ctx.run_dir.path)
    plot = plot_learning_curve(df, ctx.run_dir.path / "plots" / "learning_curve.png",
                               f"LIFT pretraining on {TASKS[task].gym_id}")
    ev = df.dropna(subset=["eval_return"]) if "eval_return" in df else df.iloc[:0]
    summary = {
        "task": TASKS[task].gym_id, "env_steps": int(df["env_steps"].iloc[-1]), "updates": int(df["updates"].iloc[-1]),
        "final_eval_return": float(ev["eval_return"].iloc[-1]) if len(ev) else None,
        "best_eval_return": float(ev["eval_return"].max()) if len(ev) else None,
        "first_eval_return": float(ev["eval_return"].iloc[0]) if len(ev) else None,
        "wall_s": float(df["wall_s"].iloc[-1]), "train_workers": ctx.typed["train"].num_workers,
        "param_max_abs_diff": float(df["param_max_abs_diff"].dropna().iloc[-1]) if "param_max_abs_diff" in df else None,
        "policy": str(ctx.run_dir.path / "policy.pt"), "replay": str(ctx.run_dir.path / "data"),
        "plot": str(plot) if plot else None, "checkpoint": str(result.checkpoint.path) if result.checkpoint else None,
    }
    print(f"LIFT pretrain {summary['task']}: eval return {summary['final_eval_return']} after "
          f"{summary['env_steps']} env steps, {summary['updates']} updates, {summary['wall_s']:.0f} s", flush=True)
    return summary
