"""The deployable SAC policy: what an env worker runs, rebuilt from ``SACAgent.policy_state()``.

Numpy observations in, actions in [-1, 1] out; CPU, fp32, no gradient. The worker's torch thread count is its
host's business (the pool limits it before building a sampler).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from algos.lift.agent import Actor


class NumpyPolicy:
    """Acting-side policy: the actor plus the observation statistics it was trained with.

    ``load(policy_state)`` refreshes weights and statistics in place (the architecture must not change).
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
        self.obs_mean = torch.as_tensor(policy_state["obs_mean"], dtype=torch.float32)
        self.obs_std = torch.as_tensor(policy_state["obs_std"], dtype=torch.float32)
        self.num_updates = policy_state.get("num_updates", 0)

    @torch.no_grad()
    def __call__(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        obs_t = torch.as_tensor(np.asarray(obs, dtype=np.float32))
        single = obs_t.ndim == 1
        if single:
            obs_t = obs_t.unsqueeze(0)
        action = self.actor.act((obs_t - self.obs_mean) / self.obs_std, deterministic, self.generator).numpy()
        return action[0] if single else action


def build_policy(policy_state: Mapping[str, Any], *, seed: int | None = None) -> NumpyPolicy:
    """Policy callable ``(obs_np, deterministic) -> action_np`` for env workers."""
    return NumpyPolicy(policy_state, seed=seed)
