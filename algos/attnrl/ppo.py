"""Policy-gradient pieces shared by AttnRL and its baselines.

* :func:`ppo_clip_loss`: PPO-clip with Clip-Higher (eps_low 0.2, eps_high 0.28, as in DAPO and the AttnRL recipe),
  token-mean aggregation over every response token of the mini-batch, plus a k3 ("low_var_kl") penalty to the
  frozen reference policy.
* :func:`grpo_advantages`: GRPO's group-normalized outcome advantage.
* :func:`select_entropy_branch_points`: TreeRL-style branching at the highest-entropy response tokens (the
  baseline that AttnRL's attention-based branching replaces).
"""

from __future__ import annotations

from typing import Sequence

import torch


def low_var_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): exp(r) - r - 1 with r = log pi_ref - log pi, clamped to
    [-10, 10] against the rare huge ratio; non-negative and unbiased for samples from pi."""
    r = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return (r.exp() - r - 1.0).clamp(-10.0, 10.0)


def ppo_clip_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, ref_logprobs: torch.Tensor | None = None, clip_low: float = 0.2,
                  clip_high: float = 0.28, kl_coef: float = 1e-3) -> tuple[torch.Tensor, dict[str, float]]:
    """AttnRL Eq. 1: -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A), mean over masked tokens, + kl_coef KL.

    All tensors are (B, T); ``advantages`` are per token (a tree path carries each node's advantage on that
    node's tokens). Returns the loss and detached metrics.
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got clip_low={clip_low}, clip_high={clip_high}")
    mask = mask.to(logprobs.dtype)
    n_tokens = mask.sum().clamp(min=1.0)
    ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0).exp()
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    pg = -torch.minimum(unclipped, clipped)
    pg_loss = (pg * mask).sum() / n_tokens
    loss = pg_loss
    metrics = {
        "pg_loss": float(pg_loss.detach()),
        "clip_fraction": float((((clipped != unclipped) & (mask > 0)).float().sum() / n_tokens).detach()),
        "approx_kl_old": float((((old_logprobs - logprobs) * mask).sum() / n_tokens).detach()),
    }
    if ref_logprobs is not None and kl_coef > 0:
        kl = (low_var_kl(logprobs, ref_logprobs) * mask).sum() / n_tokens
        loss = loss + kl_coef * kl
        metrics["kl_ref"] = float(kl.detach())
    metrics["loss"] = float(loss.detach())
    return loss, metrics


def grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(r - mean_group) / (std_group + eps) for rewards (num_prompts, n); std is the unbiased one (as verl)."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be (num_prompts, n >= 2), got shape {tuple(rewards.shape)}")
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + eps)


def select_entropy_branch_points(entropies: Sequence[float], num_points: int, min_token_distance: int = 1,
                                 forbid_last: bool = True) -> list[int]:
    """Response offsets of the ``num_points`` highest-entropy tokens, at least ``min_token_distance`` from the
    response start and from each other; the continuation resamples from that token on. Offset 0 (a fresh sample)
    and, with ``forbid_last``, the final (end) token are never chosen. Returned sorted."""
    if num_points < 0 or min_token_distance < 1:
        raise ValueError("num_points must be >= 0 and min_token_distance >= 1")
    last = len(entropies) - 1 if forbid_last else len(entropies)
    order = sorted(range(1, last), key=lambda i: (-entropies[i], i))
    chosen: list[int] = []
    for i in order:
        if len(chosen) == num_points:
            break
        if i >= min_token_distance and all(abs(i - c) >= min_token_distance for c in chosen):
            chosen.append(i)
    return sorted(chosen)
