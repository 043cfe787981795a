"""Vectorised rollouts that store only real transitions, evaluation episodes, and the uniform random policy.

Gymnasium >= 1.0 vector envs default to next-step autoreset: the step *after* a termination is a reset step whose
(obs, action, reward) is fake. We build vector envs with same-step autoreset instead (``make_vector_env``), so every
step is a real transition: ``next_obs`` of a finished env is its true final observation, and the reset observation
only becomes the next ``obs``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import gymnasium as gym
import numpy as np

from envs.control.fast_mujoco import FastHumanoid, step_batch
from envs.control.tasks import make_vector_env

Policy = Callable[[np.ndarray], np.ndarray]


def random_policy(action_space: gym.Space, seed: int) -> Policy:
    """Uniform actions of ``action_space`` for a batch of observations, from its own seeded generator."""
    rng = np.random.default_rng(seed)
    low = np.asarray(action_space.low, np.float32)
    span = np.asarray(action_space.high, np.float32) - low

    def act(obs: np.ndarray) -> np.ndarray:
        # float32 draws scaled by hand: Generator.uniform re-validates its bounds on every call, ~5 % of a rollout
        return low + span * rng.random((obs.shape[0],) + low.shape, dtype=np.float32)

    return act


@dataclass
class EpisodeStats:
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    terminations: int = 0  # falls: episodes that ended by termination, not by the time limit


def _direct_stepper(env: gym.Env):
    """``(base env, action rescaler)`` when ``env`` is RescaleAction over wrappers that do not change steps, over an env
    with ``step_into`` (``envs.control.fast_mujoco``): the rollout can then rescale a whole batch of actions at once,
    exactly as RescaleAction does one, and step the base env without per-step wrapper calls and info dicts."""
    if not isinstance(env, gym.wrappers.RescaleAction) or not hasattr(env.unwrapped, "step_into"):
        return None
    inner = env.env
    while isinstance(inner, gym.Wrapper):
        # OrderEnforcing/PassiveEnvChecker only check call order and spaces; a change wrapper that edits the model
        # at build time keeps gym.Wrapper's step. Anything else (e.g. a target-velocity task) takes the full path.
        if not (isinstance(inner, (gym.wrappers.OrderEnforcing, gym.wrappers.PassiveEnvChecker))
                or type(inner).step is gym.Wrapper.step):
            return None
        inner = inner.env
    return env.unwrapped, env.func


class VectorRollout:
    """A batch of envs that persists between calls: ``collect(policy, steps)`` continues running episodes."""

    def __init__(self, task: str, num_envs: int, seed: int, change: dict | None = None,
                 physics_state: bool = False, lean: bool = True) -> None:
        self.envs = make_vector_env(task, num_envs, change, physics_state, lean)
        self.num_envs, self.physics_state = num_envs, physics_state
        self.obs, info = self.envs.reset(seed=seed)
        self.envs.action_space.seed(seed)
        self.state = self._physics(info) if physics_state else None
        self.ep_return = np.zeros(num_envs)
        self.ep_length = np.zeros(num_envs, dtype=np.int64)
        self.total_steps = 0
        direct = [_direct_stepper(env) for env in self.envs.envs]
        self.direct = direct if all(d is not None for d in direct) else None
        # one batched step for the whole vector when every env is a FastHumanoid with the same reward terms
        bases = [base for base, _ in self.direct] if self.direct else []
        self.batched = bool(bases) and all(type(b) is FastHumanoid for b in bases) and len(
            {b.reward_params() for b in bases}) == 1

    @property
    def single_action_space(self) -> gym.Space:
        return self.envs.single_action_space

    @property
    def single_observation_space(self) -> gym.Space:
        return self.envs.single_observation_space

    @staticmethod
    def _physics(info: dict) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(info["qpos"]), np.asarray(info["qvel"])

    def collect(self, policy: Policy, steps: int) -> tuple[dict[str, np.ndarray], EpisodeStats]:
        """Run ``steps`` vectorised steps; returns ``steps * num_envs`` real transitions and finished episodes.

        Rows are time-major (row ``t * num_envs + i`` is env ``i`` at step ``t``). The sub-envs are stepped here, with
        SyncVectorEnv's same-step autoreset semantics, straight into preallocated arrays: SyncVectorEnv's per-step
        info merging and re-stacking cost ~10 % of a Humanoid step, and nothing here needs the merged infos.
        """
        n, envs = self.num_envs, self.envs.envs
        obs_shape, act_shape = self.single_observation_space.shape, self.single_action_space.shape
        obs = np.empty((steps, n) + obs_shape, np.float32)
        next_obs = np.empty((steps, n) + obs_shape, np.float32)
        actions = np.empty((steps, n) + act_shape, np.float32)
        rewards = np.empty((steps, n))  # float64 as in SyncVectorEnv: episode returns accumulate in float64
        terminated = np.zeros((steps, n), bool)
        truncated = np.zeros((steps, n), bool)
        if self.physics_state:
            qpos, qvel = np.array(self.state[0]), np.array(self.state[1])
            qpos_out = np.empty((steps,) + qpos.shape)
            qvel_out = np.empty((steps,) + qvel.shape)
            next_qpos_out, next_qvel_out = np.empty_like(qpos_out), np.empty_like(qvel_out)
            ctrl_out = np.empty((steps, n) + np.shape(self.envs.envs[0].unwrapped.data.ctrl))
        stats = EpisodeStats()
        if self.direct is not None:
            rescale = self.direct[0][1]
            steppers = [base.step_into for base, _ in self.direct]
            bases = [base for base, _ in self.direct]
        for t in range(steps):
            action = np.asarray(policy(self.obs), dtype=np.float32)
            if action.shape != (n,) + act_shape:
                raise ValueError(f"policy returned actions of shape {action.shape}, expected {(n,) + act_shape}")
            obs[t] = self.obs
            actions[t] = action
            if self.physics_state:
                qpos_out[t], qvel_out[t] = qpos, qvel
            if self.direct is not None:
                ctrl = rescale(action)  # the whole batch at once, RescaleAction's own arithmetic
                if self.batched:
                    step_batch(bases, ctrl, next_obs[t], rewards[t], terminated[t], truncated[t])
                else:
                    for i, step_into in enumerate(steppers):
                        rewards[t, i], terminated[t, i], truncated[t, i] = step_into(ctrl[i], next_obs[t, i])
                if self.physics_state:
                    for i, base in enumerate(bases):
                        data = base.data
                        next_qpos_out[t, i], next_qvel_out[t, i], ctrl_out[t, i] = data.qpos, data.qvel, data.ctrl
            else:
                for i, env in enumerate(envs):
                    o, r, term, trunc, info = env.step(action[i])
                    next_obs[t, i], rewards[t, i], terminated[t, i], truncated[t, i] = o, r, term, trunc
                    if self.physics_state:
                        next_qpos_out[t, i], next_qvel_out[t, i] = info["qpos"], info["qvel"]
                        ctrl_out[t, i] = info["ctrl"]
            self.ep_return += rewards[t]
            self.ep_length += 1
            current = next_obs[t].copy()  # a fresh array per step: a policy may keep the one it was given
            if self.physics_state:
                qpos, qvel = next_qpos_out[t].copy(), next_qvel_out[t].copy()
            for i in np.flatnonzero(terminated[t] | truncated[t]):
                stats.returns.append(float(self.ep_return[i]))
                stats.lengths.append(int(self.ep_length[i]))
                stats.terminations += int(terminated[t, i])
                self.ep_return[i], self.ep_length[i] = 0.0, 0
                o, info = envs[i].reset()  # same-step autoreset: the reset observation is only the next ``obs``
                current[i] = o
                if self.physics_state:
                    qpos[i], qvel[i] = info["qpos"], info["qvel"]
            self.obs = current
            self.total_steps += n
        if self.physics_state:
            self.state = (qpos.copy(), qvel.copy())

        def rows(a: np.ndarray) -> np.ndarray:
            return a.reshape((steps * n,) + a.shape[2:])

        batch = {"obs": rows(obs), "action": rows(actions), "reward": rows(rewards.astype(np.float32)),
                 "next_obs": rows(next_obs), "terminated": rows(terminated.astype(np.float32)),
                 "truncated": rows(truncated.astype(np.float32))}
        if self.physics_state:
            batch.update(qpos=rows(qpos_out), qvel=rows(qvel_out), next_qpos=rows(next_qpos_out),
                         next_qvel=rows(next_qvel_out), ctrl=rows(ctrl_out))
        return batch, stats

    def close(self) -> None:
        self.envs.close()


def evaluate(task: str, policy: Policy, episodes: int, seed: int, change: dict | None = None,
             num_envs: int | None = None, lean: bool = True) -> EpisodeStats:
    """Run ``episodes`` full episodes (in parallel envs) with ``policy``; returns their returns and falls."""
    num_envs = num_envs or episodes
    envs = make_vector_env(task, num_envs, change, lean=lean)
    obs, _ = envs.reset(seed=seed)
    stats = EpisodeStats()
    ep_return = np.zeros(num_envs)
    ep_length = np.zeros(num_envs, dtype=np.int64)
    active = np.ones(num_envs, dtype=bool)  # each env contributes whole episodes until we have enough
    while len(stats.returns) < episodes:
        obs, reward, terminated, truncated, _ = envs.step(np.asarray(policy(obs), dtype=np.float32))
        ep_return += reward
        ep_length += 1
        for i in np.flatnonzero((terminated | truncated) & active):
            stats.returns.append(float(ep_return[i]))
            stats.lengths.append(int(ep_length[i]))
            stats.terminations += int(terminated[i])
            if len(stats.returns) + active.sum() - 1 >= episodes:
                active[i] = False
        done = terminated | truncated
        ep_return[done] = 0.0
        ep_length[done] = 0
    envs.close()
    stats.returns = stats.returns[:episodes]
    return stats
