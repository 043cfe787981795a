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

Here: the hyperparameters, the four losses and ``update``. The networks and the agent that holds them:
``algos.lift.agent``; the policy an env worker runs: ``algos.lift.policy``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from algos.nets import ACTIVATIONS, unwrap
from algos.precision import use_bf16

if TYPE_CHECKING:  # the agent is built from a SACConfig (algos.lift.agent imports this module)
    from algos.lift.agent import SACAgent

Batch = Mapping[str, torch.Tensor]

# Columns of LIFT's `pretrain_sac_config` (Optuna-tuned) plus small presets with the same structure.
PRESETS: dict[str, dict[str, Any]] = {
    # LIFT default column (T1/G1 low-dim joystick tasks).
    "humanoid": dict(
        num_envs=1000, batch_size=1024, utd=9, gamma=0.98706, tau=0.02418,
        actor_lr=1.034e-4, critic_lr=1.002e-4, alpha_lr=9.97e-3, init_log_alpha=-3.348,
        target_entropy_coef=0.5, reward_scale=1.0, replay_capacity=1_000_000, min_replay_size=8192,
        actor_hidden=(512, 256, 128), critic_hidden=(1024, 512, 256), activation="swish",
        weight_decay=1e-4, bf16="auto",
    ),
    # LIFT G1Joystick*/T1JoystickRough column: 4096 envs, batch 16384, G = 19.
    "humanoid_large": dict(
        num_envs=4096, batch_size=16384, utd=19, gamma=0.98201, tau=0.00239,
        actor_lr=1.699e-4, critic_lr=1.877e-4, alpha_lr=6.44e-4, init_log_alpha=-3.005,
        target_entropy_coef=0.396, reward_scale=16.0, replay_capacity=1_000_000, min_replay_size=8192,
        actor_hidden=(512, 256, 128), critic_hidden=(1024, 512, 256), activation="swish",
        weight_decay=1e-4, bf16="auto",
    ),
    # Same structure as "humanoid" (3-layer nets, UTD > 1, LIFT's coefficients), shrunk to run in seconds.
    "smoke": dict(
        num_envs=4, batch_size=64, utd=2, gamma=0.98706, tau=0.02418,
        actor_lr=1.034e-4, critic_lr=1.002e-4, alpha_lr=9.97e-3, init_log_alpha=-3.348,
        target_entropy_coef=0.5, reward_scale=1.0, replay_capacity=10_000, min_replay_size=256,
        actor_hidden=(32, 16, 8), critic_hidden=(64, 32, 16), activation="swish",
        weight_decay=1e-4, bf16=False,
    ),
    # CPU learning check (reference card 5.5): Pendulum-v1, 8 envs, batch 1024, G = 4.
    "pendulum": dict(
        num_envs=8, batch_size=1024, utd=4, gamma=0.99, tau=0.005,
        actor_lr=3e-4, critic_lr=3e-4, alpha_lr=3e-4, init_log_alpha=0.0,
        target_entropy_coef=1.0, reward_scale=1.0, replay_capacity=100_000, min_replay_size=1024,
        actor_hidden=(64, 64), critic_hidden=(64, 64), activation="swish",
        weight_decay=1e-4, bf16=False,
    ),
}


@dataclass
class SACConfig:
    """SAC hyperparameters. Defaults run on a laptop; ``SACConfig.preset(name)`` gives LIFT's values."""

    # Objective and optimisation (used by `update`; lrs and weight decay are fixed when the agent is built).
    gamma: float = 0.99
    tau: float = 0.005
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    alpha_lr: float = 3e-4
    init_log_alpha: float = 0.0
    target_entropy_coef: float = 1.0  # target entropy = -coef * |A|
    reward_scale: float = 1.0
    batch_size: int = 256
    utd: int = 1  # G: gradient steps per vectorised env step
    weight_decay: float = 1e-4  # AdamW (decoupled), as optax.adamw's default; no gradient clipping
    # Networks.
    actor_hidden: tuple[int, ...] = (256, 256)
    critic_hidden: tuple[int, ...] = (256, 256)
    activation: str = "swish"
    log_std_min: float = -5.0
    log_std_max: float = 2.0
    # Execution.
    # bf16 autocast for hidden layers, fp32 params and output layers (LIFT): "auto" asks the hardware of the agent's
    # device (``algos.precision.use_bf16``: fp32 on a CPU without AMX/AVX512-BF16); true/false win.
    bf16: bool | str = "auto"
    compile: bool = False  # torch.compile the actor/critic forwards
    # Data collection (read by the training loop, not by `update`).
    num_envs: int = 8
    replay_capacity: int = 100_000
    min_replay_size: int = 1024  # prefill with the initial (stochastic) policy before updating

    def __post_init__(self) -> None:
        # Hydra passes lists; store tuples so configs hash and compare cleanly.
        self.actor_hidden = tuple(int(h) for h in self.actor_hidden)
        self.critic_hidden = tuple(int(h) for h in self.critic_hidden)
        checks = {
            "gamma": 0.0 < self.gamma <= 1.0,
            "tau": 0.0 < self.tau <= 1.0,
            "actor_lr": self.actor_lr > 0,
            "critic_lr": self.critic_lr > 0,
            "alpha_lr": self.alpha_lr > 0,
            "init_log_alpha": math.isfinite(self.init_log_alpha),
            "target_entropy_coef": math.isfinite(self.target_entropy_coef),
            "reward_scale": self.reward_scale > 0,
            "batch_size": self.batch_size >= 1,
            "utd": self.utd >= 1,
            "weight_decay": self.weight_decay >= 0,
            "actor_hidden": len(self.actor_hidden) > 0 and min(self.actor_hidden) > 0,
            "critic_hidden": len(self.critic_hidden) > 0 and min(self.critic_hidden) > 0,
            "activation": self.activation in ACTIVATIONS,
            "log_std_max": self.log_std_min < self.log_std_max,
            "num_envs": self.num_envs >= 1,
            "replay_capacity": self.replay_capacity >= max(self.min_replay_size, 1),
            "min_replay_size": self.min_replay_size >= 1,
            "bf16": isinstance(self.bf16, bool) or self.bf16 == "auto",
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"SACConfig.{name} is invalid: {getattr(self, name)!r}")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> SACConfig:
        """A named preset (``humanoid``, ``humanoid_large``, ``smoke``, ``pendulum``) with optional overrides."""
        if name not in PRESETS:
            raise ValueError(f"unknown SAC preset {name!r}; choose from {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})


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
