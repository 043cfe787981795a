"""DDPO-style policy gradient over the denoising chain (Black et al., 2024), the VIDD paper's baseline.

The denoising chain ``x_T -> ... -> x_0`` is an MDP whose terminal reward is ``r(x_0)``. Each
iteration samples trajectories from the current policy (the "old" policy ``theta_old``; lazy interval
K = 1), normalizes the terminal rewards into advantages ``A`` and takes ``inner_steps`` gradient steps on
the PPO-clip surrogate

    L(theta) = -E_{b, t} [ min(rho A, clip(rho, 1 - eps, 1 + eps) A) ],
    rho = p_theta(x_{t-1} | x_t) / p_theta_old(x_{t-1} | x_t),

where the ratio only involves the newly unmasked tokens (the schedule's unmasking probabilities cancel).
Theorem 1 of the VIDD paper: this optimises the reverse KL to the soft-optimal trajectory distribution.

Two variants (``VIDDConfig.ddpo_variant``):

- ``orrery``: the above with theta_old = theta at one inner step (ratio 1: a policy gradient with normalised
  advantages, the clip inert).
- ``official``: as the released DNA script runs it. theta_old is the policy from the start of the *previous*
  iteration (``finetune_reward.py:150,358-361``, ``--target_update_interval 1``), so the 1e-4 clip switches the
  gradient off for trajectories whose probability already moved with their advantage; and the ratio is of the
  position-mean of ``log p(x_0 | x_t)`` over the positions masked in ``x_t`` (``losses/rl_loss.py:238-271``).
"""

from __future__ import annotations

import copy

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


def x0_mean_log_probs(policy: nn.Module, states: Tensor, steps: Tensor) -> Tensor:
    """The released code's DDPO log-probability: at reverse step ``steps[b, j]``, the mean over all L positions of
    ``log p_theta(x_0 | x_t)`` at the final sample's tokens, counted where ``x_t`` is masked (zero elsewhere).

    ``states``: ``[T + 1, B, L]`` (``states[-1]`` = x_0); ``steps``: ``[B, k]``; returns ``[B, k]``.
    """
    B, k = steps.shape
    steps = steps.to(states.device)
    batch_index = torch.arange(B, device=states.device).unsqueeze(1).expand_as(steps).reshape(-1)
    x_t, x0 = states[steps.reshape(-1), batch_index], states[-1][batch_index]
    log_p = x0_log_probs(policy, x_t).gather(-1, x0.unsqueeze(-1)).squeeze(-1)
    valid = (x_t == policy.mask_id) & (x0 != policy.mask_id)
    return (log_p * valid).mean(-1).reshape(B, k)


def previous_iterate(holder: nn.Module, policy: nn.Module) -> nn.Module:
    """The released DDPO's theta_old: the policy from the start of the previous iteration. ``holder`` (a frozen
    copy of the starting policy, checkpointed with the run) keeps it between calls; call once at the start of each
    iteration: returns a frozen copy of what it held (theta_0 in the first two iterations, as the released code's
    ``epoch_num != 0`` skips the first swap) and stores the current policy in its place."""
    old = copy.deepcopy(holder)
    holder.load_state_dict(policy.state_dict())
    return old


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
    old_policy: nn.Module | None = None,
) -> dict:
    """``ddpo_inner_steps`` clipped gradient steps on the PPO-clip surrogate of trajectories ``states`` ``[T+1, B, L]``
    sampled from ``policy`` itself; each step draws ``steps_per_trajectory`` random reverse steps per trajectory.
    ``ddpo_variant="orrery"``: theta_old = the policy before this update, transition log-probs; ``"official"``:
    theta_old = ``old_policy`` (:func:`previous_iterate`), x_0 log-probs (:func:`x0_mean_log_probs`). Returns the
    metrics of the last step."""
    n, T, k = states.shape[1], cfg.num_sampling_steps, cfg.steps_per_trajectory
    device = next(policy.parameters()).device
    states, advantages = states.to(device), advantages.to(device)
    policy.train()
    official = cfg.ddpo_variant == "official"
    if official and old_policy is None:
        raise ValueError("ddpo_variant='official' needs old_policy, the previous iteration's policy "
                         "(algos.vidd.ddpo.previous_iterate)")
    # orrery at one inner step: theta_old is theta itself, the ratio is 1 with gradient grad log p, and the separate
    # forward pass for theta_old's log-probabilities is skipped (the released code's theta_old is the previous
    # iteration's model, so its 1e-4 clip gates the gradient: algos/vidd/README.md); the official variant takes one
    # inner step (VIDDConfig refuses more)
    old_log_p = None
    if not official and cfg.ddpo_inner_steps > 1:
        with torch.no_grad():
            old_log_p = transition_log_probs(policy, states, torch.arange(T).expand(n, T))
    metrics: dict = {}
    for _ in range(cfg.ddpo_inner_steps):
        steps = torch.rand(n, T, generator=generator).argsort(dim=1)[:, :k].to(device)
        if official:
            with torch.no_grad():
                old = x0_mean_log_probs(old_policy.to(device), states, steps)
            log_p = x0_mean_log_probs(policy, states, steps)
        else:
            log_p = transition_log_probs(policy, states, steps)
            old = log_p.detach() if old_log_p is None else old_log_p.gather(1, steps)
        loss, metrics = ppo_clip_loss(log_p, old, advantages, cfg.ddpo_clip)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        metrics["grad_norm"] = float(nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip))
        optimizer.step()
    return metrics
