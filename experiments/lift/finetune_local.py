"""LIFT stage 3 in one process (no Ray): one method finetuned from the pretrained agent in a changed env, evaluated
every ``real_steps_per_epoch`` real steps. The study runner's method units call ``finetune``.

The epoch is the learner's (``finetune_learner``) on one rank, without the pool: model-based methods collect the
epoch's real steps (deterministic for LIFT), score the world models on them before training on them (held-out error),
retrain the model on all real data, then HUPT(e) branches of H(e)-step model rollouts, each followed by
``updates_per_rollout`` SAC steps on mixed batches. Model-free methods collect in chunks with SAC steps in between:
UTD ``baseline_updates_per_step`` ("fixed") or LIFT's number of SAC steps in the same epoch ("matched"). Every
method is evaluated the same way (deterministic episodes in the changed env) after every epoch and once before the
first, so the curve starts at the zero-shot point.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from algos.lift.finetune import Branching, LinearSchedule, action_rate, branch_and_update, steps_to_recover
from algos.lift.replay import ReplayBuffer, transition_fields
from algos.lift.sac import update
from algos.lift.world_model_training import heldout_errors, train_world_model
from envs.control.rollout import VectorRollout, evaluate
from envs.control.safety import JointSafety
from envs.control.tasks import make_env
from experiments.lift.finetune_config import METHOD_SPECS, Config
from experiments.lift.finetune_learner import build_agent
from experiments.lift.world_models import (early_stopping, has_command, make_world_model, rollout_functions,
                                           world_model_columns, world_model_config)

log = logging.getLogger(__name__)
HELDOUT_HORIZON = 10
FIXED_STEPS = (250, 500, 1000, 2000, 4000)  # real-step counts at which every method's return is reported


def load_stage2(kind: str, task: str, exp: Config, path: Path):
    """The stage-2 world model of ``kind`` saved by the pretraining stage ({"model": state_dict, "metrics": ...})."""
    model = make_world_model(kind, task, exp, exp.wm_pretrain_seed)
    saved = torch.load(path, weights_only=True, map_location="cpu")
    model.load_state_dict(saved["model"])
    return model, saved.get("metrics", {})


def finetune(method: str, task: str, change: dict, exp: Config, seed: int, agent_path: Path,
             stage2_path: Path | None, pre_change: float, zero_shot: float,
             progress: Callable[..., None] | None = None) -> dict[str, Any]:
    """Finetune with ``method`` for ``exp.epochs`` epochs; returns {"metrics": ..., "curves": ...} (JSON-able)."""
    started = time.perf_counter()
    spec = METHOD_SPECS[method]
    torch.manual_seed(seed)
    agent, sac_cfg = build_agent(agent_path, exp, torch.device("cpu"))
    gen = torch.Generator().manual_seed(seed * 7)
    model = stage2 = units = None
    if spec.model is not None:
        if stage2_path is None:
            raise ValueError(f"{method} needs a stage-2 world model of kind {spec.model}")
        model, _ = load_stage2(spec.model, task, exp, stage2_path)
        stage2 = copy.deepcopy(model)
        units = model.state_std.clone()  # fixed error units: comparable across epochs, refits and methods
        obs_fn, reward_fn, action_scale = rollout_functions(task, change)
        branching = Branching(obs_fn, reward_fn, action_scale,
                              member="random" if spec.model == "blackbox" else "mean", obs_noise=exp.obs_noise)
    commanded = has_command(task, change)
    probe = make_env(task, change)
    safety = JointSafety.from_env(probe)
    probe.close()
    fields = transition_fields(agent.obs_dim, agent.act_dim)
    real_buffer = ReplayBuffer(exp.env_buffer_capacity, fields)
    real_data: list[dict[str, np.ndarray]] = []
    rollout = VectorRollout(task, exp.num_real_envs, seed * 1000, change, physics_state=True)
    horizon = LinearSchedule.from_list(exp.horizon_schedule, "horizon_schedule")
    hupt = LinearSchedule.from_list(exp.hupt_schedule, "hupt_schedule")
    deterministic = spec.deterministic_real
    counts = {"real_steps": 0, "falls": 0, "episodes": 0, "stochastic_steps": 0, "sac_steps": 0}
    worst = {"joint_excursion": 0.0, "joint_speed": 0.0, "torso_tilt": 0.0}
    rates: list[float] = []
    curves: dict[str, list] = {k: [] for k in ("real_steps", "eval_return", "falls_total", "sac_steps",
                                               "wm_heldout_1step", "wm_heldout_10step", "wm_stage2_heldout_1step",
                                               "wm_stage2_heldout_10step", "wm_train_steps", "model_transitions")}

    def act(obs: np.ndarray) -> np.ndarray:
        return agent.act(obs, deterministic, gen).numpy()

    def collect(transitions: int) -> dict[str, np.ndarray]:
        steps = max(1, math.ceil(transitions / exp.num_real_envs))
        batch, stats = rollout.collect(act, steps)
        if exp.update_normalizer:
            agent.update_normalizers(batch["obs"])
        real_buffer.add({k: batch[k] for k in real_buffer.specs})
        columns = world_model_columns(batch)
        if commanded:
            columns["command"] = batch["obs"][:, -1].astype(np.float64)
        n = len(batch["reward"])
        counts["real_steps"] += n
        counts["stochastic_steps"] += 0 if deterministic else n
        counts["falls"] += stats.terminations
        counts["episodes"] += len(stats.returns)
        done = np.maximum(batch["terminated"], batch["truncated"]).reshape(steps, exp.num_real_envs)
        rates.append(action_rate(batch["action"].reshape(steps, exp.num_real_envs, -1), done))
        for key, value in safety.measure(batch["next_qpos"], batch["next_qvel"]).items():
            if math.isfinite(value):
                worst[key] = max(worst[key], value)
        return columns

    def real_columns(keys: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        return {k: np.concatenate([d[k] for d in real_data]) for k in (keys or real_data[0])}

    def evaluate_now() -> float:
        stats = evaluate(task, lambda obs: agent.act(obs, True).numpy(), exp.eval_episodes, seed * 1000 + 7, change)
        return float(np.mean(stats.returns))

    def log_point(value: float, wm: dict[str, float]) -> None:
        curves["real_steps"].append(counts["real_steps"])
        curves["eval_return"].append(value)
        curves["falls_total"].append(counts["falls"])
        curves["sac_steps"].append(counts["sac_steps"])
        for key in ("wm_heldout_1step", "wm_heldout_10step", "wm_stage2_heldout_1step", "wm_stage2_heldout_10step",
                    "wm_train_steps", "model_transitions"):
            curves[key].append(wm.get(key))

    cpu = {"eval": 0.0, "wm_retrain": 0.0, "wm_heldout": 0.0, "branch_and_update": 0.0, "real_and_updates": 0.0}

    def timed(phase: str, fn: Callable[[], Any]) -> Any:
        t0 = time.process_time()
        try:
            return fn()
        finally:
            cpu[phase] += time.process_time() - t0

    log_point(timed("eval", evaluate_now), {})
    for epoch in range(exp.epochs):
        wm: dict[str, float] = {}
        if model is not None:
            columns = timed("real_and_updates", lambda: collect(exp.real_steps_per_epoch))
            for name, m in (("wm_heldout", model), ("wm_stage2_heldout", stage2)):
                errors = timed("wm_heldout", lambda m=m: heldout_errors(m, columns, HELDOUT_HORIZON, seed=seed,
                                                                    state_std=units))
                wm[f"{name}_1step"] = _finite(errors[0])
                wm[f"{name}_10step"] = _finite(errors[-1])
            real_data.append(columns)
            cfg = world_model_config(exp, pretrain=False, seed=seed * 1000 + epoch, ensemble=model.cfg.ensemble_size)
            try:
                out = timed("wm_retrain", lambda: train_world_model(
                    model, real_columns(), cfg, early_stopping(exp), scalers=exp.wm_scalers, state_std=units))
                wm["wm_train_steps"] = out["steps"]
            except ValueError as err:  # raised before any change to the model: it stays as it was
                log.warning("world model retraining skipped (epoch %d): %s", epoch, err)
            data = real_columns(("qpos", "qvel", "command") if commanded else ("qpos", "qvel"))
            dtype = model.delta_std.dtype
            states = torch.as_tensor(np.concatenate([data["qpos"], data["qvel"]], -1)).to(dtype)
            commands = torch.as_tensor(data["command"]).to(dtype) if commanded else None
            h, n_branches = horizon(epoch), hupt(epoch)
            capacity = min(n_branches * exp.rollout_batch * h, exp.model_buffer_capacity)
            model_buffer = ReplayBuffer(capacity, fields)  # LIFT: one epoch of rollouts
            out = timed("branch_and_update", lambda: branch_and_update(
                model, branching, states, commands, lambda obs: agent.act(obs, False, gen), n_branches=n_branches,
                horizon=h, rollout_batch=exp.rollout_batch, model_buffer=model_buffer,
                real_sample=lambda n: real_buffer.sample(n, gen),
                update=lambda sampler: update(agent, sampler, sac_cfg), real_ratio=exp.real_ratio, generator=gen))
            counts["sac_steps"] += n_branches * sac_cfg.utd
            wm["model_transitions"] = out["model_transitions"]
        else:
            goal, start, done_steps = exp.real_steps_per_epoch, counts["real_steps"], 0
            total = (hupt(epoch) * sac_cfg.utd if spec.updates == "matched"
                     else round(goal * exp.baseline_updates_per_step))
            t0 = time.process_time()
            while counts["real_steps"] - start < goal:
                collect(min(exp.baseline_chunk_steps, goal - (counts["real_steps"] - start)))
                due = math.floor(total * min((counts["real_steps"] - start) / goal, 1.0) + 1e-9)
                if due > done_steps:  # the chunk's share of the epoch's SAC steps, as one G-step call
                    chunk_cfg = dataclasses.replace(sac_cfg, utd=due - done_steps)
                    update(agent, lambda n: real_buffer.sample(n, gen), chunk_cfg)
                counts["sac_steps"] += due - done_steps
                done_steps = due
            cpu["real_and_updates"] += time.process_time() - t0
        value = timed("eval", evaluate_now)
        log_point(value, wm)
        if progress is not None:
            progress(counts["real_steps"], exp.epochs * exp.real_steps_per_epoch, "real steps", eval_return=value,
                     falls=counts["falls"])
    rollout.close()
    steps, returns = np.asarray(curves["real_steps"]), np.asarray(curves["eval_return"])
    recover = steps_to_recover(steps, returns, pre_change, zero_shot)
    budget = exp.epochs * exp.real_steps_per_epoch
    at = {str(s): float(returns[steps == s][0]) for s in FIXED_STEPS if (steps == s).any()}
    heldout = [v for v in curves["wm_heldout_1step"] if v is not None]
    heldout10 = [v for v in curves["wm_heldout_10step"] if v is not None]
    metrics = {
        "real_steps_to_recover": recover,
        "recovered": recover is not None,
        "real_steps_to_recover_censored": float(recover if recover is not None else budget),
        "return_at": at,
        "final_return": float(returns[-1]),
        "best_return": float(returns[1:].max()) if len(returns) > 1 else float(returns[0]),
        "mean_return": float(returns[1:].mean()) if len(returns) > 1 else float(returns[0]),
        "falls": counts["falls"],
        "falls_per_1000": 1000.0 * counts["falls"] / max(counts["real_steps"], 1),
        "episodes": counts["episodes"],
        "max_joint_excursion": worst["joint_excursion"],
        "max_joint_speed": worst["joint_speed"],
        "max_torso_tilt": worst["torso_tilt"],
        "action_rate": _finite(float(np.nanmean(rates))) if rates else None,
        "real_steps": counts["real_steps"],
        "stochastic_real_steps": counts["stochastic_steps"],
        "sac_steps": counts["sac_steps"],
        "wm_heldout_1step_mean": float(np.mean(heldout)) if heldout else None,
        "wm_heldout_1step_final": heldout[-1] if heldout else None,
        "wm_heldout_10step_final": heldout10[-1] if heldout10 else None,
        "pre_change_return": pre_change,
        "zero_shot_return": zero_shot,
        "loop_wall_s": time.perf_counter() - started,
        "cpu_s_by_phase": cpu,
    }
    return {"metrics": metrics, "curves": curves}


def _finite(value: float) -> float | None:
    return float(value) if value is not None and math.isfinite(float(value)) else None
