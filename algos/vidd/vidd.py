"""VIDD: value-guided iterative distillation for reward fine-tuning of masked diffusion models.

Su, Li, Uehara et al., "Iterative Distillation for Reward-Guided Fine-Tuning of Diffusion Models in
Biomolecular Design" (ICLR 2026), Algorithm 1. Per iteration ``s``:

1. **Roll-in.** With probability ``beta`` a batch of full trajectories ``x_T .. x_0`` comes from the
   roll-out model ``p_out``, otherwise from the pretrained model ``p_pre`` (off-policy exploration).
2. **Roll-out.** For each selected roll-in state ``x_t`` draw ``xbar_{t-1} ~ p_out(. | x_t)``.
3. **Soft values** from the one-step denoised prediction: ``v(x) = r(x0hat(x))``.
4. **Distillation** (eq. 7): minimise ``-w * log p_theta(xbar_{t-1} | x_t)`` with
   ``w = exp((v(xbar_{t-1}) - v(x_t)) / alpha)``, a sample estimate of the per-step forward KL
   ``KL(p*_{t-1}(. | x_t) || p_theta(. | x_t))`` to the soft-optimal policy
   ``p*_{t-1} ∝ p_out_{t-1} exp(v_{t-1} / alpha)``. Only positions unmasked in that step carry theta.
5. **Lazy update.** Every ``K`` iterations ``p_out <- p_theta`` (hard copy, no EMA).

The sampler (:func:`algos.vidd.mdlm.sample`) and the reward oracle are separate callables so that a
distributed driver can run roll-ins and reward queries on pool workers (:func:`collect_vidd_batch`
returns plain tensors) and the loss/update (:func:`vidd_loss`) on a learner.

Variants beyond Alg. 1 (off by default; see :class:`VIDDConfig`): ``value_estimator="greedy"``
(iterative decoding for x0hat), ``next_value="rollout"`` (numerator ``exp(r(x0)/alpha)`` from one
completion of ``xbar`` under ``p_out``, as the released protein code does; unbiased for the soft value),
``exact_teacher_term`` (a control variate), ``updates_per_batch``, weight clipping/normalization.
With a weak (smoke-scale) denoiser the one-step values r(x0hat) barely move QED while the student
drifts, whereas ``next_value="rollout"`` learns quickly without drift (tests/test_vidd_molecule.py).

Baselines at the same reward-query budget: ``best_of_n`` (test-time selection from ``p_pre``),
``standard_ft`` (``beta = 0``, ``p_out = p_pre`` forever: one-shot distillation of ``p_pre``'s
soft-optimal policy) and ``ddpo`` (clipped policy gradient over the denoising chain, :mod:`algos.vidd.ddpo`).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Callable, Literal

import numpy as np
import torch
from torch import Tensor, nn

from algos.vidd import ddpo
from algos.vidd.mdlm import (
    LogLinearSchedule,
    SampleResult,
    complete,
    denoise_greedy,
    denoise_one_step,
    newly_unmasked_log_prob,
    reverse_step,
    sample,
    step_times,
    x0_log_probs,
)

log = logging.getLogger(__name__)

RewardFn = Callable[[Tensor], tuple[np.ndarray, dict]]
SampleFn = Callable[..., SampleResult]
Method = Literal["vidd", "standard_ft", "ddpo", "best_of_n"]
METHODS: tuple[str, ...] = ("vidd", "standard_ft", "ddpo", "best_of_n")


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


@dataclass
class VIDDConfig:
    """Hyper-parameters of VIDD and of the baselines run by :func:`finetune` (laptop-sized defaults)."""

    alpha: float = 0.1  # temperature of the soft-optimal policy (reward units)
    beta: float = 1.0  # probability that a roll-in batch comes from p_out (else from p_pre)
    refresh_interval: int | None = 5  # K: copy theta into p_out every K iterations; None = never
    timesteps_per_trajectory: int | None = 4  # random roll-in steps distilled per trajectory; None = all T
    batch_size: int = 32  # roll-in trajectories per iteration
    num_iterations: int = 100
    max_reward_queries: int | None = None  # budget; training stops before exceeding it
    lr: float = 1e-4
    updates_per_batch: int = 1  # gradient steps per collected batch; the weights do not depend on theta,
    # so re-using a batch needs no importance correction (1 = the paper)
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    num_sampling_steps: int = 32  # T of the ancestral sampler used for roll-ins
    value_model: Literal["rollout", "student"] = "rollout"  # Alg. 1 uses p_out; the DNA code the student
    # x0hat for v(x) = r(x0hat(x)): "one_step" argmax (Alg. 1, DNA code) or "greedy" iterative decoding
    # with greedy_tokens_per_step tokens per pass (protein code); both cost one reward query per state
    value_estimator: Literal["one_step", "greedy"] = "one_step"
    greedy_tokens_per_step: int = 4
    # v(xbar_{t-1}): "denoised" = same estimator as v(x_t) (Alg. 1); "rollout" = r(x0) of one completion
    # x0 ~ p_out(. | xbar_{t-1}), unbiased for exp(v*/alpha) (released protein code)
    next_value: Literal["denoised", "rollout"] = "denoised"
    max_log_weight: float | None = None  # clamp (v_next - v_cur) / alpha from above; None = exact weights
    # divide the weights by their mean within each reverse step t of the batch (a per-step self-normalized
    # estimate: with exact soft values E[w | x_t] = 1; estimated values are biased per step, and one batch-wide
    # constant would change nothing under Adam)
    self_normalize_weights: bool = False
    # control variate (not in the paper): write w = 1 + (w - 1) and replace the "1" part, plain MLE on
    # p_out's samples, by its exact expectation q * sum_masked CE(p_out(x0|x_t), p_theta(x0|x_t)); the
    # expected gradient is unchanged, the sampling noise that makes the student drift is removed. Only valid
    # when the weights average 1 per state, hence it requires self_normalize_weights
    exact_teacher_term: bool = False
    # DDPO baseline
    ddpo_clip: float = 0.2
    ddpo_inner_steps: int = 2
    # best-of-N baseline: number of selected outputs; N = max_reward_queries // best_of_n_outputs
    best_of_n_outputs: int = 64
    eval_every: int = 0  # call eval_fn every this many iterations (0: only at the end)
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.alpha > 0:
            raise ValueError(f"VIDDConfig.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"VIDDConfig.beta must lie in [0, 1], got {self.beta}")
        if self.refresh_interval is not None and self.refresh_interval < 1:
            raise ValueError(f"VIDDConfig.refresh_interval must be >= 1 or None, got {self.refresh_interval}")
        if self.timesteps_per_trajectory is not None and not (
            1 <= self.timesteps_per_trajectory <= self.num_sampling_steps
        ):
            raise ValueError(
                "VIDDConfig.timesteps_per_trajectory must lie in [1, num_sampling_steps] or be None, "
                f"got {self.timesteps_per_trajectory}"
            )
        for name in ("batch_size", "num_iterations", "num_sampling_steps", "updates_per_batch", "ddpo_inner_steps",
                     "best_of_n_outputs"):
            if getattr(self, name) < 1:
                raise ValueError(f"VIDDConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_reward_queries is not None and self.max_reward_queries < 1:
            raise ValueError(f"VIDDConfig.max_reward_queries must be >= 1 or None, got {self.max_reward_queries}")
        if self.lr <= 0 or self.grad_clip <= 0:
            raise ValueError(f"VIDDConfig.lr and grad_clip must be > 0, got {self.lr}, {self.grad_clip}")
        if self.value_estimator not in ("one_step", "greedy"):
            raise ValueError(f"VIDDConfig.value_estimator must be 'one_step' or 'greedy', got {self.value_estimator!r}")
        if self.greedy_tokens_per_step < 1:
            raise ValueError(f"VIDDConfig.greedy_tokens_per_step must be >= 1, got {self.greedy_tokens_per_step}")
        if self.next_value not in ("denoised", "rollout"):
            raise ValueError(f"VIDDConfig.next_value must be 'denoised' or 'rollout', got {self.next_value!r}")
        if self.value_model not in ("rollout", "student"):
            raise ValueError(f"VIDDConfig.value_model must be 'rollout' or 'student', got {self.value_model!r}")
        if self.exact_teacher_term and not self.self_normalize_weights:
            raise ValueError("VIDDConfig.exact_teacher_term needs self_normalize_weights=True (the control variate "
                             "assumes weights of mean 1; estimated values give means of 10-20 on molecules)")
        if self.ddpo_clip <= 0:
            raise ValueError(f"VIDDConfig.ddpo_clip must be > 0, got {self.ddpo_clip}")
        if self.eval_every < 0:
            raise ValueError(f"VIDDConfig.eval_every must be >= 0, got {self.eval_every}")

    @property
    def steps_per_trajectory(self) -> int:
        return self.timesteps_per_trajectory or self.num_sampling_steps


# --------------------------------------------------------------------------------------------------
# Reward-query accounting
# --------------------------------------------------------------------------------------------------


class RewardCounter:
    """Wraps a batched reward oracle and counts every query against an optional budget.

    Identical token rows inside one call are scored once (the oracles are deterministic), so
    ``n_queries`` is the number of distinct sequences sent to the oracle. The oracle's own ``info``
    counts (invalid molecules, errors, ...) are summed in ``info``.
    """

    def __init__(self, reward_fn: RewardFn, budget: int | None = None) -> None:
        self.reward_fn = reward_fn
        self.budget = budget
        self.n_queries = 0
        self.info: dict[str, float] = {}

    @property
    def remaining(self) -> int | float:
        return math.inf if self.budget is None else self.budget - self.n_queries

    def __call__(self, tokens: Tensor) -> tuple[Tensor, dict]:
        if tokens.shape[0] == 0:
            return torch.zeros(0), {}
        unique, inverse = torch.unique(tokens, dim=0, return_inverse=True)
        if unique.shape[0] > self.remaining:
            raise RuntimeError(f"reward budget exceeded: {unique.shape[0]} queries, {self.remaining} left")
        rewards, info = self.reward_fn(unique)
        self.n_queries += unique.shape[0]
        for key, value in info.items():
            if isinstance(value, (int, float)) and key != "n_queries":
                self.info[key] = self.info.get(key, 0) + value
        return torch.as_tensor(np.asarray(rewards), dtype=torch.float32)[inverse], info


# --------------------------------------------------------------------------------------------------
# Algorithm 1 building blocks
# --------------------------------------------------------------------------------------------------


def soft_optimal_weights(
    v_next: Tensor, v_current: Tensor, alpha: float, max_log_weight: float | None = None
) -> Tensor:
    """Eq. 7 ratio ``exp(v(xbar_{t-1}) / alpha) / exp(v(x_t) / alpha)``, computed in log space."""
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    log_w = (v_next - v_current) / alpha
    if max_log_weight is not None:
        log_w = log_w.clamp(max=max_log_weight)
    return log_w.exp()


def denoised_prediction(
    model: nn.Module, states: Tensor, estimator: Literal["one_step", "greedy"] = "one_step", tokens_per_step: int = 4
) -> Tensor:
    """The clean sequence ``x0hat(x)`` that the value ``v(x) = r(x0hat(x))`` scores.

    ``one_step``: the position-wise argmax of one denoiser pass (Alg. 1). On weak denoisers its early-step
    completions are atypical (runs of the most frequent token), which biases value differences;
    ``greedy`` decodes iteratively (released protein code), which keeps completions in-distribution.
    """
    if estimator == "one_step":
        return denoise_one_step(model, states)
    if estimator == "greedy":
        return denoise_greedy(model, states, tokens_per_step)
    raise ValueError(f"estimator must be 'one_step' or 'greedy', got {estimator!r}")


@torch.no_grad()
def soft_values(
    value_model: nn.Module,
    states: Tensor,
    reward_fn: RewardFn,
    estimator: Literal["one_step", "greedy"] = "one_step",
    tokens_per_step: int = 4,
) -> tuple[Tensor, dict]:
    """``v(x) = r(x0hat(x))`` (Alg. 1, roll-out): one reward query per state, no Monte Carlo, no critic."""
    rewards, info = reward_fn(denoised_prediction(value_model, states, estimator, tokens_per_step))
    return torch.as_tensor(np.asarray(rewards), dtype=torch.float32), info


def select_steps(
    n_trajectories: int, T: int, k: int | None, generator: torch.Generator | None = None
) -> Tensor:
    """``[n_trajectories, k]`` reverse-step indices, distinct within a trajectory (all ``T`` when ``k`` is None)."""
    if k is None or k >= T:
        return torch.arange(T).expand(n_trajectories, T)
    scores = torch.rand(n_trajectories, T, generator=generator)
    return scores.argsort(dim=1)[:, :k]


def rollin(
    pretrained: nn.Module,
    rollout_model: nn.Module,
    n: int,
    length: int,
    cfg: VIDDConfig,
    generator: torch.Generator | None = None,
    sample_fn: SampleFn = sample,
) -> tuple[Tensor, bool]:
    """Roll-in trajectories ``[T + 1, n, L]``: from ``p_out`` with probability ``beta``, else ``p_pre``.

    The coin is flipped once per batch, as in the released code. Returns ``(states, used_rollout_model)``.
    """
    use_rollout = bool(torch.rand((), generator=generator) < cfg.beta)
    policy = rollout_model if use_rollout else pretrained
    result = sample_fn(policy, n, length, cfg.num_sampling_steps, generator, record_trajectory=True)
    return result.states, use_rollout


@dataclass
class VIDDBatch:
    """Roll-out transitions with their soft values; plain tensors, so it can cross process boundaries."""

    x_t: Tensor  # [N, L] roll-in states
    x_next: Tensor  # [N, L] xbar_{t-1} ~ p_out(. | x_t)
    t: Tensor  # [N]
    s: Tensor  # [N]
    v_current: Tensor  # [N] v(x_t)
    v_next: Tensor  # [N] v(xbar_{t-1})
    changed: Tensor  # [N] bool: some token was unmasked (others have zero loss and no value queries)
    teacher_log_probs: Tensor | None = None  # [N, L, V] log p_out(x0 | x_t), only for exact_teacher_term

    def __len__(self) -> int:
        return self.x_t.shape[0]


@torch.no_grad()
def collect_vidd_batch(
    rollout_model: nn.Module,
    value_model: nn.Module,
    states: Tensor,
    steps: Tensor,
    reward_fn: RewardFn,
    generator: torch.Generator | None = None,
    schedule: LogLinearSchedule | None = None,
    max_queries: int | float = math.inf,
    value_estimator: Literal["one_step", "greedy"] = "one_step",
    greedy_tokens_per_step: int = 4,
    next_value: Literal["denoised", "rollout"] = "denoised",
    states_from_rollout_model: bool = False,
    keep_teacher_log_probs: bool = False,
) -> tuple[VIDDBatch, dict]:
    """Roll-out and soft values for roll-in ``states`` ``[T+1, B, L]`` at reverse steps ``steps`` ``[B, k]``.

    ``v(x_t)`` is always ``r(x0hat(x_t))``. ``v(xbar_{t-1})`` is either the same estimator
    (``next_value="denoised"``, Alg. 1) or ``r(x0)`` of one completion ``x0 ~ p_out(. | xbar_{t-1})``
    (``"rollout"``, the released protein code): ``exp(r(x0) / alpha)`` is then an unbiased estimate of
    ``exp(v*(xbar) / alpha)``, the numerator of the soft-optimal weight.

    When the roll-in came from ``p_out`` (``states_from_rollout_model``) the trajectory's own next state
    ``x_{t-1}`` is exactly a draw ``xbar_{t-1} ~ p_out(. | x_t)`` and is reused (and so is its final sample
    for ``"rollout"``). With ``"denoised"`` values, ``v(xbar_{t-1})`` of step ``t`` is then the same
    oracle call as ``v(x_{t-1})`` of step ``t - 1``: one oracle call is made per batch on the distinct
    denoised states, so distilling all ``T`` steps of a trajectory costs about ``T + 1`` queries, not ``2 T``
    (the released DNA code draws a fresh ``xbar`` per step and pays two).

    Transitions in which nothing is unmasked have zero loss and are not sent to the oracle. If the
    distinct denoised states do not fit in ``max_queries``, whole trajectories (in random order) are
    dropped from the end until they do.
    """
    if next_value not in ("denoised", "rollout"):
        raise ValueError(f"next_value must be 'denoised' or 'rollout', got {next_value!r}")
    schedule = schedule or LogLinearSchedule()
    T = states.shape[0] - 1
    batch_index = torch.arange(states.shape[1]).unsqueeze(1).expand_as(steps)
    steps, batch_index = steps.reshape(-1), batch_index.reshape(-1)
    x_t = states[steps, batch_index]
    t, s = step_times(T, steps)
    reuse = states_from_rollout_model
    teacher_log_probs = x0_log_probs(rollout_model, x_t) if keep_teacher_log_probs or not reuse else None
    if reuse:
        x_next = states[steps + 1, batch_index]
        finals = states[T, batch_index] if next_value == "rollout" else None
    else:
        x_next = reverse_step(rollout_model, x_t, t, s, schedule, generator, log_p_x0=teacher_log_probs)
        finals = complete(rollout_model, x_next, steps + 1, T, generator, schedule) if next_value == "rollout" else None
    changed = (x_next != x_t).any(dim=-1)
    idx = changed.nonzero().squeeze(1)
    if not len(idx):  # nothing to score (the denoiser is not called on an empty batch)
        scored_current = scored_next = x_t[idx]
    else:
        scored_current = denoised_prediction(value_model, x_t[idx], value_estimator, greedy_tokens_per_step)
        scored_next = (finals[idx] if next_value == "rollout"
                       else denoised_prediction(value_model, x_next[idx], value_estimator, greedy_tokens_per_step))
    if distinct_rows(scored_current, scored_next) > max_queries:
        trajectory_rank = torch.randperm(states.shape[1], generator=generator)[batch_index[idx]]
        order = torch.argsort(trajectory_rank * (T + 1) + steps[idx])
        idx, scored_current, scored_next = idx[order], scored_current[order], scored_next[order]
        n_fit = largest_prefix_within(scored_current, scored_next, int(max_queries))
        idx, scored_current, scored_next = idx[:n_fit], scored_current[:n_fit], scored_next[:n_fit]
        selected = ~changed
        selected[idx] = True
        position = torch.cumsum(selected.long(), 0) - 1  # kept transitions keep their original order
        idx = position[idx]
        x_t, x_next, t, s, changed = x_t[selected], x_next[selected], t[selected], s[selected], changed[selected]
        teacher_log_probs = teacher_log_probs[selected] if teacher_log_probs is not None else None
    v_current = torch.zeros(len(x_t))
    v_next = torch.zeros(len(x_t))
    info: dict = {}
    if len(idx):
        values, info = reward_fn(torch.cat([scored_current, scored_next]))  # one oracle call per batch
        values = torch.as_tensor(np.asarray(values), dtype=torch.float32)
        v_current[idx], v_next[idx] = values[: len(idx)], values[len(idx):]
    batch = VIDDBatch(
        x_t=x_t, x_next=x_next, t=t, s=s, v_current=v_current, v_next=v_next, changed=changed,
        teacher_log_probs=teacher_log_probs if keep_teacher_log_probs else None,
    )
    return batch, info


def distinct_rows(*tensors: Tensor) -> int:
    """Number of distinct rows over ``tensors``: the oracle queries a :class:`RewardCounter` call would cost."""
    rows = torch.cat(tensors)
    return 0 if rows.shape[0] == 0 else torch.unique(rows, dim=0).shape[0]


def largest_prefix_within(current: Tensor, following: Tensor, budget: int) -> int:
    """Largest ``n`` such that the first ``n`` transitions' value queries (distinct rows) fit in ``budget``."""
    low, high = 0, current.shape[0]  # the cost of a prefix never decreases with its length: bisect
    while low < high:
        mid = (low + high + 1) // 2
        if distinct_rows(current[:mid], following[:mid]) <= budget:
            low = mid
        else:
            high = mid - 1
    return low


def vidd_loss(student: nn.Module, batch: VIDDBatch, cfg: VIDDConfig) -> tuple[Tensor, dict]:
    """Value-weighted NLL of eq. 7: ``-mean_i w_i log p_theta(xbar_{t-1}^i | x_t^i)``.

    The log-likelihood sums over positions unmasked in the step (the only theta-dependent part of the
    reverse kernel); the mean runs over all (trajectory, step) pairs, as in the released code.
    """
    weights = soft_optimal_weights(batch.v_next, batch.v_current, cfg.alpha, cfg.max_log_weight)
    weights = torch.where(batch.changed, weights, torch.zeros_like(weights))
    if cfg.self_normalize_weights:
        weights = per_step_normalized(weights, batch.t, batch.changed)
    log_p_x0 = x0_log_probs(student, batch.x_t)
    log_p = newly_unmasked_log_prob(log_p_x0, batch.x_t, batch.x_next, student.mask_id)
    if cfg.exact_teacher_term:
        if batch.teacher_log_probs is None:
            raise ValueError("exact_teacher_term needs a batch collected with keep_teacher_log_probs=True")
        q = LogLinearSchedule().unmask_probability(batch.t, batch.s)
        masked = batch.x_t == student.mask_id
        cross_entropy = -(batch.teacher_log_probs.exp() * log_p_x0).sum(-1)
        expected_nll = q * (cross_entropy * masked).sum(-1)
        loss = (expected_nll - (weights - 1.0) * torch.where(batch.changed, log_p, 0.0)).mean()
    else:
        loss = -(weights * log_p).mean()
    w = weights[batch.changed]
    metrics = {
        "loss": loss.item(),
        "weight_mean": w.mean().item() if len(w) else float("nan"),
        "weight_max": w.max().item() if len(w) else float("nan"),
        # Kish effective sample size: how many roll-outs really drive the update
        "weight_ess_fraction": (w.sum() ** 2 / (w.pow(2).sum() * len(w))).item() if len(w) else float("nan"),
        "value_gain_mean": (batch.v_next - batch.v_current)[batch.changed].mean().item() if len(w) else 0.0,
        "log_prob_mean": log_p[batch.changed].mean().item() if len(w) else float("nan"),
    }
    return loss, metrics


def per_step_normalized(weights: Tensor, t: Tensor, changed: Tensor) -> Tensor:
    """``weights`` divided by their mean over the changed transitions of the same reverse step ``t``."""
    out = weights.clone()
    for step in t[changed].unique():
        group = changed & (t == step)
        out[group] = weights[group] / weights[group].mean()
    return out


@torch.no_grad()
def refresh_teacher(rollout_model: nn.Module, student: nn.Module) -> None:
    """Lazy update ``p_out <- p_theta`` (hard copy; Alg. 1, every K iterations)."""
    rollout_model.load_state_dict(student.state_dict())


@torch.no_grad()
def best_of_n(
    model: nn.Module,
    reward_fn: RewardFn,
    n_outputs: int,
    n_candidates: int,
    length: int,
    T: int,
    generator: torch.Generator | None = None,
    sample_fn: SampleFn = sample,
) -> tuple[Tensor, Tensor]:
    """For each of ``n_outputs`` outputs keep the best of ``n_candidates`` samples; ``(tokens, rewards)``."""
    if n_outputs < 1 or n_candidates < 1:
        raise ValueError(f"best_of_n needs n_outputs, n_candidates >= 1, got {n_outputs}, {n_candidates}")
    tokens = sample_fn(model, n_outputs * n_candidates, length, T, generator, record_trajectory=False).tokens
    rewards, _ = reward_fn(tokens)
    rewards = rewards.reshape(n_outputs, n_candidates)
    best = rewards.argmax(dim=1)
    tokens = tokens.reshape(n_outputs, n_candidates, -1)[torch.arange(n_outputs), best]
    return tokens, rewards[torch.arange(n_outputs), best]


# --------------------------------------------------------------------------------------------------
# Single-process reference driver
# --------------------------------------------------------------------------------------------------


@dataclass
class FinetuneResult:
    """``model``: the fine-tuned policy (the pretrained one for best-of-N). ``samples``/``sample_rewards``:
    the selected outputs of best-of-N (``None`` otherwise). ``reward_queries``: distinct oracle calls."""

    method: str
    model: nn.Module
    reward_queries: int
    iterations: int
    history: list[dict] = field(default_factory=list)
    reward_info: dict = field(default_factory=dict)
    samples: Tensor | None = None
    sample_rewards: Tensor | None = None


def _frozen_copy(model: nn.Module) -> nn.Module:
    clone = copy.deepcopy(model).eval()
    for p in clone.parameters():
        p.requires_grad_(False)
    return clone


def finetune(
    method: Method,
    pretrained: nn.Module,
    reward_fn: RewardFn,
    cfg: VIDDConfig,
    sample_fn: SampleFn | None = None,
    log_fn: Callable[[int, dict], None] | None = None,
    eval_fn: Callable[[nn.Module], dict] | None = None,
) -> FinetuneResult:
    """Run ``method`` in one process; ``sample_fn`` (signature of :func:`algos.vidd.mdlm.sample`) may be remote.

    ``reward_fn`` is queried only through a :class:`RewardCounter`, so ``reward_queries`` is exact and
    never exceeds ``cfg.max_reward_queries``. ``pretrained`` is never modified.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    sample_fn = sample_fn or sample
    generator = torch.Generator().manual_seed(cfg.seed)
    counter = RewardCounter(reward_fn, cfg.max_reward_queries)
    length = pretrained.seq_len
    pre = _frozen_copy(pretrained)

    if method == "best_of_n":
        if cfg.max_reward_queries is None:
            raise ValueError("best_of_n needs VIDDConfig.max_reward_queries (its N is budget // outputs)")
        n_candidates = cfg.max_reward_queries // cfg.best_of_n_outputs
        if n_candidates < 1:
            raise ValueError("VIDDConfig.max_reward_queries is smaller than best_of_n_outputs")
        tokens, rewards = best_of_n(
            pre, counter, cfg.best_of_n_outputs, n_candidates, length, cfg.num_sampling_steps, generator, sample_fn
        )
        return FinetuneResult(method, pre, counter.n_queries, 0, reward_info=dict(counter.info),
                              samples=tokens, sample_rewards=rewards)

    if method == "standard_ft":  # roll-in from p_pre and teacher p_pre forever
        cfg = dataclasses.replace(cfg, beta=0.0, refresh_interval=None)
    student = copy.deepcopy(pretrained).train()
    for p in student.parameters():
        p.requires_grad_(True)
    rollout_model = _frozen_copy(pretrained)
    optimizer = torch.optim.Adam(student.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
    history: list[dict] = []
    iteration = 0
    for iteration in range(1, cfg.num_iterations + 1):
        if method == "ddpo":
            if counter.remaining < 1:
                iteration -= 1
                break
            metrics = ddpo.ddpo_iteration(student, optimizer, counter, cfg, generator, sample_fn)
        else:
            if counter.remaining < 2:
                iteration -= 1
                break
            metrics = _vidd_iteration(student, pre, rollout_model, optimizer, counter, cfg, generator, sample_fn)
            if cfg.refresh_interval is not None and iteration % cfg.refresh_interval == 0:
                refresh_teacher(rollout_model, student)
                metrics["teacher_refreshed"] = 1.0
        metrics["reward_queries"] = counter.n_queries
        if eval_fn is not None and cfg.eval_every and iteration % cfg.eval_every == 0:
            metrics.update({f"eval/{k}": v for k, v in eval_fn(student).items()})
        history.append({"iteration": iteration} | metrics)
        if log_fn is not None:
            log_fn(iteration, metrics)
    student.eval()
    if eval_fn is not None:
        history.append({"iteration": iteration, "final": 1.0} | {f"eval/{k}": v for k, v in eval_fn(student).items()})
    return FinetuneResult(method, student, counter.n_queries, iteration, history, dict(counter.info))


def _vidd_iteration(
    student: nn.Module,
    pretrained: nn.Module,
    rollout_model: nn.Module,
    optimizer: torch.optim.Optimizer,
    reward_fn: RewardCounter,
    cfg: VIDDConfig,
    generator: torch.Generator,
    sample_fn: SampleFn,
) -> dict:
    """Roll-in, roll-out with values, one distillation step (Alg. 1 lines 4-9)."""
    states, used_rollout = rollin(pretrained, rollout_model, cfg.batch_size, student.seq_len, cfg, generator, sample_fn)
    steps = select_steps(cfg.batch_size, cfg.num_sampling_steps, cfg.timesteps_per_trajectory, generator)
    value_model = rollout_model if cfg.value_model == "rollout" else _frozen_copy(student)
    batch, _ = collect_vidd_batch(
        rollout_model, value_model, states, steps, reward_fn, generator, max_queries=reward_fn.remaining,
        value_estimator=cfg.value_estimator, greedy_tokens_per_step=cfg.greedy_tokens_per_step,
        # without refreshes p_out is p_pre, so pretrained roll-ins are p_out roll-ins too
        next_value=cfg.next_value, states_from_rollout_model=used_rollout or cfg.refresh_interval is None,
        keep_teacher_log_probs=cfg.exact_teacher_term,
    )
    student.train()
    for _ in range(cfg.updates_per_batch):
        loss, metrics = vidd_loss(student, batch, cfg)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        metrics["grad_norm"] = float(nn.utils.clip_grad_norm_(student.parameters(), cfg.grad_clip))
        optimizer.step()
    metrics["rollin_from_rollout_model"] = float(used_rollout)
    metrics["value_next_mean"] = batch.v_next[batch.changed].mean().item() if batch.changed.any() else float("nan")
    return metrics
