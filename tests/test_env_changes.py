"""Stage-3 environment changes (envs/control/changes.py) and the torch task rewards/observations they rely on
(envs/control/task_rewards.py, envs/control/torch_kinematics.py)."""
from __future__ import annotations

import gymnasium as gym
import mujoco
import numpy as np
import pytest
import torch

from envs.control.changes import CHANGES, ChangedEnv, TargetVelocity, apply_change, make_changed_env, parse_changes
from envs.control.task_rewards import make_observation_fn, make_task_reward
from envs.control.torch_kinematics import TorchKinematics

torch.set_num_threads(1)
HUMANOID_STATE_OBS = dict(include_cinert_in_observation=False, include_cvel_in_observation=False,
                          include_qfrc_actuator_in_observation=False, include_cfrc_ext_in_observation=False)


def _physical_state(env: gym.Env) -> tuple[np.ndarray, np.ndarray]:
    base = env.unwrapped
    if hasattr(base, "data"):
        return base.data.qpos.copy(), base.data.qvel.copy()
    return base.state[:1].copy(), base.state[1:].copy()  # Pendulum-v1: θ, θ̇


def _transitions(env: gym.Env, steps: int, seed: int) -> dict[str, np.ndarray]:
    env.reset(seed=seed)
    env.action_space.seed(seed)
    rows = []
    for _ in range(steps):
        qpos, qvel = _physical_state(env)
        action = env.action_space.sample()
        obs, reward, terminated, truncated, info = env.step(action)
        next_qpos, next_qvel = _physical_state(env)
        rows.append((qpos, qvel, next_qpos, next_qvel, action.astype(np.float64), reward, terminated,
                     info.get("reward_contact", 0.0), obs))
        if terminated or truncated:
            env.reset()
    names = ("qpos", "qvel", "next_qpos", "next_qvel", "action", "reward", "terminated", "reward_contact", "obs")
    return {name: np.array([row[i] for row in rows]) for i, name in enumerate(names)}


def _t(array: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(array, dtype=torch.float64)


# ------------------------------------------------------------------------------------------- rewards / observations

@pytest.mark.parametrize("task, kwargs, tolerance", [
    ("Walker2d-v5", {}, 1e-6),
    ("HalfCheetah-v5", {}, 1e-6),  # float32 actions: the env squares them in float32
    ("InvertedPendulum-v5", {}, 1e-12),
    ("Pendulum-v1", {}, 1e-6),
    ("Humanoid-v5", HUMANOID_STATE_OBS, 5e-3),  # gymnasium's one-substep-lagged centre of mass (module docstring)
])
def test_task_reward_and_observation_match_gymnasium(task, kwargs, tolerance):
    env = gym.make(task, **kwargs)
    data = _transitions(env, 300, seed=0)
    reward_fn, observe = make_task_reward(env), make_observation_fn(env)
    reward, terminated = reward_fn(_t(data["qpos"]), _t(data["qvel"]), _t(data["next_qpos"]), _t(data["next_qvel"]),
                                   _t(data["action"]))
    # Humanoid's contact cost needs the contact solver; gymnasium reports it, so add it back (reward_contact <= 0)
    expected = data["reward"] - data["reward_contact"]
    np.testing.assert_allclose(reward.numpy(), expected, atol=tolerance, rtol=0)
    np.testing.assert_array_equal(terminated.numpy(), data["terminated"])
    np.testing.assert_allclose(observe(_t(data["next_qpos"]), _t(data["next_qvel"])).numpy(), data["obs"], atol=1e-6)
    assert np.ptp(expected) > 1e-2  # rewards vary along the data, so matching them means something


def test_locomotion_episodes_include_terminations():
    data = _transitions(gym.make("Walker2d-v5"), 200, seed=1)
    assert data["terminated"].any() and not data["terminated"].all()


def test_torch_kinematics_matches_mujoco_body_positions():
    env = gym.make("Humanoid-v5")
    kinematics = TorchKinematics(env.unwrapped.model)
    model, data = env.unwrapped.model, env.unwrapped.data
    states, expected = [], []
    env.reset(seed=2)
    for _ in range(20):
        env.step(env.action_space.sample())
        mujoco.mj_kinematics(model, data)
        states.append(data.qpos.copy())
        expected.append(data.xipos.copy())
    np.testing.assert_allclose(kinematics.xipos(_t(np.array(states))).numpy(), np.array(expected), atol=1e-10)


def test_humanoid_observation_needs_state_only_features():
    with pytest.raises(ValueError, match="cinert"):
        make_observation_fn(gym.make("Humanoid-v5"))


# ------------------------------------------------------------------------------------------------- dynamics changes

MEANINGFUL = [
    ("Walker2d-v5", "friction", {"scale": 0.3}),
    ("Walker2d-v5", "mass", {"scale": 1.5}),
    ("Walker2d-v5", "gear", {"scale": 0.75}),
    ("Walker2d-v5", "gravity", {"g": 12.0}),
    ("HalfCheetah-v5", "friction", {"scale": 0.4}),
    ("HalfCheetah-v5", "mass", {"scale": 1.3}),
    ("HalfCheetah-v5", "gear", {"scale": 0.75}),
    ("HalfCheetah-v5", "gravity", {"scale": 1.2}),
    ("Humanoid-v5", "friction", {"scale": 0.3}),
    ("Humanoid-v5", "mass", {"scale": 1.3}),
    ("Humanoid-v5", "gear", {"scale": 0.75}),
    ("Humanoid-v5", "gravity", {"g": 12.0}),
    ("InvertedPendulum-v5", "mass", {"scale": 2.0}),
    ("InvertedPendulum-v5", "gear", {"scale": 0.75}),
    ("InvertedPendulum-v5", "gravity", {"g": 15.0}),
    ("Pendulum-v1", "mass", {"scale": 1.3}),
    ("Pendulum-v1", "gear", {"scale": 0.75}),
    ("Pendulum-v1", "gravity", {"g": 13.0}),
]


def _trajectory(env: gym.Env, actions: np.ndarray, seed: int) -> np.ndarray:
    obs, _ = env.reset(seed=seed)
    visited = [obs]
    for action in actions:
        obs, _, terminated, truncated, _ = env.step(action)
        visited.append(obs)
        if terminated or truncated:
            break
    return np.array(visited)


@pytest.mark.parametrize("task, name, params", MEANINGFUL)
def test_change_alters_the_dynamics(task, name, params):
    nominal = gym.make(task)
    actions = np.random.default_rng(0).uniform(nominal.action_space.low, nominal.action_space.high,
                                               size=(15,) + nominal.action_space.shape)
    reference = _trajectory(nominal, actions, seed=3)
    repeat = _trajectory(gym.make(task), actions, seed=3)
    changed_env = make_changed_env(task, {name: params})
    changed = _trajectory(changed_env, actions, seed=3)
    np.testing.assert_array_equal(reference, repeat)  # deterministic, so any difference is the change
    length = min(len(reference), len(changed))
    assert np.abs(reference[:length] - changed[:length]).max() > 1e-3
    assert isinstance(changed_env, ChangedEnv) and changed_env.changes[0].name == name


def test_model_edits_have_the_requested_size():
    nominal = gym.make("Walker2d-v5").unwrapped.model
    env = make_changed_env("Walker2d-v5", {"friction": {"scale": 0.4}, "mass": {"scale": 1.25},
                                           "gear": {"scale": 0.75}, "gravity": {"g": 12.0}})
    model = env.unwrapped.model
    torso = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "torso")
    np.testing.assert_allclose(model.geom_friction[:, 0], 0.4 * nominal.geom_friction[:, 0])
    np.testing.assert_allclose(model.body_mass[torso], 1.25 * nominal.body_mass[torso])
    np.testing.assert_allclose(np.delete(model.body_mass, torso), np.delete(nominal.body_mass, torso))
    np.testing.assert_allclose(model.actuator_gear[:, 0], 0.75 * nominal.actuator_gear[:, 0])
    np.testing.assert_allclose(model.opt.gravity, [0.0, 0.0, -12.0])
    assert len(env.changes) == 4
    # the same action produces 0.75 of the joint torque
    data = mujoco.MjData(model)
    data.ctrl[:] = 0.5
    mujoco.mj_forward(model, data)
    nominal_data = mujoco.MjData(nominal)
    nominal_data.ctrl[:] = 0.5
    mujoco.mj_forward(nominal, nominal_data)
    np.testing.assert_allclose(data.qfrc_actuator, 0.75 * nominal_data.qfrc_actuator)


def test_changes_persist_over_resets_and_leave_other_envs_alone():
    changed = make_changed_env("Pendulum-v1", {"gravity": {"g": 14.0}, "mass": {"scale": 1.5}})
    changed.reset(seed=0)
    changed.reset(seed=1)
    assert changed.unwrapped.g == 14.0 and changed.unwrapped.m == 1.5
    fresh = gym.make("Pendulum-v1")
    assert fresh.unwrapped.g == 10.0 and fresh.unwrapped.m == 1.0


def test_heavier_gravity_makes_the_pendulum_fall_faster():
    speeds = []
    for g in (10.0, 15.0):
        env = make_changed_env("Pendulum-v1", {"gravity": {"g": g}})
        env.reset(seed=0)
        env.unwrapped.state = np.array([0.5, 0.0])
        env.step(np.zeros(1, dtype=np.float32))
        speeds.append(abs(env.unwrapped.state[1]))
    assert speeds[1] == pytest.approx(1.5 * speeds[0])


@pytest.mark.parametrize("task, name", [("InvertedPendulum-v5", "friction"), ("Pendulum-v1", "friction"),
                                        ("InvertedPendulum-v5", "target_velocity"), ("Pendulum-v1", "target_velocity")])
def test_meaningless_changes_are_refused(task, name):
    with pytest.raises(ValueError, match="not meaningful"):
        make_changed_env(task, {name: {}})


def test_change_specs_parse_in_all_forms_and_reject_unknown_names():
    assert parse_changes("friction", scale=0.3)[0].params == {"scale": 0.3}
    assert parse_changes({"name": "gear", "scale": 0.75})[0].params == {"scale": 0.75}
    assert [c.name for c in parse_changes({"mass": {"scale": 1.2}, "gravity": {"g": 11.0}})] == ["mass", "gravity"]
    assert set(CHANGES) == {"target_velocity", "friction", "mass", "gear", "gravity", "randomize"}
    with pytest.raises(ValueError, match="unknown change"):
        parse_changes({"wind": {}})
    with pytest.raises(ValueError, match="exactly one"):
        make_changed_env("Walker2d-v5", {"gravity": {}})
    env = apply_change(gym.make("HalfCheetah-v5"), "gear", scale=0.5)
    env = apply_change(env, {"friction": {"scale": 0.5}})
    assert [c.name for c in env.changes] == ["gear", "friction"]


# -------------------------------------------------------------------------------------------------- target velocity

@pytest.mark.parametrize("task, kwargs", [("Walker2d-v5", {}), ("HalfCheetah-v5", {}),
                                          ("Humanoid-v5", HUMANOID_STATE_OBS)])
def test_target_velocity_observes_the_command_and_rewards_tracking(task, kwargs):
    env = make_changed_env(task, {"target_velocity": {"command_range": (0.5, 1.5), "sigma": 0.5}}, **kwargs)
    wrapper = env.env
    assert isinstance(wrapper, TargetVelocity)
    base_dim = gym.make(task, **kwargs).observation_space.shape[0]
    assert env.observation_space.shape == (base_dim + 1,)

    commands = []
    for seed in range(5):
        obs, info = env.reset(seed=seed)
        commands.append(obs[-1])
        assert obs[-1] == pytest.approx(info["command"]) and 0.5 <= obs[-1] <= 1.5
    assert len(set(np.round(commands, 6))) > 1  # sampled per episode

    obs, _ = env.reset(seed=0, options={"command": 2.5})
    assert obs[-1] == pytest.approx(2.5)
    reward_fn, observe = make_task_reward(env, tracking_sigma=0.5), make_observation_fn(env)
    for _ in range(10):
        qpos, qvel = _physical_state(env)
        action = env.action_space.sample()
        obs, reward, terminated, _, info = env.step(action)
        next_qpos, next_qvel = _physical_state(env)
        args = (_t(qpos), _t(qvel), _t(next_qpos), _t(next_qvel), _t(action.astype(np.float64)))
        # the world model scores predicted states with the very same function
        model_reward, model_terminated = reward_fn(*args, command=torch.tensor(2.5, dtype=torch.float64))
        assert reward == pytest.approx(model_reward.item(), abs=1e-9)
        assert bool(model_terminated) == terminated
        np.testing.assert_allclose(observe(_t(next_qpos), _t(next_qvel), torch.tensor(2.5)).numpy(), obs, atol=1e-6)
        # tracking: commanding the velocity actually achieved pays more than commanding one far from it
        on_target, _ = reward_fn(*args, command=torch.tensor(info["forward_velocity"], dtype=torch.float64))
        off_target, _ = reward_fn(*args, command=torch.tensor(info["forward_velocity"] + 2.0, dtype=torch.float64))
        assert on_target.item() - off_target.item() > 0.9 * reward_fn.forward_weight
        if terminated:
            break


def test_tracking_reward_is_peaked_at_the_command():
    env = gym.make("Walker2d-v5")
    reward_fn = make_task_reward(env, tracking_sigma=0.5)
    qpos = torch.tensor(env.unwrapped.init_qpos)[None].repeat(3, 1)
    next_qpos = qpos.clone()
    next_qpos[:, 0] += torch.tensor([0.5, 1.0, 1.5]) * reward_fn.dt  # velocities 0.5, 1.0, 1.5 m/s
    zeros = torch.zeros(3, 9, dtype=torch.float64)
    reward, _ = reward_fn(qpos, zeros, next_qpos, zeros, torch.zeros(3, 6, dtype=torch.float64),
                          command=torch.tensor(1.0, dtype=torch.float64))
    assert reward[1] > reward[0] and reward[1] > reward[2]
    assert reward[1].item() == pytest.approx(reward_fn.forward_weight + reward_fn.healthy_reward)


def test_domain_randomization_redraws_within_lifts_ranges_from_the_nominal_model():
    """Every reset draws friction and masses afresh, within the ratios of the nominal model (never compounding), from
    the seeded stream; the registered LIFT-kind task observes its command."""
    from envs.control.domain_randomization import (LIFT_FRICTION_SCALE, LIFT_LINK_MASS_SCALE, LIFT_TORSO_MASS_ADD,
                                                   lift_randomization)
    from envs.control.lift_kind import REGISTERED_ID
    nominal = gym.make("Walker2d-v5").unwrapped.model
    env = make_changed_env("Walker2d-v5", {"randomize": lift_randomization()})
    model = env.unwrapped.model
    torso = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "torso")
    frictions = []
    for episode in range(30):
        _, info = env.reset(seed=7 if episode == 0 else None)
        scale = model.geom_friction[:, 0] / nominal.geom_friction[:, 0]
        assert np.allclose(scale, scale[0]) and LIFT_FRICTION_SCALE[0] <= scale[0] <= LIFT_FRICTION_SCALE[1]
        ratio = np.delete(model.body_mass[1:] / nominal.body_mass[1:], torso - 1)
        assert ((LIFT_LINK_MASS_SCALE[0] <= ratio) & (ratio <= LIFT_LINK_MASS_SCALE[1])).all()
        torso_ratio = model.body_mass[torso] / nominal.body_mass[torso]
        assert LIFT_LINK_MASS_SCALE[0] + LIFT_TORSO_MASS_ADD[0] <= torso_ratio <= (
            LIFT_LINK_MASS_SCALE[1] + LIFT_TORSO_MASS_ADD[1])
        assert info["randomization"]["friction_scale"] == pytest.approx(scale[0])
        frictions.append(scale[0])
    assert np.ptp(frictions) > 0.3  # redrawn, spread over the range
    again = make_changed_env("Walker2d-v5", {"randomize": lift_randomization()})
    _, info = again.reset(seed=7)
    assert info["randomization"]["friction_scale"] == pytest.approx(frictions[0])  # the seed decides the draw
    with pytest.raises(ValueError, match="friction_scale"):
        make_changed_env("Walker2d-v5", {"randomize": {"friction_scale": [1.0, 0.5]}})
    lift_kind = gym.make(REGISTERED_ID)
    obs, info = lift_kind.reset(seed=1)
    assert obs.shape == (18,) and 0.0 <= info["command"] <= 1.5 and "randomization" in info
