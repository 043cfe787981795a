"""LIFT stages 2-3: physics-informed world model from the pretraining replay, then safe finetuning in a changed env.

    python -m experiments.run experiment=lift_finetune env=inverted_pendulum experiment.pretrain_run=<lift_pretrain run>
    python -m experiments.run experiment=lift_finetune env=walker2d experiment.pretrain_run=... \
        experiment.methods=[lift,sac_finetune,mbpo_wm]             # compare mode (the tour)

Methods (``experiment.method``; ``experiment.methods`` runs several one after another, each its own fit; the table is
``finetune_config.METHOD_SPECS``):
  lift                  physics-informed world model; the real env only ever receives deterministic actions
                        (its pool sampler is built with ``deterministic_only=true`` and refuses anything else)
  sac_finetune          plain SAC finetuning with stochastic exploration in the real env, no model, UTD 1
  sac_finetune_matched  the same at LIFT's number of SAC steps per real step (HUPT(e) x updates_per_rollout per epoch)
  mbpo_wm               LIFT's loop with MBPO's black-box ensemble
  lift_stochastic       LIFT collecting its real data with stochastic actions (isolates deterministic collection)
  lift_prior_only       LIFT's model without the residual force (the rigid-body prior only; no contacts)
  lift_residual_only    LIFT's model without the prior (M = I, no bias forces: the residual is the acceleration)
  lift_frozen_model     LIFT with the stage-2 model never refitted (does the refit carry the gain?)
  sac_deterministic     no model, deterministic real actions, LIFT's SAC steps per epoch (the 2x2's fourth cell)

Stage 2 (learner, once per world-model kind, cached in the pretraining run's wm/): fit the model on the pretraining
Parquet replay (the simulator's ``ctrl`` is the model's action) with early stopping.
Stage 3, per epoch e, in the order of LIFT's ``finetune_wm_ac.py`` (after a prefill of the real and model buffers;
the table beside the official code, with every departure: ``algos/lift/README.md``):
  1. retrain the model on all real data of the changed env (random 20 % hold-out, early stopping on its mean squared
     error, warm start, scalers refit);
  2. collect ``real_steps_per_epoch`` real steps through the pool with the deterministic policy, into the real buffer
     and the model buffer (LIFT's SAC buffer, sized HUPT(e)·rollout_batch·H(e) whenever H changes);
  3. HUPT(e) x {``rollout_batch`` start states from the real buffer -> H(e)-step model rollouts with the stochastic
     policy, the actor seeing the model's std as observation noise -> the model buffer;
     ``updates_per_rollout`` SAC steps on batches with ``real_ratio`` real data};
  4. deterministic evaluation in the changed env (pool), metrics, checkpoint.
Actor, critics, targets, normalizer and Adam states come from pretraining (``agent.pt``); the temperature is reset
(LIFT's ``sac_init_log_alpha``) and the learning rates, gamma, tau are LIFT's finetune values (``experiment.sac``), fp32.

Changes: any ``envs.control.changes`` spec; with a command-conditioned pretraining (``experiment.change`` of
lift_pretrain = target_velocity over [0, v_max]) the finetuning env carries the command too, e.g. LIFT's own
out-of-range command ``{target_velocity: {command_range: [1.5 v_max, 1.5 v_max]}}``, or an in-range command with a
physics change ``{target_velocity: {command_range: [v, v]}, friction: {scale: 0.4}}``.

Recovery (summary ``real_steps_to_recover``): the first real-env step count (prefill included) at which the
deterministic evaluation return in the changed env reaches ``zero_shot + 0.8 (pre_change - zero_shot)``, i.e. the
policy has won back 80 % of the return the change took away (pre_change: the pretrained policy in the reference env,
by default the pretraining env; zero_shot: the pretrained policy in the changed env). None if never reached.
Safety: falls (real-env terminations) per 1000 real steps, the worst joint excursion past a stop, joint speed and
torso tilt (``envs.control.safety``).

DDP: with several Train workers every rank drives its own real env shard and world model; SAC gradients are averaged
and the observation normalizer is merged across ranks, so the policy stays identical on all ranks.

The driver; the config is ``experiments.lift.finetune_config``, the learner (stage 2 and the epoch loop)
``experiments.lift.finetune_learner``, the world models' construction and fit ``experiments.lift.world_models``.
"""
from __future__ import annotations

import logging
from typing import Any

from envs.control.tasks import TASKS
from experiments.lift.finetune_config import METHODS, Config, finetune_envs, pretrain_files, task_of
from experiments.lift.finetune_config import check  # noqa: F401 - the registry's hook on the entry module
from experiments.lift.plots import plot_recovery

log = logging.getLogger(__name__)


def method_rows(df, method: str):
    """The metric rows of one method's learner (compare mode writes every method into the run's metrics), in order of
    real env steps."""
    return df[df["method_id"] == METHODS.index(method)].sort_values("real_env_steps")


def summarise(df, methods: list[str], pre_change: float, zero_shot: float) -> dict[str, dict]:
    """Per method: final and best return after finetuning, real steps to recover 80 %, falls (total and per 1000 real
    steps), the worst excursions, real steps, SAC steps, wall s."""
    from algos.lift.finetune import steps_to_recover
    out = {}
    for m in methods:
        rows = method_rows(df, m)
        ev = rows.dropna(subset=["eval_return"])
        trained = ev[ev["epoch"] >= 0]
        last = rows.iloc[-1] if len(rows) else {}
        real_steps = int(rows["real_env_steps"].max()) if len(rows) else 0
        falls = int(rows["falls_total"].max()) if "falls_total" in rows and len(rows) else 0
        out[m] = {
            "final_return": float(trained["eval_return"].iloc[-1]) if len(trained) else None,
            "best_return": float(trained["eval_return"].max()) if len(trained) else None,
            "real_steps_to_recover": steps_to_recover(ev["real_env_steps"].to_numpy(), ev["eval_return"].to_numpy(),
                                                      pre_change, zero_shot),
            "falls": falls,
            "falls_per_1000": 1000.0 * falls / real_steps if real_steps else None,
            **{f"max_{k}": _finite(last, f"max_{k}_total") for k in ("joint_excursion", "joint_speed", "torso_tilt")},
            "real_steps": real_steps,
            "sac_updates": int(rows["updates"].max() - rows["updates"].min()) if len(rows) else 0,
            "wall_s": float(rows["wall_s"].max()) if len(rows) else 0.0,
        }
    return out


def _finite(row, key: str) -> float | None:
    import math
    value = row.get(key) if hasattr(row, "get") else None
    return float(value) if value is not None and math.isfinite(float(value)) else None


def run(cfg: dict, ctx) -> dict[str, Any]:
    import torch

    from cluster.metrics import read_metrics
    from cluster.train import fit
    from experiments.lift.driver_common import evaluate_policy, loop_config
    from experiments.lift.finetune_learner import train_fn

    exp: Config = ctx.typed["experiment"]
    task = task_of(cfg)
    files = pretrain_files(exp.pretrain_run)
    change, reference = finetune_envs(exp, task)
    methods = exp.method_list()
    pool = ctx.pool
    pretrained_key = f"{ctx.run_id}/pretrained"
    pool.publish(pretrained_key, torch.load(files["policy"], weights_only=True, map_location="cpu"))
    pre_change, zero_shot = (
        evaluate_policy(pool, pretrained_key, {"task": task, "num_envs": exp.eval_episodes, "seed": cfg["seed"],
                                               "change": c, "physics_state": False}, exp.eval_episodes, cfg["seed"])
        for c in (reference, change))
    log.info("pretrained policy: %.1f in the reference env (%s), %.1f zero-shot in the changed env (%s)", pre_change,
             reference, zero_shot, change)
    for m in methods:
        loop = loop_config(cfg, ctx, task, change=change, method=m, agent_path=str(files["agent"]),
                           replay=[str(p) for p in files["replay"]], pretrain_run=str(files["run"]),
                           pre_change_return=pre_change, zero_shot_return=zero_shot)
        fit(train_fn, loop, name=f"learner-{m}", storage_path=ctx.run_dir.checkpoints, train=ctx.typed["train"])
    df = read_metrics(ctx.run_dir.path)
    plot = plot_recovery({m: method_rows(df, m) for m in methods}, pre_change, zero_shot,
                         ctx.run_dir.path / "plots" / "finetune_recovery.png",
                         f"LIFT finetuning on {TASKS[task].gym_id} with {change}")
    summary = {"task": TASKS[task].gym_id, "change": change, "reference_change": reference,
               "pre_change_return": pre_change, "zero_shot_return": zero_shot,
               "methods": summarise(df, methods, pre_change, zero_shot), "plot": str(plot)}
    for m, s in summary["methods"].items():
        print(f"LIFT finetune {summary['task']} [{m}]: final {s['final_return']}, best {s['best_return']}, recovered "
              f"at {s['real_steps_to_recover']} real steps, {s['falls']} falls, {s['wall_s']:.0f} s", flush=True)
    return summary
