"""The policy update shared by AttnRL and its baselines: PPO-clip on sequences with per-token advantages.

* :class:`TrainSequence`: one sampled response to train on (a GRPO sample or a root-to-leaf tree path).
* :func:`ppo_clip_loss`: PPO-clip with Clip-Higher (eps_low 0.2, eps_high 0.28, as in DAPO and the AttnRL recipe),
  token-mean aggregation over every response token of the mini-batch, plus a k3 ("low_var_kl") penalty to the
  frozen reference policy.
* :func:`ppo_update`: PPO-clip epochs over mini-batches of training sequences.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import torch

from algos.attnrl.config import RLConfig
from algos.attnrl.lm import Policy, forward_scores


@dataclass
class TrainSequence:
    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    advantages: list[float]  # per response token
    reward: float


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


def ppo_update(policy: Policy, ref: Policy, optimizer: torch.optim.Optimizer, sequences: Sequence[TrainSequence],
               cfg: RLConfig, rng: random.Random) -> dict[str, float]:
    """PPO-clip epochs over mini-batches of training sequences (token-mean per mini-batch, KL to ``ref``)."""
    if not sequences:
        return {}
    prompts = [s.prompt_ids for s in sequences]
    responses = [s.response_ids for s in sequences]
    with torch.no_grad():
        ref_lp = forward_scores(ref, prompts, responses, cfg.temperature).logprobs
    width = ref_lp.shape[1]

    def padded(rows: Sequence[Sequence[float]]) -> torch.Tensor:
        out = torch.zeros(len(rows), width)
        for i, r in enumerate(rows):
            out[i, :len(r)] = torch.tensor(r, dtype=torch.float32)
        return out

    old_lp = padded([s.old_logprobs for s in sequences]).to(ref_lp.device)
    adv = padded([s.advantages for s in sequences]).to(ref_lp.device)
    policy.model.train()
    sums: dict[str, float] = {}
    n_steps = 0
    for _ in range(cfg.ppo_epochs):
        order = list(range(len(sequences)))
        rng.shuffle(order)
        for i in range(0, len(order), cfg.ppo_minibatch):
            idx = order[i:i + cfg.ppo_minibatch]
            scores = forward_scores(policy, [prompts[j] for j in idx], [responses[j] for j in idx], cfg.temperature)
            w = scores.logprobs.shape[1]
            loss, m = ppo_clip_loss(scores.logprobs, old_lp[idx, :w], adv[idx, :w], scores.mask, ref_lp[idx, :w],
                                    cfg.clip_low, cfg.clip_high, cfg.kl_coef)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            m["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(policy.model.parameters(), cfg.grad_clip))
            optimizer.step()
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v
            n_steps += 1
    policy.model.eval()
    return {k: v / n_steps for k, v in sums.items()} | {"optimizer_steps": n_steps}
