"""SAC's hyperparameters (``SACConfig``) and LIFT's preset columns; the losses and ``update`` that read them:
``algos.lift.sac``; the agent built from them: ``algos.lift.agent``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from algos.nets import ACTIVATIONS

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
