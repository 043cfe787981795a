"""Closeness of a fine-tuned masked diffusion model to its pretrained start: the KL along the model's own denoising
trajectories, and the bound that stands in for it where there is no trajectory (best-of-N).

For two reverse processes with the same schedule, the chain rule of KL gives

    KL(p_theta(x_{0:T}) || p_pre(x_{0:T})) = E_{x_{0:T} ~ p_theta} sum_t KL(p_theta(. | x_t) || p_pre(. | x_t)).

A masked position of ``x_t`` stays masked with the same probability ``1 - q_t`` under both models and otherwise
unmasks to ``k`` with probability ``q_t p(x0 = k | x_t)``, so the per-step KL is ``q_t`` times the sum over masked
positions of the categorical KL between the two models' ``p(x0^l | x_t)``. Two estimators of the trajectory KL, both
unbiased given trajectories drawn from ``p_theta``:

- ``"unmasked"``: the categorical KLs summed over the positions that the trajectory itself unmasked at that step (the
  unmasking draw is independent of the token draw, so this averages to the ``q_t``-weighted sum);
- ``"rao_blackwell"``: the ``q_t``-weighted sum over every masked position (the same expectation; not always the
  lower variance: the ``"unmasked"`` estimator counts each position exactly once along a trajectory).

The trajectory KL bounds the KL between the two models' final samples (data processing), so it is the closeness a
reward-vs-KL frontier should use; the pretrained model's likelihood of the samples (the NELBO the official code logs)
measures how typical the samples are under p_pre, which a sharpened model raises without moving far.
"""
from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from algos.vidd.mdlm import LogLinearSchedule, x0_log_probs
from algos.vidd.sampling import model_device, step_times

ESTIMATORS = ("unmasked", "rao_blackwell")


def categorical_kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    """``KL(p || q)`` over the last axis from log-probabilities (0 where ``p`` is 0)."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


@torch.no_grad()
def trajectory_kl(model: nn.Module, reference: nn.Module, states: Tensor, schedule: LogLinearSchedule | None = None,
                  batch_size: int = 512) -> dict[str, Tensor]:
    """Per-trajectory estimates of ``KL(model || reference)`` over the denoising chain, ``[B]`` nats each, by both
    :data:`ESTIMATORS` (one pass of each model per step serves both).

    ``states``: ``[T + 1, B, L]`` trajectories drawn from ``model`` (:func:`algos.vidd.sampling.sample` with
    ``record_trajectory=True``: ``states[0]`` all-mask, ``states[T]`` clean)."""
    schedule = schedule or LogLinearSchedule()
    T, n = states.shape[0] - 1, states.shape[1]
    mask_id = model.mask_id
    device = model_device(model)
    out = {name: torch.zeros(n, dtype=torch.float64) for name in ESTIMATORS}
    for step in range(T):
        t, s = step_times(T, step)
        q = float(schedule.unmask_probability(t, s))
        for start in range(0, n, batch_size):
            x_t = states[step, start:start + batch_size].to(device)
            x_s = states[step + 1, start:start + batch_size].to(device)
            masked = x_t == mask_id
            if not masked.any():
                continue
            kl = categorical_kl(x0_log_probs(model, x_t), x0_log_probs(reference, x_t)).double()  # [b, L]
            rows = slice(start, start + x_t.shape[0])
            out["unmasked"][rows] += (kl * (masked & (x_s != mask_id))).sum(-1).cpu()
            out["rao_blackwell"][rows] += (kl * masked * q).sum(-1).cpu()
    return out


@torch.no_grad()
def trajectory_kl_summary(model: nn.Module, reference: nn.Module, states: Tensor,
                          schedule: LogLinearSchedule | None = None) -> dict[str, float]:
    """Over the trajectories ``states`` (see :func:`trajectory_kl`): the mean of the ``"unmasked"`` estimates
    (``kl``), its standard error (``kl_se``) and the mean of the ``"rao_blackwell"`` ones (``kl_rb``), nats."""
    kl = trajectory_kl(model, reference, states, schedule)
    per_sample = kl["unmasked"]
    return {"kl": float(per_sample.mean()), "kl_se": float(per_sample.std() / math.sqrt(per_sample.numel())),
            "kl_rb": float(kl["rao_blackwell"].mean())}


def best_of_n_kl_bound(n: int) -> float:
    """``log N - (N - 1) / N``: the KL of best-of-N from its base model (Beirami et al. 2024's bound, exact for a
    continuous reward without ties); 0 at N = 1."""
    if n < 1:
        raise ValueError(f"best-of-N needs N >= 1, got {n}")
    return math.log(n) - (n - 1) / n


# --------------------------------------------------------------------------------------------------
# Exact value on tiny spaces (tests): full transition matrices, no per-position shortcut
# --------------------------------------------------------------------------------------------------


def _transition_matrix(model: nn.Module, states: Tensor, q: float) -> Tensor:
    """``P[i, j] = p(x_s = states[j] | x_t = states[i])`` over every partially masked state, float64."""
    V, mask_id = model.vocab_size, model.mask_id
    n_states, length = states.shape
    p_x0 = F.softmax(model(states).double(), dim=-1)  # [S, L, V]
    masked = states == mask_id
    kernel = torch.zeros(n_states, length, V + 1, dtype=torch.float64)
    kernel[..., :V] = torch.where(masked[..., None], q * p_x0, torch.zeros_like(p_x0))
    kernel[..., V] = torch.where(masked, 1.0 - q, 0.0)
    kernel.scatter_add_(-1, states.unsqueeze(-1), (~masked).double().unsqueeze(-1))
    matrix = kernel[:, 0]
    for pos in range(1, length):
        matrix = (matrix.unsqueeze(-1) * kernel[:, pos].unsqueeze(1)).reshape(n_states, -1)
    return matrix


@torch.no_grad()
def exact_trajectory_kl(model: nn.Module, reference: nn.Module, length: int, T: int,
                        schedule: LogLinearSchedule | None = None) -> float:
    """``KL(model || reference)`` over the whole ``T``-step chain by enumeration of every state (at most 4096)."""
    schedule = schedule or LogLinearSchedule()
    V = model.vocab_size
    n_states = (V + 1) ** length
    if n_states > 4096:
        raise ValueError(f"exact enumeration needs (V+1)**length <= 4096, got {n_states}")
    states = torch.tensor(list(itertools.product(range(V + 1), repeat=length)), dtype=torch.long)
    law = torch.zeros(n_states, dtype=torch.float64)
    law[-1] = 1.0  # the all-mask state: the mask token V is the last digit value
    was = model.training, reference.training
    model.eval()
    reference.eval()
    total = 0.0
    for step in range(T):
        t, s = step_times(T, step)
        q = float(schedule.unmask_probability(t, s))
        p, r = _transition_matrix(model, states, q), _transition_matrix(reference, states, q)
        support = p > 0
        ratio = torch.where(support, p.clamp_min(1e-300).log() - r.clamp_min(1e-300).log(), 0.0)
        total += float((law * (p * ratio).sum(-1)).sum())
        law = law @ p
    model.train(was[0])
    reference.train(was[1])
    return total
