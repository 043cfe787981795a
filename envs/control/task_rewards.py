"""Task rewards, terminations and observations recomputed from physical states, in torch (LIFT §2.1 step 5).

The world model predicts (qpos', qvel'); these functions turn a transition (qpos, qvel, qpos', qvel', action) into
gymnasium's own reward and termination, so that model rollouts are scored exactly as the real env scores them. The
same objects score the real env in ``envs.control.changes.TargetVelocity``, which keeps the reward identical between
pretraining and finetuning (only the command range differs).

Exactness against gymnasium v5 (tested in tests/test_env_changes.py and tests/test_world_model.py):
  * Walker2d, HalfCheetah, InvertedPendulum, Pendulum: exact (float64 round-off).
  * Humanoid: exact except (a) the contact cost 5e-7·Σ cfrc_ext² (clipped at 10), which needs the contact solver;
    it is 0 unless the caller passes ``contact_cost`` (its mean is ≈0.1 of a ≈5 reward under random actions, with
    rare spikes up to its cap on impacts); (b) gymnasium measures the centre of mass from ``data.xipos`` after
    ``mj_step``, i.e. one substep before the final state on both ends of the step, which differs from the velocity
    at the true states by ≈1e-4 m/s on average (≈1e-3 right after a reset).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol

import gymnasium as gym
import torch

from envs.control.task_table import gymnasium_id
from envs.control.torch_kinematics import TorchKinematics

Tensor = torch.Tensor


class TaskReward(Protocol):
    def __call__(self, qpos: Tensor, qvel: Tensor, next_qpos: Tensor, next_qvel: Tensor, action: Tensor,
                 command: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(reward (B,), terminated (B,) bool) for a batch of transitions."""
        ...


def _range_test(value: Tensor, bounds: tuple[float, float]) -> Tensor:
    return (value > bounds[0]) & (value < bounds[1])


@dataclass(frozen=True)
class LocomotionReward:
    """r = w_f·f(v) + r_alive·healthy(q') − w_c·|a|² − contact_cost;  terminated = ¬healthy(q') (if terminating).

    v is the forward velocity over the control step (``velocity_fn(qpos, next_qpos)``). f(v) = v reproduces
    gymnasium; with ``tracking_sigma`` set, f(v) = exp(−(v − v*)²/σ²) rewards tracking the command v* instead.
    """

    dt: float
    velocity_fn: Callable[[Tensor, Tensor], Tensor]
    forward_weight: float
    ctrl_cost_weight: float
    healthy_reward: float = 0.0
    healthy_fn: Callable[[Tensor], Tensor] | None = None
    terminate_when_unhealthy: bool = True
    tracking_sigma: float | None = None

    def __post_init__(self) -> None:
        if self.dt <= 0:
            raise ValueError(f"dt must be positive, got {self.dt}")
        if self.tracking_sigma is not None and self.tracking_sigma <= 0:
            raise ValueError(f"tracking_sigma must be positive, got {self.tracking_sigma}")

    def forward_velocity(self, qpos: Tensor, next_qpos: Tensor) -> Tensor:
        return self.velocity_fn(qpos, next_qpos) / self.dt

    def healthy(self, next_qpos: Tensor) -> Tensor:
        if self.healthy_fn is None:
            return torch.ones(next_qpos.shape[:-1], dtype=torch.bool, device=next_qpos.device)
        return self.healthy_fn(next_qpos)

    def __call__(self, qpos: Tensor, qvel: Tensor, next_qpos: Tensor, next_qvel: Tensor, action: Tensor,
                 command: Tensor | None = None, contact_cost: Tensor | None = None) -> tuple[Tensor, Tensor]:
        velocity = self.forward_velocity(qpos, next_qpos)
        return self.from_velocity(velocity, next_qpos, action, command, contact_cost)

    def from_velocity(self, velocity: Tensor, next_qpos: Tensor, action: Tensor, command: Tensor | None = None,
                      contact_cost: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The reward given an already measured forward velocity (the env-side wrapper measures it in MuJoCo)."""
        if self.tracking_sigma is None:
            forward = velocity
        else:
            if command is None:
                raise ValueError("a velocity-tracking reward needs the command")
            forward = torch.exp(-((velocity - command) / self.tracking_sigma) ** 2)
        healthy = self.healthy(next_qpos)
        reward = (self.forward_weight * forward + self.healthy_reward * healthy.to(velocity.dtype)
                  - self.ctrl_cost_weight * action.square().sum(-1))
        if contact_cost is not None:
            reward = reward - contact_cost
        terminated = ~healthy if self.terminate_when_unhealthy else torch.zeros_like(healthy)
        return reward, terminated


@dataclass(frozen=True)
class InvertedPendulumReward:
    """+1 per step while |pole angle| ≤ 0.2 and the state is finite; terminates otherwise (gymnasium v5)."""

    max_angle: float = 0.2

    def __call__(self, qpos: Tensor, qvel: Tensor, next_qpos: Tensor, next_qvel: Tensor, action: Tensor,
                 command: Tensor | None = None) -> tuple[Tensor, Tensor]:
        finite = torch.isfinite(next_qpos).all(-1) & torch.isfinite(next_qvel).all(-1)
        terminated = ~finite | (next_qpos[..., 1].abs() > self.max_angle)
        return (~terminated).to(next_qpos.dtype), terminated


@dataclass(frozen=True)
class PendulumReward:
    """Pendulum-v1 with qpos = [θ], qvel = [θ̇]: −(wrap(θ)² + 0.1 θ̇² + 0.001 u²) at the state *before* the step."""

    max_torque: float = 2.0

    def __call__(self, qpos: Tensor, qvel: Tensor, next_qpos: Tensor, next_qvel: Tensor, action: Tensor,
                 command: Tensor | None = None) -> tuple[Tensor, Tensor]:
        theta = torch.remainder(qpos[..., 0] + math.pi, 2 * math.pi) - math.pi
        torque = action[..., 0].clamp(-self.max_torque, self.max_torque)
        cost = theta.square() + 0.1 * qvel[..., 0].square() + 0.001 * torque.square()
        return -cost, torch.zeros_like(cost, dtype=torch.bool)


def _x_displacement(qpos: Tensor, next_qpos: Tensor) -> Tensor:
    return next_qpos[..., 0] - qpos[..., 0]


def _planar_healthy(z_range: tuple[float, float], angle_range: tuple[float, float]) -> Callable[[Tensor], Tensor]:
    def healthy(next_qpos: Tensor) -> Tensor:
        return _range_test(next_qpos[..., 1], z_range) & _range_test(next_qpos[..., 2], angle_range)
    return healthy


def _height_healthy(z_range: tuple[float, float]) -> Callable[[Tensor], Tensor]:
    def healthy(next_qpos: Tensor) -> Tensor:
        return _range_test(next_qpos[..., 2], z_range)
    return healthy


def _com_displacement(kinematics: TorchKinematics) -> Callable[[Tensor, Tensor], Tensor]:
    def displacement(qpos: Tensor, next_qpos: Tensor) -> Tensor:
        return kinematics.center_of_mass(next_qpos)[..., 0] - kinematics.center_of_mass(qpos)[..., 0]
    return displacement


# gymnasium env name -> task family (named like its task in ``envs.control.tasks.TASKS``)
FAMILIES = {"Walker2d": "walker2d", "HalfCheetah": "half_cheetah", "Humanoid": "humanoid",
            "InvertedPendulum": "inverted_pendulum", "Pendulum": "pendulum"}


def task_family(env_or_id: gym.Env | str) -> str:
    """'walker2d', 'half_cheetah', 'humanoid', 'inverted_pendulum' or 'pendulum' (the ``TASKS`` name of the env's
    gymnasium original) for an env or an env id (gymnasium's or orrery's registered one)."""
    env_id = gymnasium_id(env_or_id if isinstance(env_or_id, str) else env_or_id.unwrapped.spec.id)
    name = env_id.split("/")[-1].split("-")[0]
    if name not in FAMILIES:
        raise ValueError(f"no task reward for {env_id!r}; known: {sorted(FAMILIES)}")
    return FAMILIES[name]


# Tracking weight: the command term should be worth at least the alive bonus, or standing still wins.
DEFAULT_TRACKING_WEIGHT = {"walker2d": 2.0, "half_cheetah": 2.0, "humanoid": 10.0}


def make_task_reward(env: gym.Env, tracking_sigma: float | None = None,
                     tracking_weight: float | None = None) -> TaskReward:
    """The torch reward/termination of ``env``'s task, with the env's own weights and ranges.

    With ``tracking_sigma`` the forward-velocity term becomes command tracking (``LocomotionReward``); this is only
    meaningful for the locomotion tasks.
    """
    family, base = task_family(env), env.unwrapped
    if family in ("inverted_pendulum", "pendulum"):
        if tracking_sigma is not None:
            raise ValueError(f"velocity tracking is not meaningful for {family}")
        return InvertedPendulumReward() if family == "inverted_pendulum" else PendulumReward(float(base.max_torque))
    if family == "walker2d":
        velocity_fn = _x_displacement
        healthy_fn = _planar_healthy(base._healthy_z_range, base._healthy_angle_range)
    elif family == "half_cheetah":
        velocity_fn, healthy_fn = _x_displacement, None
    else:
        velocity_fn = _com_displacement(TorchKinematics(base.model))
        healthy_fn = _height_healthy(base._healthy_z_range)
    if tracking_sigma is None:
        forward_weight = float(base._forward_reward_weight)
    else:
        forward_weight = DEFAULT_TRACKING_WEIGHT[family] if tracking_weight is None else float(tracking_weight)
    return LocomotionReward(
        dt=float(base.dt), velocity_fn=velocity_fn, forward_weight=forward_weight,
        ctrl_cost_weight=float(base._ctrl_cost_weight),
        healthy_reward=float(getattr(base, "_healthy_reward", 0.0)), healthy_fn=healthy_fn,
        terminate_when_unhealthy=bool(getattr(base, "_terminate_when_unhealthy", False)),
        tracking_sigma=tracking_sigma)


def make_observation_fn(env: gym.Env) -> Callable[..., Tensor]:
    """``obs(qpos, qvel, command=None)``: the policy observation gymnasium builds from the physical state, in torch.

    World-model rollouts need it to query the policy on predicted states. Humanoid must be made with
    ``include_cinert/cvel/qfrc_actuator/cfrc_ext_in_observation=False`` (those need the full MuJoCo pipeline).
    A velocity command, if given, is appended last (as ``envs.control.changes.TargetVelocity`` does).
    """
    family, base = task_family(env), env.unwrapped
    if family == "pendulum":
        def pendulum_obs(qpos: Tensor, qvel: Tensor, command: Tensor | None = None) -> Tensor:
            return torch.stack((torch.cos(qpos[..., 0]), torch.sin(qpos[..., 0]), qvel[..., 0]), dim=-1)
        return pendulum_obs
    structure = base.observation_structure
    extras = [k for k in ("cinert", "cvel", "qfrc_actuator", "cfrc_ext") if structure.get(k, 0)]
    if extras:
        raise ValueError(f"observation includes {extras}, which are not functions of (qpos, qvel) alone; make the env "
                         f"with include_<name>_in_observation=False")
    skipped = int(structure.get("skipped_qpos", 0))
    clip = 10.0 if family == "walker2d" else None  # Walker2d-v5 clips velocities in its observation

    def observation(qpos: Tensor, qvel: Tensor, command: Tensor | None = None) -> Tensor:
        velocity = qvel if clip is None else qvel.clamp(-clip, clip)
        parts = [qpos[..., skipped:], velocity]
        if command is not None:
            parts.append(command.reshape(*qpos.shape[:-1], 1).to(qpos.dtype))
        return torch.cat(parts, dim=-1)
    return observation
