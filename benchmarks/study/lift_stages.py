"""The stages every LIFT study on Walker2d runs (the first study's, issue 23, archived in
``benchmarks/studies/archive/lift``; ``lift_official`` and later studies call them): the pretraining stage and its
stage-2 world models, the gate that picks a change the pretrained policy does not keep, and one finetuning run by
the learner a cluster job runs, with its record body. A study's plan (which changes, methods, seeds, coefficients)
stays in its own folder, ``benchmarks/studies/<study>/``."""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from benchmarks.study.core import UnitContext
from benchmarks.study.stats import t_interval

log = logging.getLogger(__name__)
TASK = "walker2d"
PRETRAIN_SEED = 0
PRETRAIN_STEPS = 100_000
WM_KINDS = ("physics", "blackbox", "prior_only", "residual_only")
GATE_EPISODES = 10
KEEP_LIMIT = 0.8  # a change the policy keeps this share of its return under is too weak to study recovery
# The finetuning loop's sizes (experiments.lift.finetune_config.Config), fitted to ~3 core-hours for the study:
# LIFT's structure with its schedules shrunk (horizon 1 -> 5, 4 -> 16 branches of 20 SAC steps per 250 real steps,
# i.e. 0.3 -> 1.3 SAC steps per real step where LIFT does 20) and the world model's retraining cut to <= 100 Adam
# steps per epoch (early stopping after 3 checks of 25 without a 1 % gain): at 200 it was 57 % of a LIFT unit's CPU.
STUDY_EXP: dict[str, Any] = dict(
    epochs=16, real_steps_per_epoch=250, prefill_steps=0, num_real_envs=2, rollout_batch=400,
    horizon_schedule=[0, 8, 1, 5], hupt_schedule=[0, 4, 4, 16], updates_per_rollout=20, real_ratio=0.06,
    wm_pretrain_steps=3000, wm_retrain_steps=100, wm_eval_every=25, wm_patience=3, wm_loss_horizon=4,
    eval_episodes=3, baseline_chunk_steps=50, baseline_updates_per_step=1.0, wm_retrain_first=False,
)


def command(v: float) -> dict:
    return {"command_range": [v, v], "sigma": 0.5}


def exp_config(ctx: UnitContext, **extra: Any):
    from experiments.lift.finetune_config import Config
    return Config(**{**STUDY_EXP, **ctx.size("exp", {}), **extra})


def run_pretrain(ctx: UnitContext, wm_kinds: tuple[str, ...] = WM_KINDS, stop_after_stage1: bool = False
                 ) -> dict | None:
    """Stage 1 in <= 15-min chunks (checkpoint in artifacts/pretrain/checkpoint.pt), then the start model: agent.pt
    and the stage-2 world models (each saved as it is fitted, so a deadline between fits loses none). With
    ``stop_after_stage1`` it returns ``{}`` once agent.pt exists, so a caller can decide whether the budget holds."""
    import torch

    from experiments.lift.pretrain_local import LocalPretrain, PretrainSpec, fit_stage2
    spec = PretrainSpec(TASK, total_env_steps=ctx.size("pretrain_steps", PRETRAIN_STEPS),
                        eval_every_steps=ctx.size("pretrain_eval_every", 10_000),
                        eval_episodes=ctx.size("pretrain_eval_episodes", 4),
                        wm_rows=ctx.size("wm_rows", 20_000), preset_overrides=ctx.size("preset_overrides", {}))
    agent_file = ctx.artifacts / "pretrain" / "agent.pt"
    replay_file = ctx.work_dir / "replay.pt"
    reserve = ctx.size("stage2_reserve_s", 150.0)  # leave time for the checkpoint itself
    summary = ctx.read_json_artifact("pretrain/summary.json")
    if not agent_file.exists():
        run = LocalPretrain(spec, ctx.seed, ctx.load_artifact("pretrain/checkpoint.pt"), replay_file)
        done = run.run(lambda: ctx.time_left() - reserve, ctx.progress, ctx.size("chunk_steps", None))
        ctx.save_artifact("pretrain/checkpoint.pt", run.checkpoint())
        if not done:
            return None
        ctx.save_artifact("pretrain/agent.pt", run.agent.state_dict())
        summary = {"env_steps": run.state["env_steps"], "updates": run.agent.num_updates,
                   "chunks": run.state["chunks"], "refills": run.state["refills"], "falls": run.state["falls"],
                   "eval_steps": run.state["eval_steps"], "eval_returns": run.state["eval_returns"],
                   "train_returns": run.state["train_returns"], "sac": dict(vars(run.sac)),
                   "change": spec.change()}
        summary["sac"] = {k: list(v) if isinstance(v, tuple) else v for k, v in summary["sac"].items()}
        ctx.write_json_artifact("pretrain/summary.json", summary)
    if stop_after_stage1:
        return {}
    exp = exp_config(ctx, wm_eval_every=100, wm_patience=6)  # stage 2 fits to convergence (the defaults)
    saved = torch.load(replay_file, weights_only=False, map_location="cpu") if replay_file.exists() else None
    for kind in wm_kinds:
        path = ctx.artifacts / "stage2" / f"{kind}.pt"
        if path.exists():
            continue
        if ctx.time_left() < ctx.size("stage2_fit_s", 120.0):
            return None
        if saved is None or saved.get("env_steps") != summary["env_steps"]:
            saved = {"wm_data": _recollect(ctx, spec), "env_steps": summary["env_steps"], "recollected": True}
            summary["stage2_data"] = "recollected with the final policy (the pretraining replay was on another machine)"
            ctx.write_json_artifact("pretrain/summary.json", summary)
        t0 = time.perf_counter()
        model, metrics = fit_stage2(kind, TASK, exp, saved["wm_data"])
        metrics["fit_s"] = time.perf_counter() - t0
        ctx.save_artifact(f"stage2/{kind}.pt", {"model": model.state_dict(), "metrics": metrics})
        ctx.progress(wm_kinds.index(kind) + 1, len(wm_kinds), "world models", **{
            k: float(v) for k, v in metrics.items() if k in ("error_1step", "error_10step")})
    (ctx.artifacts / "pretrain" / "checkpoint.pt").unlink(missing_ok=True)  # the start model supersedes it
    stage2 = {k: torch.load(ctx.artifacts / "stage2" / f"{k}.pt", weights_only=True, map_location="cpu")["metrics"]
              for k in wm_kinds}
    return {"metrics": {"env_steps": summary["env_steps"], "updates": summary["updates"],
                        "final_eval_return": summary["eval_returns"][-1], "chunks": summary["chunks"],
                        "replay_refills": summary["refills"], "train_falls": summary["falls"],
                        "stage2_data": summary.get("stage2_data", "pretraining replay, newest rows"),
                        "stage2": {k: {m: _jsonable(v) for m, v in d.items()} for k, d in stage2.items()}},
            "curves": {"env_steps": summary["eval_steps"], "eval_return": summary["eval_returns"],
                       "train_return": summary["train_returns"]},
            "sac": summary["sac"], "pretrain_change": summary["change"]}


def reopen_pretrain(ctx: UnitContext) -> None:
    """Undo the end of stage 1 so that a raised budget resumes from the last checkpoint (saved with agent.pt)."""
    if not (ctx.artifacts / "pretrain" / "checkpoint.pt").exists():
        raise RuntimeError("cannot extend pretraining: artifacts/pretrain/checkpoint.pt is gone")
    (ctx.artifacts / "pretrain" / "agent.pt").unlink(missing_ok=True)
    (ctx.artifacts / "pretrain" / "summary.json").unlink(missing_ok=True)


def _recollect(ctx: UnitContext, spec) -> dict:
    """World-model columns of ``wm_rows`` fresh transitions of the final (stochastic) policy in the pretraining env."""
    import torch

    from algos.lift.agent import SACAgent
    from envs.control.rollout import VectorRollout
    state = torch.load(ctx.artifacts / "pretrain" / "agent.pt", weights_only=True, map_location="cpu")
    arch = state["arch"]
    agent = SACAgent(arch["obs_dim"], arch["act_dim"], spec.sac_config())
    agent.load_state_dict(state)
    rollout = VectorRollout(TASK, 8, ctx.seed * 1000 + 999, spec.change(), physics_state=True)
    gen = torch.Generator().manual_seed(ctx.seed)
    batch, _ = rollout.collect(lambda obs: agent.act(obs, False, gen).numpy(), math.ceil(spec.wm_rows / 8))
    rollout.close()
    return {k: batch[k] for k in ("qpos", "qvel", "ctrl", "next_qpos", "next_qvel", "terminated", "truncated")}


def policy_of(ctx: UnitContext):
    import torch

    from algos.lift.agent import SACAgent
    from algos.lift.sac import SACConfig
    state = torch.load(ctx.artifacts / "pretrain" / "agent.pt", weights_only=True, map_location="cpu")
    arch = state["arch"]
    agent = SACAgent(arch["obs_dim"], arch["act_dim"], SACConfig(**{**state["config"], "bf16": False}))
    agent.load_state_dict(state)
    return lambda obs: agent.act(obs, True).numpy()


def run_gate(ctx: UnitContext, ladder_fn: Callable[[str], list[dict]], keep_limit: float = KEEP_LIMIT) -> dict:
    """The pretrained policy's return in the reference env and zero-shot in the changed env, up the change's ladder
    (``ladder_fn(change)``: rungs ``{"label", "env", "reference"}``, mildest first) until it keeps < ``keep_limit``
    of its return; records every rung tried and the one chosen."""
    from envs.control.rollout import evaluate
    change = ctx.setting["change"]
    rungs = ladder_fn(change)
    episodes = ctx.size("gate_episodes", GATE_EPISODES)
    policy = policy_of(ctx)
    tried, chosen = [], None
    references: dict[str, float] = {}
    for rung in rungs:
        key = repr(rung["reference"])
        if key not in references:
            references[key] = float(np.mean(evaluate(TASK, policy, episodes, 2024, rung["reference"]).returns))
        pre = references[key]
        stats = evaluate(TASK, policy, episodes, 2025, rung["env"])
        zero = float(np.mean(stats.returns))
        kept = zero / pre if pre > 0 else float("nan")
        tried.append({**rung, "pre_change_return": pre, "zero_shot_return": zero, "kept": kept,
                      "zero_shot_falls": stats.terminations, "zero_shot_returns": stats.returns})
        ctx.progress(len(tried), len(rungs), "rungs", pre=pre, zero_shot=zero, kept=kept)
        if kept < keep_limit:
            chosen = tried[-1]
            break
    weak = chosen is None
    chosen = chosen or tried[-1]  # none hurt enough: the strongest rung, flagged
    return {"metrics": {"change": change, "chosen": chosen["label"], "pre_change_return": chosen["pre_change_return"],
                        "zero_shot_return": chosen["zero_shot_return"], "kept": chosen["kept"],
                        "replaced": chosen is not tried[0], "too_weak": weak, "episodes": episodes},
            "chosen": {"label": chosen["label"], "env": chosen["env"], "reference": chosen["reference"]},
            "ladder": tried}


FIXED_STEPS = (250, 500, 1000, 2000, 4000)  # real-step counts at which every method's return is reported


def finetune(method: str, change: dict, exp: Any, seed: int, agent_path: Path, stage2_path: Path | None,
             pre_change: float, zero_shot: float, run_path: Path, task: str = TASK,
             fixed_steps: tuple[int, ...] = FIXED_STEPS) -> dict[str, Any]:
    """``method`` finetuned by the learner a cluster job runs (``finetune_learner.run_one_rank``: one rank, the pool's
    samplers in this process, the checkpoint in ``run_path``), then its metric rows as a record body: return at fixed
    real-step counts, real steps to 80 % recovery, falls, the world model's held-out errors per epoch, the curves."""
    import dataclasses
    import shutil

    from cluster.metrics import read_metrics
    from experiments.lift.finetune import method_rows, summarise
    from experiments.lift.finetune_config import METHOD_SPECS
    from experiments.lift.finetune_learner import run_one_rank
    if stage2_path is None and METHOD_SPECS[method].model is not None:
        raise ValueError(f"{method} needs a stage-2 world model")
    started = time.perf_counter()
    shutil.rmtree(run_path, ignore_errors=True)  # a unit starts afresh: a killed attempt's rows would double count
    config = {"experiment": dataclasses.asdict(exp), "pool": {}, "run_path": str(run_path),
              "run_id": f"study-{method}-s{seed}", "task": task, "seed": seed, "torch_threads": 1,
              "change": change, "method": method, "agent_path": str(agent_path), "replay": [], "pretrain_run": None,
              "stage2": str(stage2_path) if stage2_path else None, "pre_change_return": pre_change,
              "zero_shot_return": zero_shot}
    run_one_rank(config)
    df = read_metrics(run_path)
    summary = summarise(df, [method], pre_change, zero_shot)[method]  # the driver's own summary of the same rows
    rows = method_rows(df, method)
    ev = rows.dropna(subset=["eval_return"])
    steps, returns = ev["real_env_steps"].to_numpy().astype(int), ev["eval_return"].to_numpy().astype(float)
    trained = ev[ev["epoch"] >= 0]

    def column(name: str) -> list:
        return [_jsonable(v) if v == v else None for v in ev[name]] if name in ev else [None] * len(ev)

    recover, real_steps = summary["real_steps_to_recover"], summary["real_steps"]
    heldout = [v for v in column("wm_heldout_error_1step") if v is not None]
    curves = {"real_steps": steps.tolist(), "eval_return": returns.tolist(), "epoch": column("epoch"),
              "falls_total": column("falls_total"), "sac_steps": (ev["updates"] - ev["updates"].iloc[0]).tolist(),
              "wm_heldout_1step": column("wm_heldout_error_1step"),
              "wm_heldout_10step": column("wm_heldout_error_10step"),
              "wm_stage2_heldout_1step": column("wm_stage2_heldout_error_1step"),
              "wm_stage2_heldout_10step": column("wm_stage2_heldout_error_10step"),
              "wm_train_steps": column("wm_steps"), "wm_kept_incoming": column("wm_kept_incoming"),
              "model_transitions": column("model_transitions"), "model_buffer": column("model_buffer"),
              "horizon": column("horizon"), "hupt": column("hupt")}
    metrics = {
        "real_steps_to_recover": recover,
        "recovered": recover is not None,
        "real_steps_to_recover_censored": float(recover if recover is not None else real_steps),
        "return_at": {str(s): float(returns[steps == s][0]) for s in fixed_steps if (steps == s).any()},
        **{k: summary[k] for k in ("final_return", "best_return", "falls", "max_joint_excursion", "max_joint_speed",
                                   "max_torso_tilt", "real_steps")},
        "falls_per_1000": summary["falls_per_1000"] or 0.0,
        "mean_return": float(trained["eval_return"].mean()) if len(trained) else None,
        "episodes": int(rows["episodes"].sum()) if "episodes" in rows else None,
        "action_rate": _jsonable(float(np.nanmean(trained["action_rate"]))) if "action_rate" in trained else None,
        "stochastic_requests": _jsonable(rows.iloc[-1].get("stochastic_requests")),
        "sac_steps": summary["sac_updates"],
        "wm_heldout_1step_mean": float(np.mean(heldout)) if heldout else None,
        "wm_heldout_1step_final": heldout[-1] if heldout else None,
        "pre_change_return": pre_change,
        "zero_shot_return": zero_shot,
        "loop_wall_s": time.perf_counter() - started,
    }
    return {"metrics": metrics, "curves": curves}


def _jsonable(v: Any) -> Any:
    if isinstance(v, (np.floating, np.integer)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


# ---------------------------------------------------------------------------------- reading and drawing records

def record_value(record: dict, key: str) -> float | None:
    value: object = record["metrics"]
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(float(value)) else None


def by_seed(records: list[dict], change: str, method: str, key: str) -> dict[int, float]:
    """{seed: value} of the reported units of one change and method."""
    out = {}
    for r in records:
        if r["role"] == "report" and r["method"] == method and r["setting"].get("change") == change:
            value = record_value(r, key)
            if value is not None:
                out[int(r["seed"])] = value
    return out


def band_plot(ax, steps, values: np.ndarray, color: str, label: str) -> None:
    """Mean return over seeds (rows of ``values``) with its 95 % t-band."""
    band = np.array([t_interval(list(col)) for col in np.asarray(values, dtype=float).T])
    ax.plot(steps, band[:, 0], marker="o", ms=2, color=color, label=f"{label} ({len(values)})")
    if len(values) > 1:
        ax.fill_between(steps, band[:, 1], band[:, 2], color=color, alpha=0.12)


def recovery_panel(ax, gate: dict | None, xlabel: str) -> None:
    """A return-vs-real-steps panel's pre-change and 80 %-recovery lines (from the change's gate record) and axes."""
    if gate:
        pre, zero = gate["metrics"]["pre_change_return"], gate["metrics"]["zero_shot_return"]
        ax.axhline(pre, color="k", ls="--", lw=1, label="pre-change")
        ax.axhline(zero + 0.8 * (pre - zero), color="k", ls="-.", lw=0.7, label="80 % recovery")
        ax.set_title(gate["chosen"]["label"], fontsize=9)
    ax.set(xlabel=xlabel, ylabel="deterministic eval return")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
