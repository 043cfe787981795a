"""The world models of a LIFT finetuning run: built over the task's nominal physics, fitted on the pretraining replay
(stage 2, cached), and the task's own observation, reward and action range that model rollouts use (stage 3).

The world model's action is the simulator's control (``ctrl``), not the policy's [-1, 1] action:
``world_model_columns`` is that view of recorded transitions, for the pretraining replay and for real finetuning data.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from algos.lift.finetune import ActionScale
from algos.lift.world_model import BlackBoxEnsemble, NoPrior, PhysicsWorldModel, WorldModel, WorldModelConfig
from algos.lift.world_model_training import EarlyStopping, train_world_model
from envs.control.changes import TargetVelocity
from envs.control.mujoco_prior import MujocoPrior
from envs.control.task_rewards import make_observation_fn, make_task_reward
from envs.control.tasks import make_env

log = logging.getLogger(__name__)


def world_model_columns(transitions: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The columns a world model trains on, from env-sampler transitions recorded with ``physics_state``."""
    return {"qpos": transitions["qpos"], "qvel": transitions["qvel"], "action": transitions["ctrl"],
            "next_qpos": transitions["next_qpos"], "next_qvel": transitions["next_qvel"],
            "terminated": transitions["terminated"], "truncated": transitions["truncated"]}


def world_model_config(exp: Any, *, pretrain: bool, seed: int, ensemble: int = 1) -> WorldModelConfig:
    """Stage 2 (``pretrain``: one-step loss, ``wm_pretrain_steps``, whole episodes held out, a check every
    ``wm_eval_every`` steps) or a stage-3 refit as LIFT's ``finetune_wm_ac.py`` runs it: the ``wm_loss_horizon``-step
    loss, a random 20 % of the real transitions held out, a check after every pass over the rest (its epochs), at most
    ``wm_retrain_steps`` Adam steps (LIFT: up to 1000 epochs)."""
    return WorldModelConfig(hidden_sizes=tuple(exp.wm_hidden), ensemble_size=ensemble, prior_mode=exp.wm_prior_mode,
                            train_steps=exp.wm_pretrain_steps if pretrain else exp.wm_retrain_steps,
                            loss_horizon=1 if pretrain else exp.wm_loss_horizon,
                            eval_every=exp.wm_eval_every if pretrain else 0,
                            holdout_split="episodes" if pretrain else "transitions", seed=seed)


def early_stopping(exp: Any, pretrain: bool = True) -> EarlyStopping:
    """Stop after ``wm_patience`` checks without a ``wm_min_improvement`` relative gain; a refit compares the hold-out
    mean squared error (LIFT's convergence test), stage 2 the NLL it trains on."""
    return EarlyStopping(exp.wm_patience, exp.wm_min_improvement, metric="nll" if pretrain else "mse")


MODEL_KINDS = ("physics", "prior_only", "residual_only", "blackbox")


def make_world_model(kind: str, task: str, exp: Any, seed: int) -> WorldModel:
    """The world model of a finetuning method (``finetune_config.METHOD_SPECS``) over the task's nominal model:
    ``physics`` (LIFT: MuJoCo prior + residual), its ablations ``prior_only`` (no residual) and ``residual_only`` (no
    prior), or ``blackbox`` (MBPO's ensemble). ``seed`` sets the network's initial weights."""
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown world-model kind {kind!r}; choose from {MODEL_KINDS}")
    env = make_env(task)
    prior = MujocoPrior.from_env(env)
    act_dim = env.action_space.shape[0]
    env.close()
    with torch.random.fork_rng(devices=[]):  # the caller's RNG stream (SAC noise) is not shifted by the init
        torch.manual_seed(seed)
        if kind == "blackbox":
            cfg = world_model_config(exp, pretrain=True, seed=seed, ensemble=exp.blackbox_ensemble_size)
            return BlackBoxEnsemble.like(prior, act_dim, cfg)
        cfg = world_model_config(exp, pretrain=True, seed=seed)
        if kind == "residual_only":
            return PhysicsWorldModel(NoPrior(prior), act_dim, cfg)
        return PhysicsWorldModel(prior, act_dim, cfg, residual=kind != "prior_only")


def load_pretrain_replay(replay_dirs: list[Path], max_rows: int) -> dict[str, np.ndarray]:
    """World-model columns of the pretraining replay (the newest ``max_rows`` per rank)."""
    from cluster.store import ParquetStore
    parts = []
    for d in replay_dirs:
        data = ParquetStore(d).to_numpy()
        if "ctrl" not in data:
            raise ValueError(f"{d}: the replay has no ctrl/qpos columns (pretrain with physics_state=true)")
        n = len(data["ctrl"])
        keep = slice(max(0, n - max_rows), n)
        parts.append({k: v[keep] for k, v in world_model_columns(data).items()})
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def stage2_cache_path(pretrain_run: Path, kind: str, task: str, exp: Any) -> Path:
    """Where the stage-2 fit of ``kind`` lives in the pretraining run: one file per model kind and every setting
    that shapes the fit (so a changed setting fits anew instead of loading a stale model)."""
    key = {"kind": kind, "task": task, "hidden": list(exp.wm_hidden), "prior_mode": exp.wm_prior_mode,
           "steps": exp.wm_pretrain_steps, "rows": exp.wm_pretrain_rows, "seed": exp.wm_pretrain_seed,
           "eval_every": exp.wm_eval_every, "patience": exp.wm_patience, "min_improvement": exp.wm_min_improvement,
           "ensemble": exp.blackbox_ensemble_size if kind == "blackbox" else 1}
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    return Path(pretrain_run) / "wm" / f"{kind}-{digest}.pt"


def pretrain_world_model(kind: str, task: str, exp: Any, replay_dirs: list[Path], cache: Path,
                         device: torch.device | str = "cpu") -> tuple[WorldModel, dict[str, Any]]:
    """Stage 2: fit the model on ``device`` on the pretraining replay (early stopping) with ``exp.wm_pretrain_seed``, or
    load the fit ``cache`` already holds. A new fit is written atomically (another rank or run may be reading)."""
    model = make_world_model(kind, task, exp, exp.wm_pretrain_seed).to(device)
    if cache.exists():
        saved = torch.load(cache, weights_only=True, map_location=device)
        model.load_state_dict(saved["model"])
        return model, saved["metrics"]
    data = load_pretrain_replay(replay_dirs, exp.wm_pretrain_rows)
    metrics = train_world_model(model, data, early_stopping=early_stopping(exp))
    metrics = {k: v for k, v in metrics.items() if not isinstance(v, list)}
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_suffix(f".{os.getpid()}.tmp")
    torch.save({"model": model.state_dict(), "metrics": metrics}, partial)
    partial.replace(cache)
    return model, metrics


def rollout_functions(task: str, change: dict | None = None) -> tuple[Callable[..., torch.Tensor], Any, ActionScale]:
    """What model rollouts score predicted states with: the observation and reward/termination functions of the
    finetuning env (with a velocity command: the tracking reward of its ``TargetVelocity``, which also scores the
    real env), and the map from policy actions to the env's own control range (the one ``RescaleAction`` wraps)."""
    probe = make_env(task, change)
    command_wrapper = find_wrapper(probe, TargetVelocity)
    obs_fn = make_observation_fn(probe)
    reward_fn = command_wrapper.task_reward if command_wrapper is not None else make_task_reward(probe)
    base_space = probe.unwrapped.action_space
    scale = ActionScale(torch.as_tensor(base_space.low, dtype=torch.float64),
                        torch.as_tensor(base_space.high, dtype=torch.float64))
    probe.close()
    return obs_fn, reward_fn, scale


def has_command(task: str, change: dict | None) -> bool:
    """Whether the env's observation ends with a velocity command (``TargetVelocity``)."""
    probe = make_env(task, change)
    found = find_wrapper(probe, TargetVelocity) is not None
    probe.close()
    return found


def find_wrapper(env: Any, kind: type) -> Any:
    """The first wrapper of type ``kind`` in ``env``'s chain, or None."""
    while env is not None:
        if isinstance(env, kind):
            return env
        env = getattr(env, "env", None)
    return None
