"""LIFT stages 2-3: physics-informed world model from the pretraining replay, then safe finetuning in a changed env.

    python -m experiments.run experiment=lift_finetune env=inverted_pendulum experiment.pretrain_run=<lift_pretrain run>
    python -m experiments.run experiment=lift_finetune env=walker2d experiment.pretrain_run=... \
        experiment.methods=[lift,sac_finetune,mbpo_wm]             # compare mode (the tour)

Methods (``experiment.method``; ``experiment.methods`` runs several one after another, each its own fit):
  lift          physics-informed world model; the real env only ever receives deterministic actions
                (its pool sampler is built with ``deterministic_only=true`` and refuses anything else)
  mbpo_wm       the same loop with the black-box MBPO ensemble (baseline b)
  sac_finetune  plain SAC finetuning with stochastic exploration in the real env, no model (baseline a)

Stage 2 (learner, once per world-model kind, cached under run_dir/wm/): fit the model on the pretraining Parquet replay
(the simulator's ``ctrl`` is the model's action) with early stopping.
Stage 3, per epoch e, in the order of LIFT's ``finetune_wm_ac.py`` (after a deterministic prefill of the real buffer):
  1. retrain the model on all real data of the changed env (early stopping, warm start);
  2. collect ``real_steps_per_epoch`` real steps through the pool with the deterministic policy;
  3. HUPT(e) x {``rollout_batch`` start states from the real buffer -> H(e)-step model rollouts with the stochastic
     policy -> model buffer; ``updates_per_rollout`` SAC steps on batches with ``real_ratio`` real data};
  4. deterministic evaluation in the changed env (pool), metrics, checkpoint.
Actor, critics, targets, normalizer and Adam states come from pretraining (``agent.pt``); the temperature is reset
(LIFT's ``sac_init_log_alpha``) and the learning rates, gamma, tau are LIFT's finetune values (``experiment.sac``).

Recovery (summary ``real_steps_to_recover``): the first real-env step count (prefill included) at which the
deterministic evaluation return in the changed env reaches ``zero_shot + 0.8 (pre_change - zero_shot)``, i.e. the
policy has won back 80 % of the return the change took away (pre_change: the pretrained policy in the original env;
zero_shot: the pretrained policy in the changed env). None if never reached.

DDP: with several Train workers every rank drives its own real env shard and world model; SAC gradients are averaged
and the observation normalizer is merged across ranks, so the policy stays identical on all ranks.

The driver; the config is ``experiments.lift.finetune_config``, the learner (stage 2 and the epoch loop)
``experiments.lift.finetune_learner``, the world models' construction and fit ``experiments.lift.world_models``.
"""
from __future__ import annotations

import logging
from typing import Any

from envs.control.tasks import TASKS
from experiments.lift.finetune_config import DEFAULT_CHANGES, METHODS, Config, pretrain_files, task_of
from experiments.lift.finetune_config import check  # noqa: F401 - the registry's hook on the entry module
from experiments.lift.plots import plot_recovery

log = logging.getLogger(__name__)


def method_rows(df, method: str):
    """The metric rows of one method's learner (compare mode writes every method into the run's metrics), in order of
    real env steps."""
    return df[df["method_id"] == METHODS.index(method)].sort_values("real_env_steps")


def summarise(df, methods: list[str], pre_change: float, zero_shot: float) -> dict[str, dict]:
    """Per method: final and best return after finetuning, real steps to recover 80 %, falls, real steps, wall s."""
    from algos.lift.finetune import steps_to_recover
    out = {}
    for m in methods:
        rows = method_rows(df, m)
        ev = rows.dropna(subset=["eval_return"])
        trained = ev[ev["epoch"] >= 0]
        out[m] = {
            "final_return": float(trained["eval_return"].iloc[-1]) if len(trained) else None,
            "best_return": float(trained["eval_return"].max()) if len(trained) else None,
            "real_steps_to_recover": steps_to_recover(ev["real_env_steps"].to_numpy(), ev["eval_return"].to_numpy(),
                                                      pre_change, zero_shot),
            "falls": int(rows["falls_total"].max()) if "falls_total" in rows and len(rows) else 0,
            "real_steps": int(rows["real_env_steps"].max()) if len(rows) else 0,
            "wall_s": float(rows["wall_s"].max()) if len(rows) else 0.0,
        }
    return out


def run(cfg: dict, ctx) -> dict[str, Any]:
    import torch

    from cluster.metrics import read_metrics
    from cluster.train import fit
    from experiments.lift.driver_common import evaluate_policy, loop_config
    from experiments.lift.finetune_learner import train_fn

    exp: Config = ctx.typed["experiment"]
    task = task_of(cfg)
    files = pretrain_files(exp.pretrain_run)
    change = exp.change or DEFAULT_CHANGES[task]
    methods = exp.method_list()
    pool = ctx.pool
    run_id = f"{cfg['experiment']['name']}/{ctx.run_dir.name}"
    pretrained_key = f"{run_id}/pretrained"
    pool.publish(pretrained_key, torch.load(files["policy"], weights_only=True))
    pre_change, zero_shot = (
        evaluate_policy(pool, pretrained_key, {"task": task, "num_envs": exp.eval_episodes, "seed": cfg["seed"],
                                               "change": c, "physics_state": False}, exp.eval_episodes, cfg["seed"])
        for c in (None, change))
    log.info("pretrained policy: %.1f in the original env, %.1f zero-shot in the changed env (%s)", pre_change,
             zero_shot, change)
    for m in methods:
        loop = loop_config(cfg, ctx, task, change=change, method=m, agent_path=str(files["agent"]),
                           replay=[str(p) for p in files["replay"]], zero_shot_return=zero_shot)
        fit(train_fn, loop, name=f"learner-{m}", storage_path=ctx.run_dir.checkpoints, train=ctx.typed["train"])
    df = read_metrics(ctx.run_dir.path)
    plot = plot_recovery({m: method_rows(df, m) for m in methods}, pre_change, zero_shot,
                         ctx.run_dir.path / "plots" / "finetune_recovery.png",
                         f"LIFT finetuning on {TASKS[task].gym_id} with {change}")
    summary = {"task": TASKS[task].gym_id, "change": change, "pre_change_return": pre_change,
               "zero_shot_return": zero_shot, "methods": summarise(df, methods, pre_change, zero_shot),
               "plot": str(plot)}
    for m, s in summary["methods"].items():
        print(f"LIFT finetune {summary['task']} [{m}]: final {s['final_return']}, best {s['best_return']}, recovered "
              f"at {s['real_steps_to_recover']} real steps, {s['falls']} falls, {s['wall_s']:.0f} s", flush=True)
    return summary
