"""DDPO-style policy gradient over the denoising chain (Black et al., 2024), the VIDD paper's baseline.

The denoising chain ``x_T -> ... -> x_0`` is an MDP whose terminal reward is ``r(x_0)``. Each
iteration samples trajectories from the current policy (the "old" policy ``theta_old``; lazy interval
K = 1), normalizes the terminal rewards into advantages ``A`` and takes ``inner_steps`` gradient steps on
the PPO-clip surrogate

    L(theta) = -E_{b, t} [ min(rho A, clip(rho, 1 - eps, 1 + eps) A) ],
    rho = p_theta(x_{t-1} | x_t) / p_theta_old(x_{t-1} | x_t),

where the ratio only involves the newly unmasked tokens (the schedule's unmasking probabilities cancel).
Theorem 1 of the VIDD paper: this optimises the reverse KL to the soft-optimal trajectory distribution.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from algos.vidd.config import VIDDConfig
from algos.vidd.mdlm import x0_log_probs
from algos.vidd.sampling import newly_unmasked_log_prob


def normalized_advantages(rewards: Tensor, eps: float = 1e-8) -> Tensor:
    """Batch-standardised terminal rewards (DDPO's per-batch advantage normalization); NaN rewards (a non-finite
    oracle answer) get advantage 0, i.e. their trajectory is skipped."""
    finite = torch.isfinite(rewards)
    out = torch.zeros_like(rewards)
    if finite.sum() < 2:
        return out
    r = rewards[finite]
    out[finite] = (r - r.mean()) / (r.std() + eps)
    return out


def transition_log_probs(policy: nn.Module, states: Tensor, steps: Tensor) -> Tensor:
    """``log p_theta(x_{t-1} | x_t)`` (theta-dependent part) for trajectory ``b`` at reverse step ``steps[b, j]``.

    ``states``: ``[T + 1, B, L]``; ``steps``: ``[B, k]``; returns ``[B, k]``.
    """
    B, k = steps.shape
    steps = steps.to(states.device)
    batch_index = torch.arange(B, device=states.device).unsqueeze(1).expand_as(steps).reshape(-1)
    flat = steps.reshape(-1)
    x_t, x_next = states[flat, batch_index], states[flat + 1, batch_index]
    log_p = newly_unmasked_log_prob(x0_log_probs(policy, x_t), x_t, x_next, policy.mask_id)
    return log_p.reshape(B, k)


def ppo_clip_loss(log_p: Tensor, old_log_p: Tensor, advantages: Tensor, clip: float) -> tuple[Tensor, dict]:
    """PPO-clip surrogate over ``[B, k]`` transitions with per-trajectory advantages ``[B]``."""
    ratio = (log_p - old_log_p).exp()
    adv = advantages.unsqueeze(1)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip, 1.0 + clip) * adv)
    loss = -surrogate.mean()
    clipped = ((ratio - 1.0).abs() > clip).float().mean()
    return loss, {"loss": loss.item(), "clip_fraction": clipped.item(), "ratio_mean": ratio.mean().item()}


def ddpo_update(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    states: Tensor,
    advantages: Tensor,
    cfg: VIDDConfig,
    generator: torch.Generator,
) -> dict:
    """``ddpo_inner_steps`` clipped gradient steps on the PPO-clip surrogate of trajectories ``states`` ``[T+1, B, L]``
    sampled from ``policy`` itself (theta_old = the policy before this update); each step draws
    ``steps_per_trajectory`` random reverse steps per trajectory. Returns the metrics of the last step."""
    n, T, k = states.shape[1], cfg.num_sampling_steps, cfg.steps_per_trajectory
    device = next(policy.parameters()).device
    states, advantages = states.to(device), advantages.to(device)
    policy.train()
    # one inner step: theta_old is theta itself, the ratio is 1 with gradient grad log p, and the separate forward
    # pass for theta_old's log-probabilities is skipped (the released code's theta_old is the previous iteration's
    # model, so its 1e-4 clip gates the gradient: algos/vidd/README.md)
    old_log_p = None
    if cfg.ddpo_inner_steps > 1:
        with torch.no_grad():
            old_log_p = transition_log_probs(policy, states, torch.arange(T).expand(n, T))
    metrics: dict = {}
    for _ in range(cfg.ddpo_inner_steps):
        steps = torch.rand(n, T, generator=generator).argsort(dim=1)[:, :k].to(device)
        log_p = transition_log_probs(policy, states, steps)
        old = log_p.detach() if old_log_p is None else old_log_p.gather(1, steps)
        loss, metrics = ppo_clip_loss(log_p, old, advantages, cfg.ddpo_clip)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        metrics["grad_norm"] = float(nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip))
        optimizer.step()
    return metrics
