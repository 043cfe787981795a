"""Collect transitions of a MuJoCo task across the pool and write them to Parquet.

Each shard is an independently seeded batch of envs (seed = run seed * 100003 + shard), so the transitions depend
on the seed and the shard layout only, never on how many pool workers there are or which served which shard.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cluster.metrics import Progress
from envs.control import TASKS, env_id

log = logging.getLogger(__name__)


@dataclass
class Config:
    task: str = "humanoid"
    num_transitions: int = 4000
    num_shards: int = 4
    envs_per_shard: int = 4
    policy: str = "random"
    physics_state: bool = True

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"experiment.task: unknown task {self.task!r} (choose from {', '.join(sorted(TASKS))})")
        for key in ("num_transitions", "num_shards", "envs_per_shard"):
            if getattr(self, key) < 1:
                raise ValueError(f"experiment.{key}: must be >= 1, got {getattr(self, key)}")
        if self.policy != "random" and not Path(self.policy).is_file():
            raise FileNotFoundError(f"experiment.policy: no such policy file {self.policy!r}")


def shard_seed(seed: int, shard: int) -> int:
    return seed * 100003 + shard


def requests_for(cfg: Config, seed: int) -> list[dict[str, Any]]:
    steps = math.ceil(cfg.num_transitions / (cfg.num_shards * cfg.envs_per_shard))
    return [{"reset_seed": shard_seed(seed, s), "steps": steps,
             "policy": "random" if cfg.policy == "random" else "learned"} for s in range(cfg.num_shards)]


def run(cfg: dict, ctx) -> dict[str, Any]:
    exp: Config = ctx.typed["experiment"]
    pool = ctx.pool
    sampler_cfg = {"task": exp.task, "num_envs": exp.envs_per_shard, "physics_state": exp.physics_state}
    weights = None
    if exp.policy != "random":
        import torch
        pool.publish("collect/policy", torch.load(exp.policy, weights_only=False))
        weights = "collect/policy"
    requests = requests_for(exp, cfg["seed"])
    store = ctx.run_dir.store("transitions")
    progress = Progress("collect", exp.num_transitions, "transitions")
    results: dict[int, dict] = {}
    done = 0
    # Shards arrive in completion order; they are written in shard order so the file is reproducible.
    next_to_write = 0
    returns: list[float] = []
    for i, result in pool.imap("env", requests, config=sampler_cfg, weights=weights):
        results[i] = result
        done += result["num_samples"]
        progress.update(min(done, exp.num_transitions))
        while next_to_write in results:
            r = results.pop(next_to_write)
            batch = dict(r["transitions"])
            batch["shard"] = np.full(len(batch["reward"]), next_to_write, dtype=np.int64)
            store.append(batch)
            returns.extend(r["episode_returns"].tolist())
            next_to_write += 1
    progress.update(done, force=True)
    summary = {"task": env_id(exp.task), "transitions": len(store), "shards": exp.num_shards,
               "episodes_finished": len(returns), "mean_episode_return": float(np.mean(returns)) if returns else None,
               "store": str(store.path), "pool": {k: v for k, v in pool.stats().items() if k != "workers"}}
    print(f"collected {summary['transitions']} transitions of {summary['task']} in {exp.num_shards} shards "
          f"-> {store.path}", flush=True)
    return summary
