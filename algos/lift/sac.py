"""Soft Actor-Critic with LIFT's large-batch, high-UTD recipe (LIFT stage i; Haarnoja et al. 2018, arXiv:1812.05905).

One training iteration of LIFT (Brax SAC, modified):
    1. one vectorised env step of all ``num_envs`` envs with the stochastic policy; update the observation
       normalizer(s) with the new data; insert the transitions into the FIFO replay buffer    (caller)
    2. draw ``G * B`` transitions uniformly at once, normalize them, and run G SGD steps on
       consecutive slices of B, each: alpha -> critic -> actor -> Polyak                      (``update``)

Within one SGD step every loss reads the parameters from the start of the step, except that the critic
and actor losses use the *updated* temperature (the order of LIFT's pretraining ``sgd_step``,
``policy_pretrain/train.py:329-339``; its finetuning uses the one from before the step, ~0.03 % apart):
    alpha:  J(log a)  = E[ a * sg(-log pi(a~|s) - H_target) ],  H_target = -coef * |A|          (SAC eq. 18)
    critic: y = s_r r + gamma (1 - term) [min_i Qbar_i(s', a') - a log pi(a'|s')],  a' ~ pi(.|s')
            J(Q) = 1/2 mean_{b,i} [ m_b (Q_i(s_b, a_b) - y_b) ]^2,  m_b = 1 - trunc_b (1 - term_b)
    actor:  J(pi) = E[ a log pi(a~|s) - min_i Q_i(s, a~) ],  a~ = tanh(mu + sigma eps)           (SAC eq. 7/12)
    target: Qbar <- (1 - tau) Qbar + tau Q

Actions live in [-1, 1]^|A| (tanh squashing); wrap environments with ``gymnasium.wrappers.RescaleAction``
(or rescale in the env runner) so replay stores the policy's own action.

DDP: ``SACAgent.wrap(DistributedDataParallel)`` wraps ``actor``, ``critic`` and ``log_alpha``. In each SGD step
every wrapped module runs exactly one grad-enabled forward: ``actor(obs)`` (its sample serves both the alpha
and the actor loss), ``critic(obs, action)`` and ``log_alpha()``. Everything else goes through the unwrapped
modules: the next-state policy sample under ``no_grad``, and the actor loss's ``Q(s, a~)`` through the unwrapped
critic with *detached* parameters (``detach_params=True``), so it sends gradient only into ``a~`` (hence the
actor) and never touches the critic's DDP reducer. Critic and actor share one ``backward()``; the alpha
loss has its own (its graph is disjoint). ``find_unused_parameters`` is not needed.

Here: the four losses and ``update``; the hyperparameters: ``algos.lift.sac_config``. The networks and the agent
that holds them: ``algos.lift.agent``; the policy an env worker runs: ``algos.lift.policy``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import nullcontext

import torch

from algos.lift.agent import SACAgent
from algos.lift.sac_config import PRESETS, Batch, SACConfig  # noqa: F401  (SACConfig's home before the split)
from algos.nets import unwrap
from algos.precision import use_bf16

# --------------------------------------------------------------------------------------------------- losses


def alpha_loss(log_alpha: torch.Tensor, log_prob: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """Temperature loss (SAC eq. 18, Brax/LIFT form): ``mean(alpha * sg(-log pi - H_target))``.

    Its gradient ``alpha * (H(pi) - H_target)`` raises alpha while the policy entropy is below target.
    """
    return (log_alpha.exp() * (-log_prob.detach() - target_entropy)).mean()


def soft_q_target(
    reward: torch.Tensor,
    terminated: torch.Tensor,
    next_q: torch.Tensor,
    next_log_prob: torch.Tensor,
    alpha: torch.Tensor | float,
    gamma: float,
    reward_scale: float = 1.0,
) -> torch.Tensor:
    """Soft TD target ``y = s_r r + gamma (1 - term) [min_i Qbar_i(s', a') - alpha log pi(a'|s')]`` (no gradient).

    ``next_q`` is ``(B, n_critics)`` from the target critic at ``a' ~ pi(.|s')``. Only true terminations stop the
    bootstrap; time-limit truncations are handled by the loss mask in ``critic_loss``.
    """
    next_v = next_q.min(dim=-1).values - alpha * next_log_prob
    return (reward_scale * reward + gamma * (1.0 - terminated) * next_v).detach()


def critic_loss(q: torch.Tensor, target: torch.Tensor, truncated: torch.Tensor, terminated: torch.Tensor) -> torch.Tensor:
    """LIFT/Brax critic loss ``1/2 mean_{b,i} [m_b (Q_i(s_b, a_b) - y_b)]^2`` with ``m_b = 1 - trunc_b (1 - term_b)``.

    What happens at a truncation (time limit reached, ``truncated = 1``, ``terminated = 0``): the transition's
    TD error is multiplied by 0, so it gives the critic no gradient at all: neither a bootstrapped target
    nor a zero-value target. Its ``next_obs`` is never trusted (in Brax it is the auto-reset observation),
    and Q(s, a) of the state before the limit is learned only from other transitions, i.e. the value keeps
    bootstrapping through time-limit ends. Masked rows still count in the mean's denominator (as in LIFT).
    A transition that both terminates and hits the limit is a termination (Brax sets ``truncation = 0``
    when the env is done): it is trained with target ``s_r r``.
    At a termination (``terminated = 1``) the loss is kept and the target is ``s_r r`` (no bootstrap).
    """
    mask = 1.0 - truncated * (1.0 - terminated)
    td_error = (q - target.unsqueeze(-1)) * mask.unsqueeze(-1)
    return 0.5 * td_error.square().mean()


def actor_loss(log_prob: torch.Tensor, q_new_action: torch.Tensor, alpha: torch.Tensor | float) -> torch.Tensor:
    """Policy loss ``mean(alpha log pi(a~|s) - min_i Q_i(s, a~))`` with reparameterised ``a~`` (SAC eq. 12)."""
    return (alpha * log_prob - q_new_action.min(dim=-1).values).mean()


# --------------------------------------------------------------------------------------------------- update


def _autocast(device: torch.device, enabled: bool):
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16) if enabled else nullcontext()


def sgd_step(agent: SACAgent, mb: Mapping[str, torch.Tensor], cfg: SACConfig) -> dict[str, torch.Tensor]:
    """One SAC step on a prepared minibatch: alpha -> critic and actor (one backward) -> Polyak. Returns tensors."""
    critic_core = unwrap(agent.critic)
    amp = _autocast(agent.device, use_bf16(cfg.bf16, agent.device))

    # Policy sample at s: the only grad-enabled actor forward (feeds the alpha loss detached, the actor loss live).
    with amp:
        new_action, log_prob = agent.actor(mb["obs"])

    # (1) temperature
    loss_alpha = alpha_loss(agent.log_alpha(), log_prob, agent.target_entropy)
    agent.alpha_opt.zero_grad(set_to_none=True)
    loss_alpha.backward()
    agent.alpha_opt.step()
    alpha = agent.alpha

    # (2) critic target from the target critic at a' ~ pi(.|s'), with the updated alpha
    with torch.no_grad(), amp:
        next_action, next_log_prob = unwrap(agent.actor)(mb["next_obs"])
        next_q = agent.target_critic(mb["next_critic_obs"], next_action)
    target = soft_q_target(mb["reward"], mb["terminated"], next_q, next_log_prob, alpha, cfg.gamma, cfg.reward_scale)

    # (3) critic and actor losses at the same parameters; the actor's Q uses detached critic weights
    with amp:
        q = agent.critic(mb["critic_obs"], mb["action"])
        q_new_action = critic_core(mb["critic_obs"], new_action, detach_params=True)
    loss_critic = critic_loss(q, target, mb["truncated"], mb["terminated"])
    loss_actor = actor_loss(log_prob, q_new_action, alpha)
    agent.critic_opt.zero_grad(set_to_none=True)
    agent.actor_opt.zero_grad(set_to_none=True)
    (loss_critic + loss_actor).backward()
    agent.critic_opt.step()
    agent.actor_opt.step()

    # (4) Polyak averaging of the target critic
    with torch.no_grad():
        torch._foreach_lerp_(list(agent.target_critic.parameters()), list(critic_core.parameters()), cfg.tau)
    agent.num_updates += 1

    return {
        "critic_loss": loss_critic.detach(),
        "actor_loss": loss_actor.detach(),
        "alpha_loss": loss_alpha.detach(),
        "alpha": alpha,
        "entropy": -log_prob.detach().mean(),
        "q": q.detach().mean(),
        "target_q": target.mean(),
    }


def update(
    agent: SACAgent,
    batch: Batch | Callable[[int], Batch],
    cfg: SACConfig | None = None,
) -> dict[str, float]:
    """G = ``cfg.utd`` SAC steps on ``G * B`` transitions sampled in one go (LIFT's scan over SGD steps).

    ``batch`` holds raw transitions with leading dim ``G * B`` (keys: obs, action, reward, next_obs, terminated,
    truncated, and critic_obs/next_critic_obs for an asymmetric agent) or is a function ``n -> batch`` such as
    ``ReplayBuffer.sample``. Observations are normalized with the agent's current statistics and rewards
    scaled inside the steps; the caller updates the normalizers with new data. ``cfg`` (default
    ``agent.cfg``) supplies gamma, tau, reward_scale, batch_size, utd, bf16; learning rates are the
    optimisers'. Returns metrics averaged over the G steps, with a single device sync.
    """
    cfg = cfg or agent.cfg
    n = cfg.utd * cfg.batch_size
    raw = batch(n) if callable(batch) else batch
    rows = len(raw["obs"])
    if rows != n:
        raise ValueError(f"update needs utd * batch_size = {n} transitions, got {rows}")
    data = agent.prepare(raw)
    per_step = []
    for g in range(cfg.utd):
        minibatch = {k: v[g * cfg.batch_size:(g + 1) * cfg.batch_size] for k, v in data.items()}
        per_step.append(sgd_step(agent, minibatch, cfg))
    names = list(per_step[0])
    means = torch.stack([torch.stack([m[k].float() for k in names]) for m in per_step]).mean(0)
    return dict(zip(names, means.tolist()))
