"""The world models of a LIFT finetuning run: built over the task's nominal physics, fitted on the pretraining replay
(stage 2, cached), and the task's own observation, reward and action range that model rollouts use (stage 3).

The world model's action is the simulator's control (``ctrl``), not the policy's [-1, 1] action:
``world_model_columns`` is that view of recorded transitions, for the pretraining replay and for real finetuning data.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from algos.lift.finetune import ActionScale
from algos.lift.world_model import BlackBoxEnsemble, PhysicsWorldModel, WorldModel, WorldModelConfig
from algos.lift.world_model_training import EarlyStopping, train_world_model
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
    """Stage 2 (``pretrain``: one-step loss, ``wm_pretrain_steps``) or a stage-3 retraining (``wm_loss_horizon``)."""
    return WorldModelConfig(hidden_sizes=tuple(exp.wm_hidden), ensemble_size=ensemble, prior_mode=exp.wm_prior_mode,
                            train_steps=exp.wm_pretrain_steps if pretrain else exp.wm_retrain_steps,
                            loss_horizon=1 if pretrain else exp.wm_loss_horizon, eval_every=exp.wm_eval_every,
                            seed=seed)


def early_stopping(exp: Any) -> EarlyStopping:
    return EarlyStopping(exp.wm_patience, exp.wm_min_improvement)


def make_world_model(kind: str, task: str, exp: Any, seed: int) -> WorldModel:
    """The physics-informed model (``lift``) or the black-box ensemble (``mbpo_wm``) over the task's nominal model."""
    env = make_env(task)
    prior = MujocoPrior.from_env(env)
    act_dim = env.action_space.shape[0]
    env.close()
    if kind == "lift":
        return PhysicsWorldModel(prior, act_dim, world_model_config(exp, pretrain=True, seed=seed))
    cfg = world_model_config(exp, pretrain=True, seed=seed, ensemble=exp.blackbox_ensemble_size)
    return BlackBoxEnsemble.like(prior, act_dim, cfg)


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


def pretrain_world_model(kind: str, task: str, exp: Any, replay_dirs: list[Path], cache: Path,
                         seed: int) -> tuple[WorldModel, dict[str, Any]]:
    """Stage 2: fit the model on the pretraining replay (early stopping); ``cache`` holds a fit already made."""
    model = make_world_model(kind, task, exp, seed)
    if cache.exists():
        saved = torch.load(cache, weights_only=True)
        model.load_state_dict(saved["model"])
        return model, saved["metrics"]
    data = load_pretrain_replay(replay_dirs, exp.wm_pretrain_rows)
    metrics = train_world_model(model, data, early_stopping=early_stopping(exp))
    metrics = {k: v for k, v in metrics.items() if not isinstance(v, list)}
    return model, metrics


def rollout_functions(task: str) -> tuple[Callable[..., torch.Tensor], Callable[..., Any], ActionScale]:
    """What model rollouts score predicted states with: the task's observation and reward/termination functions,
    and the map from policy actions to the env's own control range (the one ``RescaleAction`` wraps)."""
    probe = make_env(task)
    obs_fn, reward_fn = make_observation_fn(probe), make_task_reward(probe)
    base_space = probe.unwrapped.action_space
    scale = ActionScale(torch.as_tensor(base_space.low, dtype=torch.float64),
                        torch.as_tensor(base_space.high, dtype=torch.float64))
    probe.close()
    return obs_fn, reward_fn, scale
