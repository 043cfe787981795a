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
def branch_rollouts(model, start: Tensor, policy: Callable[[Tensor], Tensor], obs_fn: Callable[..., Tensor],
                    reward_fn: Callable[..., tuple[Tensor, Tensor]], action_scale: ActionScale, horizon: int,
                    member: str = "mean", command: Tensor | None = None, obs_noise: float = 0.0,
                    generator: torch.Generator | None = None) -> tuple[dict[str, Tensor], dict[str, float]]:
    """H-step world-model rollouts from real states with the stochastic policy (LIFT §2.4 / §3.1 step 3).

    ``policy(obs) -> action in [-1, 1]`` (stochastic); the model steps on the control ``action_scale.to_ctrl(a)``;
    ``reward_fn(qpos, qvel, next_qpos, next_qvel, ctrl)`` recomputes reward and termination on the predicted state.
    ``command`` (n,): each start state's velocity command (a command-conditioned task), passed to ``obs_fn`` and
    ``reward_fn``. The state is propagated by the model's mean. With ``obs_noise`` > 0 the actor's view of it carries
    Gaussian noise of ``obs_noise`` x the model's predicted std (LIFT's ``wm_noise_to_actor_noise``), and that view is
    what LIFT stores as the actor's state (``wm_networks.py:179-182``, ``finetune_wm_ac.py:1588-1607``): ``obs`` and
    ``next_obs`` (the actor's and alpha's losses, the target's next action) are the noisy view, ``critic_obs`` and
    ``next_critic_obs`` (Q and the target Q) the mean state's, like the reward and the termination.
    A rollout that terminates starts again from its start state and runs on until H steps (LIFT's model env sits in
    an ``AutoResetWrapper``, ``finetune_wm_ac.py:264-270``), so a branch yields n·H transitions; a prediction that
    leaves the finite numbers is dropped and its row restarts too. Returns flat SAC transitions (truncated = 0) and
    metrics (transitions, terminations, mean predicted std).
    """
    nq = model.nq

    def observe(state: Tensor, cmd: Tensor | None) -> Tensor:
        return obs_fn(state[:, :nq], state[:, nq:]) if cmd is None else obs_fn(state[:, :nq], state[:, nq:], cmd)

    extra = () if command is None else (command,)
    start_obs = observe(start, command)
    state, obs, actor_obs = start, start_obs, start_obs  # start states are real: the actor sees them as they are
    keys = ("obs", "action", "reward", "next_obs", "terminated", "critic_obs", "next_critic_obs")
    out: dict[str, list[Tensor]] = {k: [] for k in keys}
    terminations, std_sum, std_count = 0, 0.0, 0
    for _ in range(horizon if len(start) else 0):
        action = policy(actor_obs.float())
        ctrl = action_scale.to_ctrl(action.to(state.dtype))
        next_state, logvar = model.predict(state, ctrl, member=member)
        finite = torch.isfinite(next_state).all(-1)
        reward, terminated = reward_fn(state[:, :nq], state[:, nq:], next_state[:, :nq], next_state[:, nq:], ctrl,
                                       *extra)
        keep = finite & torch.isfinite(reward)
        std = (0.5 * logvar).exp()
        next_obs = observe(next_state, command)
        next_actor_obs = next_obs
        if obs_noise > 0:
            noise = torch.randn(next_state.shape, generator=generator, device=next_state.device,
                                dtype=next_state.dtype)
            next_actor_obs = observe(next_state + obs_noise * std.nan_to_num(0.0) * noise, command)
        for key, value in (("obs", actor_obs), ("action", action), ("reward", reward), ("next_obs", next_actor_obs),
                           ("terminated", terminated), ("critic_obs", obs), ("next_critic_obs", next_obs)):
            out[key].append(value[keep].float())
        terminations += int((terminated & keep).sum())
        std_sum += float(std[keep].mean(-1).sum()) if keep.any() else 0.0
        std_count += int(keep.sum())
        restart = (~keep | terminated.bool()).unsqueeze(-1)
        state = torch.where(restart, start, next_state)
        obs = torch.where(restart, start_obs, next_obs)
        actor_obs = torch.where(restart, start_obs, next_actor_obs)
    batch = {k: torch.cat(v) if v else torch.empty(0) for k, v in out.items()}
    batch["truncated"] = torch.zeros_like(batch["reward"])
    return batch, {"model_transitions": float(len(batch["reward"])), "model_terminations": float(terminations),
                   "model_pred_std": std_sum / max(std_count, 1)}


def with_critic_view(batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A transition batch with ``critic_obs``/``next_critic_obs``: its own, or (real data, no noise) obs/next_obs."""
    out = dict(batch)
    if "critic_obs" not in out and "obs" in out:
        out["critic_obs"] = out["obs"]
    if "next_critic_obs" not in out and "next_obs" in out:
        out["next_critic_obs"] = out["next_obs"]
    return out


@dataclass(frozen=True)
class Branching:
    """What model rollouts need besides the model: the task's observation and reward in torch, the action range,
    which ensemble member steps (``mean`` for LIFT's single model, ``random`` for MBPO) and the actor's obs noise."""

    obs_fn: Callable[..., Tensor]
    reward_fn: Callable[..., tuple[Tensor, Tensor]]
    action_scale: ActionScale
    member: str = "mean"
    obs_noise: float = 1.0


def branch_and_update(model, branching: Branching, states: Tensor, commands: Tensor | None,
                      policy: Callable[[Tensor], Tensor], *, n_branches: int, horizon: int, rollout_batch: int,
                      model_buffer, real_sample: Callable[[int], Mapping[str, Tensor]],
                      update: Callable[[Callable[[int], dict[str, Tensor]]], dict[str, float]], real_ratio: float,
                      generator: torch.Generator | None = None) -> dict[str, float]:
    """LIFT §3.1 step 3: ``n_branches`` x {``rollout_batch`` start states from the real ``states`` -> ``horizon``-step
    model rollouts -> ``model_buffer``; one ``update(sampler)`` call on batches with ``real_ratio`` real data}.

    Exactly ``n_branches`` updates run whatever the model produced: with several DDP ranks every backward is a
    collective, so a rank that skipped an update (its rollouts all diverged, its model buffer still empty) would leave
    the others waiting forever. A rank without model data trains on real data alone for that update.
    Returns the last update's metrics and the rollouts' totals.
    """
    train_metrics: dict[str, float] = {}
    transitions, terminations, std_sum = 0.0, 0.0, 0.0
    for _ in range(n_branches):
        start, index = sample_start_states(states, rollout_batch, generator)
        command = None if commands is None else commands[index]
        batch, metrics = branch_rollouts(model, start, policy, branching.obs_fn, branching.reward_fn,
                                         branching.action_scale, horizon, branching.member, command,
                                         branching.obs_noise, generator)
        if len(batch["reward"]):
            model_buffer.add(batch)
        transitions += metrics["model_transitions"]
        terminations += metrics["model_terminations"]
        std_sum += metrics["model_pred_std"] * metrics["model_transitions"]
        ratio = real_ratio if len(model_buffer) else 1.0
        model_sample = lambda n: model_buffer.sample(n, generator)  # noqa: E731
        train_metrics = update(mixed_sampler(real_sample, model_sample, ratio, generator))
    return {**train_metrics, "model_transitions": transitions, "model_terminations": terminations,
            "model_pred_std": std_sum / max(transitions, 1.0)}


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
        if any("critic_obs" in p for p in parts):  # model rows carry the critic's clean view; real rows are clean
            parts = [with_critic_view(p) for p in parts]
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
