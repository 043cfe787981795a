"""The control tasks by short name, their gymnasium registration, and ``make_env``.

``TASKS`` is the one table of what orrery runs: each task's gymnasium env, the keyword arguments it is made with, and
whether it is a MuJoCo env (a physics state qpos/qvel/ctrl to record, a model that stage-3 changes can edit). The
envs orrery adds beyond gymnasium's own ids are registered with ``gymnasium.register`` under ``orrery/``, so
``gymnasium.make("orrery/HumanoidState-v0")`` builds what ``make_env("humanoid_state")`` builds:

    orrery/Humanoid-v0        the lean Humanoid-v5 of ``envs.control.fast_mujoco`` (same observations, rewards,
                              terminations and time limit as gymnasium's, less Python per step)
    orrery/HumanoidState-v0   the same, observed through its state only (qpos[2:], qvel: 45 numbers, not 348)

``lean=False`` builds gymnasium's own env (``gym.make`` of the task's gymnasium id) instead.
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from envs.control.fast_mujoco import lean_version
from envs.control.task_table import (MUJOCO_TASKS, STATE_ONLY_HUMANOID, TASKS, Task, env_id,  # noqa: F401
                                     gymnasium_id)



class PhysicsState(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Adds MuJoCo ``qpos``/``qvel``/``ctrl`` to ``info`` after reset and every step (the world model trains on
    them: ``ctrl`` is the action in the simulator's units, before it is rescaled to the policy's [-1, 1])."""

    def __init__(self, env: gym.Env) -> None:
        if not hasattr(env.unwrapped, "data"):
            raise ValueError(f"{env.unwrapped.spec.id if env.unwrapped.spec else env} has no MuJoCo state to record")
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)

    def _state(self, info: dict) -> dict:
        data = self.env.unwrapped.data
        info["qpos"] = np.array(data.qpos, dtype=np.float64)
        info["qvel"] = np.array(data.qvel, dtype=np.float64)
        info["ctrl"] = np.array(data.ctrl, dtype=np.float64)  # the control the simulator applied (env units)
        return info

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        return obs, self._state(info)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, self._state(info)


def make_env(task: str, change: dict | None = None, physics_state: bool = False, lean: bool = True,
             **kwargs: Any) -> gym.Env:
    """The task's env with policy actions in [-1, 1].

    ``lean`` builds orrery's registered lean env where the task has one that takes ``kwargs``, else gymnasium's.
    ``change`` applies stage-3 edits (``envs.control.changes``); ``physics_state`` adds qpos/qvel/ctrl to every
    ``info`` (MuJoCo tasks only).
    """
    spec = TASKS.get(task) or Task(env_id(task))  # another gymnasium id: PhysicsState refuses it if not MuJoCo
    if physics_state and not spec.mujoco:
        raise ValueError(f"physics_state=True needs a MuJoCo task: {task} ({spec.gym_id}) has no MuJoCo state "
                         f"(qpos/qvel/ctrl); choose one of {sorted(MUJOCO_TASKS)}")
    make_kwargs = {**spec.kwargs, **kwargs}
    lean_id = spec.orrery_id if lean and lean_version(spec.gym_id, make_kwargs) else None
    if lean_id is not None:
        env = gym.make(lean_id, physics_state=physics_state, **kwargs)  # records the physics state itself
    else:
        env = gym.make(spec.gym_id, **make_kwargs)
    if change:
        from envs.control.changes import apply_change  # torch and the task rewards: only when a change is asked for
        env = apply_change(env, change)
    if physics_state and lean_id is None:
        env = PhysicsState(env)
    # Policies act in [-1, 1] on every task; the env maps that onto its own control range. float32 bounds, as the
    # action space's own dtype (the same controls, without gymnasium's precision warning).
    return gym.wrappers.RescaleAction(env, np.float32(-1.0), np.float32(1.0))


def make_vector_env(task: str, num_envs: int, change: dict | None = None, physics_state: bool = False,
                    lean: bool = True, **kwargs: Any) -> gym.vector.SyncVectorEnv:
    """``num_envs`` copies of ``make_env(...)`` with same-step autoreset (``envs.control.rollout`` explains why)."""
    return gym.vector.SyncVectorEnv(
        [lambda: make_env(task, change, physics_state, lean, **kwargs) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
