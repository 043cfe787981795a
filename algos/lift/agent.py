"""The SAC agent's parts (LIFT stage i): tanh-Gaussian actor, twin critic, temperature, and the agent that holds them
with their target, AdamW optimisers and observation normalizers. The losses and the update are in ``algos.lift.sac``.

DDP: ``SACAgent.wrap(DistributedDataParallel)`` wraps ``actor``, ``critic`` and ``log_alpha``; ``algos.lift.sac``
explains which forwards go through the wrappers.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from algos.lift.sac_config import Batch, SACConfig
from algos.nets import mlp, unwrap
from algos.normalizer import RunningNormalizer
from algos.precision import use_bf16

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
        self.bf16 = use_bf16(cfg.bf16, self.device)  # "auto" resolved by this device's hardware (logged once)
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
    def act(self, obs: torch.Tensor, deterministic: bool = False, generator: torch.Generator | None = None) -> torch.Tensor:
        """Actions in [-1, 1] for raw observations (normalized here)."""
        obs = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
        return unwrap(self.actor).act(self.obs_normalizer.normalize(obs), deterministic, generator)

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
        if self.critic_obs_normalizer is None and "critic_obs" in batch:
            # the critic's clean view of a transition whose obs the actor saw through noise (LIFT's model rollouts)
            data["critic_obs"] = self.obs_normalizer.normalize(cast("critic_obs"))
            data["next_critic_obs"] = self.obs_normalizer.normalize(cast("next_critic_obs"))
        elif self.critic_obs_normalizer is None:
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
        """What an acting worker needs (small, CPU tensors): actor weights, obs statistics, architecture."""
        return {
            "arch": {k: v for k, v in self._arch().items() if k != "critic_hidden" and k != "critic_obs_dim"},
            "actor": {k: v.detach().to("cpu", copy=True) for k, v in unwrap(self.actor).state_dict().items()},
            "obs_mean": self.obs_normalizer.mean.to("cpu", torch.float32),
            "obs_std": self.obs_normalizer.std.to("cpu", torch.float32),
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

