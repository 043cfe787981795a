"""Stage-3 "new environments": named edits of a gymnasium task's physics or objective (LIFT §3.3, card §5.3).

Changes (``CHANGES``), each a gymnasium wrapper, ``CHANGES[name](env, **params)``, that makes its edit when built:

  target_velocity  the observation gets a forward-velocity command v* (last entry) and the reward tracks it;
                   pretrain with ``command_range`` inside [0, v_max], finetune with an out-of-range one (the
                   stand-in for LIFT's 1.2 / 1.5 m/s tasks). Same reward function in both stages.
  friction         sliding friction of every geom × ``scale`` (0.3–0.5)
  mass             mass and inertia of one body (default torso; pole for InvertedPendulum) × ``scale`` (1.2–1.5)
  gear             actuator gear × ``scale`` (0.75)
  gravity          gravity magnitude set to ``g`` or × ``scale``
  randomize        domain randomisation, redrawn every episode: friction and link masses within ranges
                   (``envs.control.domain_randomization``: LIFT's pretraining ranges as ratios)

MuJoCo edits act in place on ``env.unwrapped.model`` (each gymnasium env owns its model, so other envs are
unaffected) and persist over resets. Pendulum-v1 is edited through its ``g``/``m`` attributes and, for the gear, by
scaling the torque it is sent. Combinations that would not change anything (friction on the contact-free pendulums, a
velocity command for the pendulums) raise ``ValueError``. Every wrapper records its arguments
(``gymnasium.utils.RecordConstructorArgs``), so ``env.spec.make()`` rebuilds a changed env, edits included.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
import torch
from gymnasium.utils import RecordConstructorArgs

from envs.control.domain_randomization import DomainRandomization
from envs.control.task_rewards import FAMILIES, LocomotionReward, make_task_reward, task_family

LOCOMOTION = ("walker2d", "half_cheetah", "humanoid")  # families with a forward-velocity reward
EVERY_FAMILY = tuple(FAMILIES.values())  # mass, gear and gravity: a MuJoCo model, or Pendulum-v1's attributes
DEFAULT_MASS_BODY = {"walker2d": "torso", "half_cheetah": "torso", "humanoid": "torso", "inverted_pendulum": "pole"}


@dataclass(frozen=True)
class Change:
    name: str
    params: dict[str, Any] = field(default_factory=dict)


class ChangedEnv(gym.Wrapper, RecordConstructorArgs):
    """Marks an env as changed and records which changes were applied (for logs and configs); the edits themselves
    are the wrappers below it."""

    def __init__(self, env: gym.Env, changes: tuple[Change, ...]) -> None:
        RecordConstructorArgs.__init__(self, changes=changes)
        gym.Wrapper.__init__(self, env)
        self.changes = changes

    def describe(self) -> str:
        return ", ".join(f"{c.name}({', '.join(f'{k}={v}' for k, v in c.params.items())})" for c in self.changes)


def _require(env: gym.Env, change: str, families: tuple[str, ...]) -> str:
    family = task_family(env)
    if family not in families:
        raise ValueError(f"change {change!r} is not meaningful for {env.unwrapped.spec.id}; it applies to "
                         f"{', '.join(families)}")
    return family


def _positive(name: str, value: float) -> float:
    if not value > 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return float(value)


class Friction(gym.Wrapper, RecordConstructorArgs):
    """Sliding friction × ``scale`` on every geom (MuJoCo takes the max over a contact pair, so scale all)."""

    def __init__(self, env: gym.Env, scale: float = 0.4) -> None:
        _require(env, "friction", LOCOMOTION)
        RecordConstructorArgs.__init__(self, scale=scale)
        gym.Wrapper.__init__(self, env)
        env.unwrapped.model.geom_friction[:, 0] *= _positive("scale", scale)


class Mass(gym.Wrapper, RecordConstructorArgs):
    """Mass and rotational inertia of ``body`` × ``scale`` (a payload on the torso; a heavier pole)."""

    def __init__(self, env: gym.Env, scale: float = 1.3, body: str | None = None) -> None:
        family = _require(env, "mass", EVERY_FAMILY)
        RecordConstructorArgs.__init__(self, scale=scale, body=body)
        gym.Wrapper.__init__(self, env)
        scale = _positive("scale", scale)
        if family == "pendulum":
            env.unwrapped.m *= scale
            return
        model = env.unwrapped.model
        body_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, body or DEFAULT_MASS_BODY[family])
        if body_id < 0:
            raise ValueError(f"body {body!r} not found in {env.unwrapped.spec.id}")
        model.body_mass[body_id] *= scale
        model.body_inertia[body_id] *= scale
        mujoco.mj_setConst(model, mujoco.MjData(model))  # derived constants (subtree masses, invweight0) follow


class Gear(gym.Wrapper, RecordConstructorArgs):
    """Actuator gear × ``scale``: the same action produces ``scale`` times the torque. MuJoCo: the model's gear;
    Pendulum-v1 (no actuator model): its motor is sent torque = gear · clip(u)."""

    def __init__(self, env: gym.Env, scale: float = 0.75) -> None:
        family = _require(env, "gear", EVERY_FAMILY)
        RecordConstructorArgs.__init__(self, scale=scale)
        gym.Wrapper.__init__(self, env)
        self.scale = _positive("scale", scale)
        self.scales_torque = family == "pendulum"
        if not self.scales_torque:
            env.unwrapped.model.actuator_gear[:, 0] *= self.scale

    def step(self, action):
        if self.scales_torque:
            action = self.scale * np.clip(action, self.action_space.low, self.action_space.high)
        return self.env.step(action)


class Gravity(gym.Wrapper, RecordConstructorArgs):
    """Gravity magnitude := ``g`` (m/s²) or × ``scale``; exactly one of them."""

    def __init__(self, env: gym.Env, g: float | None = None, scale: float | None = None) -> None:
        family = _require(env, "gravity", EVERY_FAMILY)
        if (g is None) == (scale is None):
            raise ValueError("gravity needs exactly one of g or scale")
        RecordConstructorArgs.__init__(self, g=g, scale=scale)
        gym.Wrapper.__init__(self, env)
        if family == "pendulum":
            base = env.unwrapped
            base.g = _positive("g", g) if g is not None else base.g * _positive("scale", scale)
            return
        vector = env.unwrapped.model.opt.gravity
        if g is not None:
            vector[:] = vector / np.linalg.norm(vector) * _positive("g", g)
        else:
            vector *= _positive("scale", scale)


class TargetVelocity(gym.Wrapper, RecordConstructorArgs):
    """Forward-velocity command v* ~ U(command_range) per episode, appended to the observation; tracking reward.

    The reward is ``make_task_reward(env, tracking_sigma=sigma)`` — the same object the world model uses on predicted
    states — fed with the velocity measured over the step in MuJoCo (x of the root; centre of mass for Humanoid,
    as gymnasium). Termination is the env's own. ``reset(options={"command": v})`` fixes the command.
    """

    def __init__(self, env: gym.Env, command_range: tuple[float, float] = (0.0, 1.0), sigma: float = 0.5,
                 weight: float | None = None) -> None:
        family = _require(env, "target_velocity", LOCOMOTION)
        RecordConstructorArgs.__init__(self, command_range=tuple(command_range), sigma=sigma, weight=weight)
        gym.Wrapper.__init__(self, env)
        low, high = (float(v) for v in command_range)
        if low > high:
            raise ValueError(f"command_range must be (low, high) with low <= high, got {command_range}")
        self.command_range = (low, high)
        self.task_reward: LocomotionReward = make_task_reward(env, tracking_sigma=sigma, tracking_weight=weight)
        self.command = low
        base_space = env.observation_space
        self.observation_space = gym.spaces.Box(
            np.append(base_space.low, low), np.append(base_space.high, high), dtype=base_space.dtype)
        self._uses_com = family == "humanoid"
        self._scratch = mujoco.MjData(env.unwrapped.model) if self._uses_com else None

    def _forward_position(self) -> float:
        base = self.env.unwrapped
        if not self._uses_com:
            return float(base.data.qpos[0])
        self._scratch.qpos[:] = base.data.qpos
        mujoco.mj_kinematics(base.model, self._scratch)
        return float(base.model.body_mass @ self._scratch.xipos[:, 0] / base.model.body_mass.sum())

    def _observe(self, obs: np.ndarray) -> np.ndarray:
        return np.append(obs, self.command).astype(self.observation_space.dtype)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        if options and "command" in options:
            self.command = float(options["command"])
        else:
            self.command = float(self.np_random.uniform(*self.command_range))
        info["command"] = self.command
        return self._observe(obs), info

    def step(self, action):
        position_before = self._forward_position()
        obs, env_reward, terminated, truncated, info = self.env.step(action)
        velocity = (self._forward_position() - position_before) / self.task_reward.dt
        reward, _ = self.task_reward.from_velocity(
            torch.tensor(velocity, dtype=torch.float64),
            torch.as_tensor(np.array(self.env.unwrapped.data.qpos)),
            torch.as_tensor(np.asarray(action, dtype=np.float64)),
            command=torch.tensor(self.command, dtype=torch.float64))
        info.update(command=self.command, forward_velocity=velocity, env_reward=env_reward)
        return self._observe(obs), float(reward), terminated, truncated, info


CHANGES: dict[str, type[gym.Wrapper]] = {
    "target_velocity": TargetVelocity,
    "friction": Friction,
    "mass": Mass,
    "gear": Gear,
    "gravity": Gravity,
    "randomize": DomainRandomization,
}


def parse_changes(change: str | Mapping | None, **params: Any) -> tuple[Change, ...]:
    """Accepts ``"friction", scale=0.4``, ``{"name": "friction", "scale": 0.4}`` or ``{"friction": {"scale": 0.4},
    "mass": {"scale": 1.3}}`` (several changes, applied in order)."""
    if change is None:
        return ()
    if isinstance(change, str):
        parsed = (Change(change, dict(params)),)
    elif params:
        raise ValueError("pass params either as keywords with a change name, or inside the mapping")
    elif "name" in change:
        rest = {k: v for k, v in change.items() if k != "name"}
        parsed = (Change(str(change["name"]), rest),)
    else:
        parsed = tuple(Change(str(name), dict(p or {})) for name, p in change.items())
    for item in parsed:
        if item.name not in CHANGES:
            raise ValueError(f"unknown change {item.name!r}; choose from {sorted(CHANGES)}")
    return parsed


def apply_change(env: gym.Env, change: str | Mapping | None, **params: Any) -> gym.Env:
    """Apply one or several named changes (see ``parse_changes`` for the forms) and wrap in ``ChangedEnv``."""
    changes = parse_changes(change, **params)
    if not changes:
        return env
    previous = env.changes if isinstance(env, ChangedEnv) else ()
    for item in changes:
        env = CHANGES[item.name](env, **item.params)
    return ChangedEnv(env, previous + changes)


def make_changed_env(task: str, change_cfg: str | Mapping | None = None, **make_kwargs: Any) -> gym.Env:
    """``gym.make(task, **make_kwargs)`` followed by ``apply_change(env, change_cfg)``."""
    return apply_change(gym.make(task, **make_kwargs), change_cfg)
