"""Soft Actor-Critic with LIFT's large-batch, high-UTD recipe (LIFT stage i; Haarnoja et al. 2018, arXiv:1812.05905).

One training iteration of LIFT (Brax SAC, modified):
    1. one vectorised env step of all ``num_envs`` envs with the stochastic policy; update the observation
       normalizer(s) with the new data; insert the transitions into the FIFO replay buffer    (caller)
    2. draw ``G * B`` transitions uniformly at once, normalize them, and run G SGD steps on
       consecutive slices of B, each: alpha -> critic -> actor -> Polyak                      (``update``)

Within one SGD step every loss reads the parameters from the start of the step, except that the critic
and actor losses use the *updated* temperature (the order of Brax/LIFT's ``sgd_step``):
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
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from algos.nets import ACTIVATIONS, mlp
from algos.normalizer import RunningNormalizer

logger = logging.getLogger(__name__)

Batch = Mapping[str, torch.Tensor]

# Columns of LIFT's `pretrain_sac_config` (Optuna-tuned) plus small presets with the same structure.
PRESETS: dict[str, dict[str, Any]] = {
    # LIFT default column (T1/G1 low-dim joystick tasks).
    "humanoid": dict(
        num_envs=1000, batch_size=1024, utd=9, gamma=0.98706, tau=0.02418,
        actor_lr=1.034e-4, critic_lr=1.002e-4, alpha_lr=9.97e-3, init_log_alpha=-3.348,
        target_entropy_coef=0.5, reward_scale=1.0, replay_capacity=1_000_000, min_replay_size=8192,
        actor_hidden=(512, 256, 128), critic_hidden=(1024, 512, 256), activation="swish",
        weight_decay=1e-4, bf16=True,
    ),
    # LIFT G1Joystick*/T1JoystickRough column: 4096 envs, batch 16384, G = 19.
    "humanoid_large": dict(
        num_envs=4096, batch_size=16384, utd=19, gamma=0.98201, tau=0.00239,
        actor_lr=1.699e-4, critic_lr=1.877e-4, alpha_lr=6.44e-4, init_log_alpha=-3.005,
        target_entropy_coef=0.396, reward_scale=16.0, replay_capacity=1_000_000, min_replay_size=8192,
        actor_hidden=(512, 256, 128), critic_hidden=(1024, 512, 256), activation="swish",
        weight_decay=1e-4, bf16=True,
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
    bf16: bool = False  # bf16 autocast for hidden layers, fp32 params and output layers (LIFT)
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


# ----------------------------------------------------------------------------------------------- networks


def squash_log_std(raw: torch.Tensor, log_std_min: float = -5.0, log_std_max: float = 2.0) -> torch.Tensor:
    """LIFT's smooth log-std bound: ``min + (max - min) (tanh(raw) + 1) / 2``, i.e. ``-5 + 3.5 (tanh(raw) + 1)``."""
    return log_std_min + 0.5 * (log_std_max - log_std_min) * (torch.tanh(raw) + 1.0)


def tanh_gaussian_log_prob(pre_tanh: torch.Tensor, noise: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """log pi(tanh(u)) for u = mu + sigma * noise, summed over action dims (SAC appendix C).

    The tanh Jacobian uses the stable form log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)).
    """
    gaussian = -0.5 * noise.square() - log_std - 0.5 * math.log(2.0 * math.pi)
    log_det_jacobian = 2.0 * (math.log(2.0) - pre_tanh - F.softplus(-2.0 * pre_tanh))
    return (gaussian - log_det_jacobian).sum(-1)


class Actor(nn.Module):
    """Tanh-squashed diagonal Gaussian policy on *normalized* observations.

    ``forward(obs) -> (action, log_prob)``; the sample is reparameterised, so gradients reach the parameters.
    The deterministic action is ``tanh(mu)``, returned with the log-density of that point.
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: Sequence[int] = (256, 256),
        activation: str = "swish",
        log_std_min: float = -5.0,
        log_std_max: float = 2.0,
    ):
        super().__init__()
        self.act_dim = act_dim
        self.log_std_min, self.log_std_max = log_std_min, log_std_max
        self.net = mlp(obs_dim, hidden, 2 * act_dim, activation, fp32_output=True)

    def distribution(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-tanh mean and log-std, each ``(..., act_dim)``."""
        mean, raw_log_std = self.net(obs).chunk(2, dim=-1)
        return mean, squash_log_std(raw_log_std, self.log_std_min, self.log_std_max)

    def forward(
        self, obs: torch.Tensor, deterministic: bool = False, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.distribution(obs)
        if deterministic:
            noise = torch.zeros_like(mean)
        else:
            noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        pre_tanh = mean + log_std.exp() * noise
        return torch.tanh(pre_tanh), tanh_gaussian_log_prob(pre_tanh, noise, log_std)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.forward(obs, deterministic, generator)[0]


class TwinCritic(nn.Module):
    """``n_critics`` independent Q-MLPs on ``concat(normalized critic obs, action)``.

    ``forward(obs, action, detach_params=False) -> (B, n_critics)``. With ``detach_params=True`` the critic is a
    fixed function of the action: the actor loss differentiates through it without producing critic gradients.
    Plain per-critic MLPs, not one batched ``EnsembleMLP``: on CPU the batched matmul with the shared input
    broadcast to every member measured ~20 % slower per update at 256-256 (benchmarks/RESULTS.md, SAC section).
    """

    def __init__(
        self, obs_dim: int, act_dim: int, hidden: Sequence[int] = (256, 256), activation: str = "swish", n_critics: int = 2
    ):
        super().__init__()
        self.qs = nn.ModuleList(
            mlp(obs_dim + act_dim, hidden, 1, activation, fp32_output=True) for _ in range(n_critics)
        )

    def forward(self, obs: torch.Tensor, action: torch.Tensor, detach_params: bool = False) -> torch.Tensor:
        x = torch.cat([obs, action.to(obs.dtype)], dim=-1)
        if detach_params:
            outs = [torch.func.functional_call(q, {k: v.detach() for k, v in q.named_parameters()}, (x,))
                    for q in self.qs]
        else:
            outs = [q(x) for q in self.qs]
        return torch.cat(outs, dim=-1)


class LogAlpha(nn.Module):
    """The SAC temperature, parameterised as log(alpha); ``forward()`` returns log(alpha)."""

    def __init__(self, init_log_alpha: float = 0.0):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(float(init_log_alpha)))

    def forward(self) -> torch.Tensor:
        return self.log_alpha


def unwrap(module: nn.Module) -> nn.Module:
    """The module inside a DDP/FSDP-style wrapper (``.module``), or the module itself."""
    return getattr(module, "module", module)


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


# ---------------------------------------------------------------------------------------------------- agent


class SACAgent:
    """Actor, twin critic, target critic, temperature, their AdamW optimisers and the observation normalizers.

    Args:
        obs_dim: actor observation size.
        act_dim: action size (actions in [-1, 1]).
        cfg: hyperparameters.
        critic_obs_dim: size of a separate (privileged) critic observation for asymmetric actor-critic; then
            batches must carry ``critic_obs``/``next_critic_obs``, normalized by ``critic_obs_normalizer``.
            ``None``: the critic sees the actor's normalized observation.
        device: where parameters, optimiser state and normalizer statistics live.
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        cfg: SACConfig | None = None,
        *,
        critic_obs_dim: int | None = None,
        device: torch.device | str = "cpu",
    ):
        self.cfg = cfg = cfg or SACConfig()
        self.obs_dim, self.act_dim, self.critic_obs_dim = obs_dim, act_dim, critic_obs_dim
        self.device = torch.device(device)
        self.actor: nn.Module = Actor(
            obs_dim, act_dim, cfg.actor_hidden, cfg.activation, cfg.log_std_min, cfg.log_std_max
        ).to(self.device)
        self.critic: nn.Module = TwinCritic(critic_obs_dim or obs_dim, act_dim, cfg.critic_hidden, cfg.activation).to(
            self.device
        )
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha: nn.Module = LogAlpha(cfg.init_log_alpha).to(self.device)
        self.obs_normalizer = RunningNormalizer(obs_dim).to(self.device)
        self.critic_obs_normalizer = RunningNormalizer(critic_obs_dim).to(self.device) if critic_obs_dim else None
        self.target_entropy = -cfg.target_entropy_coef * act_dim
        # Fused AdamW: one kernel per optimiser step (4x cheaper than foreach on CPU for small nets).
        adamw = dict(weight_decay=cfg.weight_decay, fused=self.device.type in ("cpu", "cuda"))
        self.actor_opt = torch.optim.AdamW(self.actor.parameters(), lr=cfg.actor_lr, **adamw)
        self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=cfg.critic_lr, **adamw)
        self.alpha_opt = torch.optim.AdamW(self.log_alpha.parameters(), lr=cfg.alpha_lr, **adamw)
        self.num_updates = 0
        if cfg.compile:
            for module in (self.actor, self.critic, self.target_critic):
                module.compile()  # in place: state_dict keys are unchanged

    @property
    def alpha(self) -> torch.Tensor:
        return unwrap(self.log_alpha).log_alpha.detach().exp()

    def wrap(self, wrapper: Callable[[nn.Module], nn.Module]) -> None:
        """Wrap the trained modules (e.g. ``DistributedDataParallel``); optimisers keep the same parameters."""
        self.actor, self.critic, self.log_alpha = wrapper(self.actor), wrapper(self.critic), wrapper(self.log_alpha)

    @torch.no_grad()
    def update_normalizers(self, obs: torch.Tensor | np.ndarray, critic_obs: torch.Tensor | np.ndarray | None = None) -> None:
        """Fold freshly collected observations into the running statistics (LIFT: every env step)."""
        self.obs_normalizer.update(obs)
        if self.critic_obs_normalizer is not None:
            if critic_obs is None:
                raise ValueError("asymmetric agent: update_normalizers needs critic_obs")
            self.critic_obs_normalizer.update(critic_obs)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """Actions in [-1, 1] for raw observations (normalized here)."""
        obs = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
        return unwrap(self.actor).act(self.obs_normalizer.normalize(obs), deterministic)

    def prepare(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Move a raw transition batch to the device as float32, normalize observations (critic obs too)."""
        cast = lambda key: torch.as_tensor(batch[key]).to(self.device, torch.float32, non_blocking=True)  # noqa: E731
        obs, next_obs = cast("obs"), cast("next_obs")
        data = {
            "obs": self.obs_normalizer.normalize(obs),
            "next_obs": self.obs_normalizer.normalize(next_obs),
            "action": cast("action"),
            "reward": cast("reward").reshape(-1),
            "terminated": cast("terminated").reshape(-1),
            "truncated": cast("truncated").reshape(-1),
        }
        if self.critic_obs_normalizer is None:
            data["critic_obs"], data["next_critic_obs"] = data["obs"], data["next_obs"]
        else:
            missing = {"critic_obs", "next_critic_obs"} - set(batch)
            if missing:
                raise ValueError(f"asymmetric agent: batch lacks {sorted(missing)}")
            data["critic_obs"] = self.critic_obs_normalizer.normalize(cast("critic_obs"))
            data["next_critic_obs"] = self.critic_obs_normalizer.normalize(cast("next_critic_obs"))
        return data

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume bit-for-bit: weights, targets, temperature, optimisers, normalizers."""
        state = {
            "arch": self._arch(),
            "config": dataclasses.asdict(self.cfg),
            "actor": unwrap(self.actor).state_dict(),
            "critic": unwrap(self.critic).state_dict(),
            "target_critic": self.target_critic.state_dict(),
            "log_alpha": unwrap(self.log_alpha).state_dict(),
            "actor_opt": self.actor_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "alpha_opt": self.alpha_opt.state_dict(),
            "obs_normalizer": self.obs_normalizer.state_dict(),
            "num_updates": self.num_updates,
        }
        if self.critic_obs_normalizer is not None:
            state["critic_obs_normalizer"] = self.critic_obs_normalizer.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state["arch"] != self._arch():
            raise ValueError(f"checkpoint architecture {state['arch']} != agent architecture {self._arch()}")
        unwrap(self.actor).load_state_dict(state["actor"])
        unwrap(self.critic).load_state_dict(state["critic"])
        self.target_critic.load_state_dict(state["target_critic"])
        unwrap(self.log_alpha).load_state_dict(state["log_alpha"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.alpha_opt.load_state_dict(state["alpha_opt"])
        self.obs_normalizer.load_state_dict(state["obs_normalizer"])
        if self.critic_obs_normalizer is not None:
            self.critic_obs_normalizer.load_state_dict(state["critic_obs_normalizer"])
        self.num_updates = int(state["num_updates"])

    def policy_state(self) -> dict[str, Any]:
        """What an acting worker needs (small, picklable, CPU): actor weights, obs statistics, architecture."""
        return {
            "arch": {k: v for k, v in self._arch().items() if k != "critic_hidden" and k != "critic_obs_dim"},
            "actor": {k: v.detach().to("cpu", copy=True) for k, v in unwrap(self.actor).state_dict().items()},
            "obs_mean": self.obs_normalizer.mean.cpu().numpy().astype(np.float32),
            "obs_std": self.obs_normalizer.std.cpu().numpy().astype(np.float32),
            "num_updates": self.num_updates,
        }

    def _arch(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "obs_dim": self.obs_dim,
            "act_dim": self.act_dim,
            "critic_obs_dim": self.critic_obs_dim,
            "actor_hidden": tuple(cfg.actor_hidden),
            "critic_hidden": tuple(cfg.critic_hidden),
            "activation": cfg.activation,
            "log_std_min": cfg.log_std_min,
            "log_std_max": cfg.log_std_max,
        }


# --------------------------------------------------------------------------------------------------- update


def _autocast(device: torch.device, enabled: bool):
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16) if enabled else nullcontext()


def sgd_step(agent: SACAgent, mb: Mapping[str, torch.Tensor], cfg: SACConfig) -> dict[str, torch.Tensor]:
    """One SAC step on a prepared minibatch: alpha -> critic and actor (one backward) -> Polyak. Returns tensors."""
    critic_core = unwrap(agent.critic)
    amp = _autocast(agent.device, cfg.bf16)

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


# ------------------------------------------------------------------------------------------ acting workers


class NumpyPolicy:
    """Acting-side policy rebuilt from ``SACAgent.policy_state()``: numpy observations in, [-1, 1] actions out.

    Runs on CPU in fp32 under ``no_grad``. ``load(policy_state)`` refreshes weights and statistics in place.
    """

    def __init__(self, policy_state: Mapping[str, Any], seed: int | None = None):
        arch = policy_state["arch"]
        self.arch = dict(arch)
        with torch.random.fork_rng(devices=[]):  # the init is overwritten; don't shift the caller's RNG stream
            self.actor = Actor(
                arch["obs_dim"], arch["act_dim"], arch["actor_hidden"], arch["activation"],
                arch["log_std_min"], arch["log_std_max"],
            ).eval()
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)
        self.load(policy_state)

    def load(self, policy_state: Mapping[str, Any]) -> None:
        if dict(policy_state["arch"]) != self.arch:
            raise ValueError(f"policy architecture changed: {policy_state['arch']} != {self.arch}")
        self.actor.load_state_dict(policy_state["actor"])
        self.obs_mean = torch.as_tensor(np.asarray(policy_state["obs_mean"], dtype=np.float32))
        self.obs_std = torch.as_tensor(np.asarray(policy_state["obs_std"], dtype=np.float32))
        self.num_updates = policy_state.get("num_updates", 0)

    @torch.no_grad()
    def __call__(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        obs_t = torch.as_tensor(np.asarray(obs, dtype=np.float32))
        single = obs_t.ndim == 1
        if single:
            obs_t = obs_t.unsqueeze(0)
        action = self.actor.act((obs_t - self.obs_mean) / self.obs_std, deterministic, self.generator).numpy()
        return action[0] if single else action


def build_policy(policy_state: Mapping[str, Any], *, seed: int | None = None, num_threads: int | None = 1) -> NumpyPolicy:
    """Policy callable ``(obs_np, deterministic) -> action_np`` for env workers; sets torch to ``num_threads``."""
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    return NumpyPolicy(policy_state, seed=seed)
