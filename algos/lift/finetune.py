"""LIFT stage (iii) pieces in pure torch: schedules, model-rollout branching from real states, mixed SAC batches.

The finetuning loop (LIFT §3.1, ``world_model/finetune_wm_ac.py``), per epoch e:
    1. retrain the world model on all real data of the new environment (early stopping)
    2. collect real steps with the *deterministic* policy (the real robot never sees exploration noise)
    3. HUPT(e) times: draw ``rollout_batch`` start states from the real buffer (``sample_start_states``), roll the
       world model H(e) steps with the *stochastic* policy (``branch_rollouts``), append to the model buffer, then
       ``updates_per_rollout`` SAC steps on batches with a share ``real_ratio`` of real data (``mixed_sampler``)
with H(e) = floor(lin(e; e0 -> e1 : H0 -> H1)) and HUPT(e) likewise (``LinearSchedule``; LIFT: 0->10 : 1->20 for H,
0->4 : 10->1000 for HUPT).

The world model works on simulator states [qpos, qvel] and the simulator's control; the policy acts in [-1, 1] and
sees gymnasium observations, so the rollout maps a -> ctrl (``ActionScale``) and state -> obs (``obs_fn``), and scores
each predicted transition with the task's own reward and termination (``envs.control.task_rewards``).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

Tensor = torch.Tensor


@dataclass(frozen=True)
class LinearSchedule:
    """floor(lin(epoch; start_epoch -> end_epoch : start_value -> end_value)), clipped outside the epoch range (MBPO)."""

    start_epoch: int
    end_epoch: int
    start_value: int
    end_value: int

    def __post_init__(self) -> None:
        if self.end_epoch < self.start_epoch:
            raise ValueError(f"end_epoch {self.end_epoch} < start_epoch {self.start_epoch}")
        if min(self.start_value, self.end_value) < 1:
            raise ValueError(f"schedule values must be >= 1, got {self.start_value}, {self.end_value}")

    def __call__(self, epoch: int) -> int:
        if self.end_epoch == self.start_epoch:
            return self.end_value if epoch >= self.end_epoch else self.start_value
        frac = min(max((epoch - self.start_epoch) / (self.end_epoch - self.start_epoch), 0.0), 1.0)
        return int(math.floor(self.start_value + frac * (self.end_value - self.start_value)))

    @classmethod
    def from_list(cls, values: list[int] | tuple[int, ...], name: str) -> "LinearSchedule":
        """From LIFT's config form [start_epoch, end_epoch, start_value, end_value]."""
        if len(values) != 4:
            raise ValueError(f"{name}: expected [start_epoch, end_epoch, start_value, end_value], got {values}")
        try:
            return cls(*(int(v) for v in values))
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None


@dataclass(frozen=True)
class ActionScale:
    """The affine map gymnasium's ``RescaleAction`` applies: policy action a in [-1, 1] -> control in [low, high]."""

    low: Tensor
    high: Tensor

    def to_ctrl(self, action: Tensor) -> Tensor:
        low, high = self.low.to(action), self.high.to(action)
        return low + 0.5 * (action.clamp(-1.0, 1.0) + 1.0) * (high - low)

    def to_action(self, ctrl: Tensor) -> Tensor:
        low, high = self.low.to(ctrl), self.high.to(ctrl)
        return 2.0 * (ctrl - low) / (high - low) - 1.0


def sample_start_states(states: Tensor, n: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """``n`` rollout start states drawn uniformly (with replacement) from the real buffer's states (N, D).

    Returns (states (n, D), their row indices (n,)): every model rollout branches from a state the real env visited.
    """
    if len(states) == 0:
        raise ValueError("the real buffer is empty: collect real transitions before branching model rollouts")
    index = torch.randint(len(states), (n,), generator=generator, device=states.device)
    return states[index], index


@torch.no_grad()
def branch_rollouts(model, start: Tensor, policy: Callable[[Tensor], Tensor], obs_fn: Callable[[Tensor, Tensor], Tensor],
                    reward_fn: Callable[..., tuple[Tensor, Tensor]], action_scale: ActionScale, horizon: int,
                    member: str = "mean") -> tuple[dict[str, Tensor], dict[str, float]]:
    """H-step world-model rollouts from real states with the stochastic policy (LIFT §2.4 / §3.1 step 3).

    ``policy(obs) -> action in [-1, 1]`` (stochastic); the model steps on the control ``action_scale.to_ctrl(a)``;
    ``reward_fn(qpos, qvel, next_qpos, next_qvel, ctrl)`` recomputes reward and termination on the predicted state.
    A rollout stops after its first termination, or when the model's prediction leaves the finite numbers (that
    transition is dropped). Returns flat SAC transitions (obs, action, reward, next_obs, terminated, truncated = 0)
    of the live rows, and metrics (transitions, terminations, mean predicted std).
    """
    nq = model.nq
    state = start
    alive = torch.ones(len(start), dtype=torch.bool, device=start.device)
    out: dict[str, list[Tensor]] = {k: [] for k in ("obs", "action", "reward", "next_obs", "terminated")}
    terminations, std_sum, std_count = 0, 0.0, 0
    for _ in range(horizon):
        if not alive.any():
            break
        state = state[alive]
        obs = obs_fn(state[:, :nq], state[:, nq:])
        action = policy(obs.float())
        ctrl = action_scale.to_ctrl(action.to(state.dtype))
        next_state, logvar = model.predict(state, ctrl, member=member)
        finite = torch.isfinite(next_state).all(-1)
        reward, terminated = reward_fn(state[:, :nq], state[:, nq:], next_state[:, :nq], next_state[:, nq:], ctrl)
        keep = finite & torch.isfinite(reward)
        next_obs = obs_fn(next_state[:, :nq], next_state[:, nq:])
        for key, value in (("obs", obs), ("action", action), ("reward", reward), ("next_obs", next_obs),
                           ("terminated", terminated)):
            out[key].append(value[keep].float())
        terminations += int((terminated & keep).sum())
        std_sum += float((0.5 * logvar[keep]).exp().mean(-1).sum()) if keep.any() else 0.0
        std_count += int(keep.sum())
        alive = keep & ~terminated
        state = next_state
    batch = {k: torch.cat(v) if v else torch.empty(0) for k, v in out.items()}
    batch["truncated"] = torch.zeros_like(batch["reward"])
    return batch, {"model_transitions": float(len(batch["reward"])), "model_terminations": float(terminations),
                   "model_pred_std": std_sum / max(std_count, 1)}


def mixed_sampler(real_sample: Callable[[int], Mapping[str, Tensor]], model_sample: Callable[[int], Mapping[str, Tensor]],
                  real_ratio: float, generator: torch.Generator | None = None) -> Callable[[int], dict[str, Tensor]]:
    """``n -> batch`` with round(real_ratio · n) real and the rest model transitions, shuffled (MBPO/LIFT ``real_ratio``).

    Shuffling matters: ``algos.lift.sac.update`` cuts the G·B rows into G consecutive minibatches, each must be mixed.
    """
    if not 0.0 <= real_ratio <= 1.0:
        raise ValueError(f"real_ratio must be in [0, 1], got {real_ratio}")

    def sample(n: int) -> dict[str, Tensor]:
        n_real = int(round(real_ratio * n))
        parts = [p for p in (real_sample(n_real) if n_real else None, model_sample(n - n_real) if n - n_real else None)
                 if p is not None]
        batch = {k: torch.cat([p[k].float() for p in parts]) for k in parts[0]}
        order = torch.randperm(n, generator=generator, device=batch["reward"].device)
        return {k: v[order] for k, v in batch.items()}

    return sample


def action_rate(actions: np.ndarray, done: np.ndarray) -> float:
    """Mean squared action change between consecutive real steps of the same episode, mean_t |a_t − a_{t−1}|².

    ``actions`` (T, n_envs, A) and ``done`` (T, n_envs) are time-major; a pair is skipped when step t−1 ended an
    episode. A smoothness/safety measure of what the robot executed (LIFT's real-robot ``action_rate`` term).
    """
    if actions.shape[0] < 2:
        return float("nan")
    diff = np.square(actions[1:] - actions[:-1]).sum(-1)
    same_episode = ~done[:-1].astype(bool)
    return float(diff[same_episode].mean()) if same_episode.any() else float("nan")


def steps_to_recover(real_steps: np.ndarray, returns: np.ndarray, pre_change: float, zero_shot: float,
                     fraction: float = 0.8) -> int | None:
    """First real-env step count at which the evaluation return reaches ``zero_shot + fraction·(pre_change − zero_shot)``,
    i.e. recovers ``fraction`` of the return lost to the change; None if never. When the change cost nothing
    (pre_change <= zero_shot) the threshold is at most the zero-shot return, so the first evaluation counts."""
    threshold = zero_shot + fraction * (pre_change - zero_shot)
    for steps, ret in zip(real_steps, returns):
        if np.isfinite(ret) and ret >= threshold:
            return int(steps)
    return None
