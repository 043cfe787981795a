"""Pool sampler for environment rollouts: a persistent batch of gymnasium envs driven by the latest policy.

config:  task, num_envs, seed, change (stage-3 edit or None), physics_state (record qpos/qvel),
         deterministic_only (a real robot's interface: refuse stochastic actions)
request: steps, optionally reset_seed (rebuild the envs from this seed: reproducible independent shards),
         deterministic (act with the policy mean), policy ("random" before any weights are published);
         or evaluate_episodes + reset_seed: run that many whole episodes in fresh envs (evaluation)
result:  transitions (dict of arrays, steps*num_envs rows), episode returns/lengths/terminations, policy version
"""
from __future__ import annotations

from typing import Any

import numpy as np

from envs.control.rollout import VectorRollout, random_policy


class EnvSampler:
    KEYS = {"task", "num_envs", "seed", "change", "physics_state", "deterministic_only", "shard", "run"}

    def __init__(self, config: dict) -> None:
        unknown = sorted(set(config) - self.KEYS)
        if unknown or "task" not in config:
            raise ValueError(f"env sampler config: unknown keys {unknown} or missing 'task' (valid: {sorted(self.KEYS)})")
        self.config = dict(config)
        self.rollout: VectorRollout | None = None
        self.policy_state: Any = None
        self.policy_fn: Any = None
        self.version = 0
        self.actions_sent = {"deterministic": 0, "stochastic": 0}

    def _build(self, seed: int) -> None:
        if self.rollout is not None:
            self.rollout.close()
        cfg = self.config
        self.rollout = VectorRollout(cfg["task"], int(cfg.get("num_envs", 1)), seed, cfg.get("change"),
                                     bool(cfg.get("physics_state", False)))

    def load_weights(self, weights: Any, version: int) -> None:
        from algos.lift.policy import build_policy  # lazy: random-policy collection needs no torch
        self.policy_fn = build_policy(weights)
        self.version = version

    def evaluate(self, request: dict) -> dict:
        from envs.control.rollout import evaluate
        if self.policy_fn is None:
            raise RuntimeError("evaluation needs published policy weights")
        deterministic = bool(request.get("deterministic", True))
        stats = evaluate(self.config["task"], lambda obs: self.policy_fn(obs, deterministic),
                         int(request["evaluate_episodes"]), int(request.get("reset_seed", 0)),
                         self.config.get("change"), num_envs=request.get("num_envs"))
        self.actions_sent["deterministic" if deterministic else "stochastic"] += 1
        return {"episode_returns": np.asarray(stats.returns), "episode_lengths": np.asarray(stats.lengths),
                "terminations": stats.terminations, "policy_version": self.version,
                "num_samples": int(sum(stats.lengths))}

    def sample(self, request: dict) -> dict:
        if "evaluate_episodes" in request:
            return self.evaluate(request)
        if "reset_seed" in request or self.rollout is None:
            self._build(int(request.get("reset_seed", self.config.get("seed", 0))))
        deterministic = bool(request.get("deterministic", False))
        use_random = request.get("policy", "learned" if self.policy_fn else "random") == "random"
        if self.config.get("deterministic_only") and (use_random or not deterministic):
            # uniform random actions are exploration too, whatever the request's "deterministic" says
            raise PermissionError("this environment only accepts the deterministic policy (deterministic_only=true), "
                                  f"got {'a random policy' if use_random else 'stochastic actions'}")
        if use_random:
            policy = random_policy(self.rollout.single_action_space, int(request.get("reset_seed", 0)) + 7919)
            version = 0
        else:
            if self.policy_fn is None:
                raise RuntimeError("no policy weights loaded: publish weights before asking for a learned policy")
            policy = lambda obs: self.policy_fn(obs, deterministic)  # noqa: E731
            version = self.version
        self.actions_sent["deterministic" if deterministic else "stochastic"] += 1
        batch, stats = self.rollout.collect(policy, int(request["steps"]))
        return {"transitions": batch, "episode_returns": np.asarray(stats.returns, dtype=np.float64),
                "episode_lengths": np.asarray(stats.lengths, dtype=np.int64), "terminations": stats.terminations,
                "policy_version": version, "policy_updates": getattr(self.policy_fn, "num_updates", 0) if version else 0,
                "deterministic": deterministic, "actions_sent": dict(self.actions_sent),
                "num_samples": len(batch["reward"])}
