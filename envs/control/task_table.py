"""The control tasks by short name (``TASKS``) and their ``orrery/`` gymnasium registrations; the envs built from
them: ``envs.control.tasks``. Its own module so that the task rewards can map an env id back to its task without
importing what builds envs (which applies stage-3 changes, which use the task rewards)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from envs.control.fast_mujoco import FAST_ENVS

# Humanoid observed through its state only. The LIFT pipeline uses it: the world model predicts (qpos, qvel), so it
# can rebuild exactly this observation.
STATE_ONLY_HUMANOID = {f"include_{part}_in_observation": False
                       for part in ("cinert", "cvel", "qfrc_actuator", "cfrc_ext")}


@dataclass(frozen=True)
class Task:
    """One control task: the gymnasium env it is, and orrery's registered lean build of it (if any)."""

    gym_id: str  # gymnasium's id
    kwargs: dict[str, Any] = field(default_factory=dict)  # gymnasium.make keyword arguments beyond the id
    mujoco: bool = True  # a MuJoCo env: physics state (qpos, qvel, ctrl) to record, a model to edit
    orrery_id: str | None = None  # registered lean build (``envs.control.fast_mujoco``), what make_env builds


TASKS: dict[str, Task] = {
    "humanoid": Task("Humanoid-v5", orrery_id="orrery/Humanoid-v0"),
    "pendulum": Task("Pendulum-v1", mujoco=False),
    "inverted_pendulum": Task("InvertedPendulum-v5"),
    "half_cheetah": Task("HalfCheetah-v5"),
    "walker2d": Task("Walker2d-v5"),
    "hopper": Task("Hopper-v5"),
    "humanoid_state": Task("Humanoid-v5", STATE_ONLY_HUMANOID, orrery_id="orrery/HumanoidState-v0"),
}
MUJOCO_TASKS = frozenset(name for name, task in TASKS.items() if task.mujoco)


def _register() -> None:
    for task in TASKS.values():
        if task.orrery_id is not None and task.orrery_id not in gym.registry:
            cls = FAST_ENVS[task.gym_id]
            # The lean env counts its own time limit and is checked by tests/test_gym_conventions.py: no TimeLimit,
            # OrderEnforcing or PassiveEnvChecker layers (each costs Python per step).
            gym.register(task.orrery_id, entry_point=f"{cls.__module__}:{cls.__name__}", kwargs=dict(task.kwargs),
                         max_episode_steps=None, order_enforce=False, disable_env_checker=True)


    if "orrery/Walker2dCommandDR-v0" not in gym.registry:  # LIFT's kind of pretraining task (envs.control.lift_kind)
        gym.register("orrery/Walker2dCommandDR-v0", entry_point="envs.control.lift_kind:walker2d_command_env",
                     max_episode_steps=None, order_enforce=False, disable_env_checker=True)


_register()


def env_id(task: str) -> str:
    """The gymnasium id a short task name stands for, or a registered gymnasium id itself."""
    if task in TASKS:
        return TASKS[task].gym_id
    if task in gym.registry:
        return task
    raise ValueError(f"unknown task {task!r}: choose one of {sorted(TASKS)} or a registered gymnasium id")


def gymnasium_id(registered_id: str) -> str:
    """The gymnasium id an env id reproduces: an ``orrery/`` id -> its gymnasium original, any other id unchanged."""
    for task in TASKS.values():
        if task.orrery_id == registered_id:
            return task.gym_id
    return registered_id
