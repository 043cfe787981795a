"""gymnasium's conventions on every env orrery builds: ``check_env`` runs to the end (plain, with the physics state,
with each stage-3 change), a changed env is rebuilt from its spec with its edits, orrery's tasks are registered, and
Pendulum refuses a physics state it does not have."""
from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from envs.control.changes import LOCOMOTION
from envs.control.task_rewards import task_family
from envs.control.tasks import TASKS, make_env

CHANGE_PARAMS = {"friction": {}, "mass": {}, "gear": {}, "gravity": {"scale": 1.5}, "target_velocity": {}}


def applicable_changes(task: str) -> list[str]:
    """The changes that mean something for the task (the others are refused, see test_env_changes)."""
    try:
        family = task_family(TASKS[task].gym_id)
    except ValueError:  # no task reward (Hopper): no changes
        return []
    return ["mass", "gear", "gravity"] + (["friction", "target_velocity"] if family in LOCOMOTION else [])


CASES = [(task, physics_state, change)
         for task, spec in TASKS.items()
         for physics_state in ((False, True) if spec.mujoco else (False,))
         for change in (None, *applicable_changes(task))]


def _quiet_check(env: gym.Env) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gymnasium's own MuJoCo spaces are unbounded; check_env warns about that
        check_env(env, skip_render_check=True)  # orrery renders nothing (and Pendulum's renderer needs pygame)


@pytest.mark.parametrize("task, physics_state, change", CASES,
                         ids=[f"{t}-{'state' if p else 'plain'}-{c or 'nominal'}" for t, p, c in CASES])
def test_check_env_passes_on_every_env_make_env_builds(task, physics_state, change):
    env = make_env(task, {"name": change, **CHANGE_PARAMS[change]} if change else None, physics_state=physics_state)
    _quiet_check(env)
    if physics_state:
        _, info = env.reset(seed=0)
        assert {"qpos", "qvel", "ctrl"} <= set(info)


@pytest.mark.parametrize("task, change", [("walker2d", {"friction": {"scale": 0.4}, "mass": {"scale": 1.3}}),
                                          ("inverted_pendulum", {"gravity": {"scale": 4.0}}),
                                          ("pendulum", {"gear": {"scale": 0.5}, "mass": {"scale": 1.5}}),
                                          ("half_cheetah", {"target_velocity": {"command_range": (0.5, 1.5)}})])
def test_a_changed_env_is_rebuilt_from_its_spec_with_its_edits(task, change):
    env = make_env(task, change, physics_state=TASKS[task].mujoco)
    rebuilt = env.spec.make()
    nominal = make_env(task, physics_state=TASKS[task].mujoco)
    actions = np.random.default_rng(0).uniform(-1, 1, (20,) + env.action_space.shape).astype(np.float32)
    trajectories = []
    for e in (env, rebuilt, nominal):
        obs, _ = e.reset(seed=3)
        visited = [obs]
        for action in actions:
            obs, *_ = e.step(action)
            visited.append(obs)
        trajectories.append(np.array(visited))
    np.testing.assert_array_equal(trajectories[0], trajectories[1])
    if task != "half_cheetah":  # target_velocity adds the command to the observation: a different shape
        assert np.abs(trajectories[0] - trajectories[2]).max() > 1e-6, "the rebuilt env lost its edits"


def test_orrery_tasks_are_registered_and_gym_make_builds_them():
    registered = {name: spec.orrery_id for name, spec in TASKS.items() if spec.orrery_id}
    assert registered == {"humanoid": "orrery/Humanoid-v0", "humanoid_state": "orrery/HumanoidState-v0"}
    for task, env_id in registered.items():
        env = gym.make(env_id)
        _quiet_check(env)
        reference = make_env(task)
        assert type(env.unwrapped) is type(reference.unwrapped)
        assert env.observation_space == reference.observation_space
        np.testing.assert_array_equal(env.reset(seed=5)[0], reference.reset(seed=5)[0])
    assert gym.make("orrery/HumanoidState-v0").observation_space.shape == (45,)


def test_pendulum_refuses_a_physics_state():
    with pytest.raises(ValueError, match="physics_state=True needs a MuJoCo task: pendulum"):
        make_env("pendulum", physics_state=True)
