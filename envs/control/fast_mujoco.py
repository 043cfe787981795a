"""Humanoid-v5 with gymnasium's observation, reward, termination and time limit, minus its per-step Python.

gymnasium's Humanoid-v5 step spends a fifth or more of its time around ``mj_step`` (benchmarks.pool_throughput,
rows (a) and (c)): a fresh view of every MjData
field on each access, a 348-float observation flattened and concatenated from six of them, two einsum mass centres,
the info dict with a vector norm, then four wrapper layers (PassiveEnvChecker, OrderEnforcing, TimeLimit,
RescaleAction). ``FastHumanoid`` computes the same numbers from views of MjData taken once at construction (MjData
never reallocates its arrays), with one ``mj_step(model, data, nstep=frame_skip)``, one ``mj_rnePostConstraint``
(only ``cfrc_ext`` needs it) and one ``np.concatenate`` per step; the 1000-step time limit is counted inside.

What is identical to ``gym.make("Humanoid-v5", **kwargs)``: the model, the action space (the actuators' control
range), the seeded reset noise (the same ``np_random.uniform`` draws in the same order), ``data`` after every step,
observation, termination and truncation; reward and the info entries agree to rounding (a dot product instead of
``np.sum(np.square(.))``; ~1e-15). ``make_env`` in ``envs.control.tasks`` wraps it in gymnasium's ``RescaleAction`` as it
does gymnasium's env, so the policy's [-1, 1] actions become the same float32 controls bit for bit.

Attribute names follow gymnasium's ``HumanoidEnv`` (``model``, ``data``, ``frame_skip``, ``dt``, ``init_qpos``,
``_healthy_z_range``, ``_forward_reward_weight``, ``observation_structure``, ``spec``, ...) so that stage-3 changes
(``envs.control.changes``), task rewards and the MuJoCo prior read it as they read gymnasium's. Physics edits act in place
on ``model``; ``dt`` and the bodies' mass fractions (for the mass centre) are read from it at every reset, so edits
made before a reset apply (``envs.control.changes`` makes them when the env is built).
"""
from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium.envs.mujoco.mujoco_env import expand_model_path
from gymnasium.spaces import Box

TIME_LIMIT = 1000  # Humanoid-v5's max_episode_steps


class FastHumanoid(gym.Env):
    """gymnasium's Humanoid-v5 (``gym.make`` semantics incl. TimeLimit) with the per-step work kept to a minimum.

    ``physics_state=True`` adds copies of ``qpos``/``qvel``/``ctrl`` to ``info`` after reset and every step (what
    ``envs.control.tasks.PhysicsState`` adds, without another wrapper layer).
    """

    metadata = {"render_modes": []}

    def __init__(self, xml_file: str = "humanoid.xml", frame_skip: int = 5, forward_reward_weight: float = 1.25,
                 ctrl_cost_weight: float = 0.1, contact_cost_weight: float = 5e-7,
                 contact_cost_range: tuple[float, float] = (-np.inf, 10.0), healthy_reward: float = 5.0,
                 terminate_when_unhealthy: bool = True, healthy_z_range: tuple[float, float] = (1.0, 2.0),
                 reset_noise_scale: float = 1e-2, exclude_current_positions_from_observation: bool = True,
                 include_cinert_in_observation: bool = True, include_cvel_in_observation: bool = True,
                 include_qfrc_actuator_in_observation: bool = True, include_cfrc_ext_in_observation: bool = True,
                 max_episode_steps: int | None = TIME_LIMIT, physics_state: bool = False) -> None:
        if frame_skip < 1:
            raise ValueError(f"frame_skip: must be >= 1, got {frame_skip}")
        if max_episode_steps is not None and max_episode_steps < 1:
            raise ValueError(f"max_episode_steps: must be >= 1 or None, got {max_episode_steps}")
        self._forward_reward_weight = forward_reward_weight
        self._ctrl_cost_weight = ctrl_cost_weight
        self._contact_cost_weight = contact_cost_weight
        self._contact_cost_range = contact_cost_range
        self._healthy_reward = healthy_reward
        self._terminate_when_unhealthy = terminate_when_unhealthy
        self._healthy_z_range = healthy_z_range
        self._reset_noise_scale = reset_noise_scale
        self._exclude_current_positions_from_observation = exclude_current_positions_from_observation
        self.max_episode_steps = max_episode_steps
        self.physics_state = physics_state

        self.fullpath = expand_model_path(xml_file)  # gymnasium's assets folder for a bare file name
        self.model = mujoco.MjModel.from_xml_path(self.fullpath)
        self.data = mujoco.MjData(self.model)
        self.frame_skip = frame_skip
        self.init_qpos = self.data.qpos.ravel().copy()
        self.init_qvel = self.data.qvel.ravel().copy()
        low, high = self.model.actuator_ctrlrange.copy().astype(np.float32).T
        self.action_space = Box(low=low, high=high, dtype=np.float32)

        # Views into MjData, taken once: each ``data.<field>`` access builds a new ndarray object.
        d = self.data
        self._qpos, self._qvel, self._ctrl = d.qpos, d.qvel, d.ctrl
        self._xipos = d.xipos
        self._cfrc_ext = d.cfrc_ext.reshape(-1)
        skipped = 2 if exclude_current_positions_from_observation else 0
        parts = {"qpos": d.qpos[skipped:], "qvel": d.qvel,
                 "cinert": d.cinert[1:].reshape(-1) if include_cinert_in_observation else None,
                 "cvel": d.cvel[1:].reshape(-1) if include_cvel_in_observation else None,
                 "qfrc_actuator": d.qfrc_actuator[6:] if include_qfrc_actuator_in_observation else None,
                 "cfrc_ext": d.cfrc_ext[1:].reshape(-1) if include_cfrc_ext_in_observation else None}
        self._obs_parts = tuple(p for p in parts.values() if p is not None)
        self.observation_structure = {"skipped_qpos": skipped,
                                      **{k: (0 if p is None else p.size) for k, p in parts.items()},
                                      "ten_length": 0, "ten_velocity": 0}
        size = sum(p.size for p in self._obs_parts)
        self.observation_space = Box(low=-np.inf, high=np.inf, shape=(size,), dtype=np.float64)
        # cfrc_ext (observation, contact cost) is filled by mj_rnePostConstraint only; skip it if nothing reads it
        self._needs_cfrc_ext = include_cfrc_ext_in_observation or contact_cost_weight != 0
        self._elapsed_steps: int | None = None  # None until the first reset, as OrderEnforcing requires
        self.spec = dataclasses.replace(gym.spec("Humanoid-v5"), max_episode_steps=max_episode_steps, kwargs={
            "xml_file": xml_file, "frame_skip": frame_skip, "forward_reward_weight": forward_reward_weight,
            "ctrl_cost_weight": ctrl_cost_weight, "contact_cost_weight": contact_cost_weight,
            "contact_cost_range": contact_cost_range, "healthy_reward": healthy_reward,
            "terminate_when_unhealthy": terminate_when_unhealthy, "healthy_z_range": healthy_z_range,
            "reset_noise_scale": reset_noise_scale,
            "exclude_current_positions_from_observation": exclude_current_positions_from_observation,
            "include_cinert_in_observation": include_cinert_in_observation,
            "include_cvel_in_observation": include_cvel_in_observation,
            "include_qfrc_actuator_in_observation": include_qfrc_actuator_in_observation,
            "include_cfrc_ext_in_observation": include_cfrc_ext_in_observation})

    @property
    def dt(self) -> float:
        return self.model.opt.timestep * self.frame_skip

    def _read_model_constants(self) -> None:
        """Per-episode constants, read at every reset so that in-place model edits (``envs.control.changes``) apply."""
        mass = self.model.body_mass
        self._mass_fraction = mass / mass.sum()  # mass centre = mass_fraction @ xipos
        self._dt = self.dt

    def _mass_centre_xy(self) -> list[float]:
        return (self._mass_fraction @ self._xipos).tolist()  # [x, y, z]

    def _observation(self) -> np.ndarray:
        return np.concatenate(self._obs_parts)  # a fresh array: callers may keep observations

    def _physics(self, info: dict) -> dict:
        info["qpos"], info["qvel"], info["ctrl"] = self._qpos.copy(), self._qvel.copy(), self._ctrl.copy()
        return info

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """MujocoEnv.reset + HumanoidEnv.reset_model: uniform noise of ``reset_noise_scale`` on qpos, then qvel."""
        super().reset(seed=seed)
        model, data = self.model, self.data
        self._read_model_constants()
        mujoco.mj_resetData(model, data)
        c = self._reset_noise_scale
        qpos = self.init_qpos + self.np_random.uniform(low=-c, high=c, size=model.nq)
        qvel = self.init_qvel + self.np_random.uniform(low=-c, high=c, size=model.nv)
        self._qpos[:], self._qvel[:] = qpos, qvel
        mujoco.mj_forward(model, data)
        self._elapsed_steps = 0
        x, y = float(self._qpos[0]), float(self._qpos[1])
        info = {"x_position": x, "y_position": y, "tendon_length": data.ten_length,
                "tendon_velocity": data.ten_velocity, "distance_from_origin": math.hypot(x, y)}
        return self._observation(), (self._physics(info) if self.physics_state else info)

    def reward_params(self) -> tuple:
        """What the reward and termination depend on besides the state: envs with equal params step as one batch."""
        return (self._forward_reward_weight, self._ctrl_cost_weight, self._contact_cost_weight,
                tuple(self._contact_cost_range), self._healthy_reward, self._terminate_when_unhealthy,
                tuple(self._healthy_z_range), self.max_episode_steps, self._needs_cfrc_ext, self.frame_skip)

    def _reward(self, x_velocity: Any, z: Any, ctrl_sq: Any, cfrc_sq: Any) -> tuple[Any, Any, tuple]:
        """Humanoid-v5's reward and termination from the step's mass-centre velocity, torso height, |ctrl|^2 and
        |cfrc_ext|^2; elementwise, so it serves one env (floats, with plain Python operators: numpy calls on
        scalars would cost a few % of a step) and a batch (arrays) alike."""
        low, high = self._healthy_z_range
        healthy = (low < z) & (z < high)
        forward_reward = self._forward_reward_weight * x_velocity
        healthy_reward = healthy * self._healthy_reward
        ctrl_cost = self._ctrl_cost_weight * ctrl_sq
        contact = self._contact_cost_weight * cfrc_sq
        floor, ceiling = self._contact_cost_range
        contact_cost = min(max(contact, floor), ceiling) if isinstance(contact, float) else np.clip(contact, floor,
                                                                                                     ceiling)
        reward = (forward_reward + healthy_reward) - (ctrl_cost + contact_cost)
        terminated = (healthy ^ True) & self._terminate_when_unhealthy
        return reward, terminated, (healthy_reward, forward_reward, ctrl_cost, contact_cost)

    def step_into(self, action: np.ndarray, obs_out: np.ndarray) -> tuple[float, bool, bool]:
        """:meth:`step` without the info dict, writing the observation into ``obs_out``."""
        if self._elapsed_steps is None:
            raise gym.error.ResetNeeded("Cannot call env.step() before calling env.reset()")
        ctrl = self._ctrl
        ctrl[:] = action  # raises on a wrong shape, as MujocoEnv.do_simulation does
        x_before, y_before, _ = self._mass_centre_xy()
        mujoco.mj_step(self.model, self.data, nstep=self.frame_skip)
        if self._needs_cfrc_ext:
            mujoco.mj_rnePostConstraint(self.model, self.data)  # cfrc_ext is not computed by mj_step
        x_after, y_after, _ = self._mass_centre_xy()
        x_velocity, y_velocity = (x_after - x_before) / self._dt, (y_after - y_before) / self._dt
        cfrc = self._cfrc_ext
        reward, terminated, terms = self._reward(x_velocity, float(self._qpos[2]), float(ctrl @ ctrl),
                                                 float(cfrc @ cfrc))
        self._elapsed_steps += 1
        truncated = self.max_episode_steps is not None and self._elapsed_steps >= self.max_episode_steps
        self._terms = (x_velocity, y_velocity, *terms)
        np.concatenate(self._obs_parts, out=obs_out)
        return float(reward), bool(terminated), truncated

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        """HumanoidEnv.step + TimeLimit: reward = forward + healthy - ctrl cost - contact cost (Humanoid-v5 docs)."""
        obs = np.empty(self.observation_space.shape)  # a fresh array: callers may keep observations
        reward, terminated, truncated = self.step_into(action, obs)
        x_velocity, y_velocity, healthy_reward, forward_reward, ctrl_cost, contact_cost = self._terms
        x, y = self._qpos[:2].tolist()
        info = {"x_position": x, "y_position": y, "tendon_length": self.data.ten_length,
                "tendon_velocity": self.data.ten_velocity, "distance_from_origin": math.hypot(x, y),
                "x_velocity": x_velocity, "y_velocity": y_velocity, "reward_survive": healthy_reward,
                "reward_forward": forward_reward, "reward_ctrl": -ctrl_cost, "reward_contact": -contact_cost}
        if self.physics_state:
            self._physics(info)
        return obs, reward, terminated, truncated, info


def step_batch(envs: list[FastHumanoid], ctrl: np.ndarray, obs_out: np.ndarray, rewards: np.ndarray,
               terminated: np.ndarray, truncated: np.ndarray) -> None:
    """``envs[i].step_into(ctrl[i], obs_out[i])`` for every i, with the results written into ``rewards[i]``,
    ``terminated[i]``, ``truncated[i]``: the same numbers (to rounding), but only MuJoCo calls and copies per env;
    mass centres, rewards and terminations are computed for the whole batch at once. A vectorised rollout's step
    (``envs.control.rollout``): per env, Python costs about as much as a tenth of a Humanoid ``mj_step`` otherwise.
    The envs must share :meth:`FastHumanoid.reward_params` (``VectorRollout`` checks it)."""
    first, n = envs[0], len(envs)
    nbody = first.model.nbody
    before, after = np.empty((n, nbody, 3)), np.empty((n, nbody, 3))
    mass_fraction, dt = np.empty((n, nbody)), np.empty(n)
    cfrc = np.empty((n, first._cfrc_ext.size))
    z = np.empty(n)
    needs_cfrc, nstep, limit = first._needs_cfrc_ext, first.frame_skip, first.max_episode_steps
    step, rne = mujoco.mj_step, mujoco.mj_rnePostConstraint
    for i, env in enumerate(envs):
        if env._elapsed_steps is None:
            raise gym.error.ResetNeeded("Cannot call env.step() before calling env.reset()")
        env._ctrl[:] = ctrl[i]
        before[i] = env._xipos
        step(env.model, env.data, nstep=nstep)
        if needs_cfrc:
            rne(env.model, env.data)
        after[i] = env._xipos
        cfrc[i] = env._cfrc_ext
        z[i] = env._qpos[2]
        mass_fraction[i], dt[i] = env._mass_fraction, env._dt
        np.concatenate(env._obs_parts, out=obs_out[i])
        env._elapsed_steps += 1
        truncated[i] = limit is not None and env._elapsed_steps >= limit
    # the mass centre's x: mass_fraction @ xipos per env, before and after the step
    x_velocity = (np.einsum("nb,nb->n", mass_fraction, after[:, :, 0])
                  - np.einsum("nb,nb->n", mass_fraction, before[:, :, 0])) / dt
    ctrl64 = np.asarray(ctrl, dtype=np.float64)  # data.ctrl holds float64 copies of the float32 actions
    rewards[:], terminated[:], _ = first._reward(x_velocity, z, np.einsum("ni,ni->n", ctrl64, ctrl64),
                                                 np.einsum("ni,ni->n", cfrc, cfrc))


# gymnasium ids this module reproduces, and the class that does it
FAST_ENVS: dict[str, type[gym.Env]] = {"Humanoid-v5": FastHumanoid}


def lean_version(env_id: str, kwargs: dict[str, Any]) -> type[gym.Env] | None:
    """The lean class standing in for ``gym.make(env_id, **kwargs)``, or None where there is none or it does not
    take all of ``kwargs`` (``render_mode`` and the camera options, for instance)."""
    cls = FAST_ENVS.get(env_id)
    if cls is None or set(kwargs) - set(inspect.signature(cls).parameters):
        return None
    return cls
