"""Collect transitions of a MuJoCo task across the pool and write them to Parquet.

Each shard is an independently seeded batch of envs (seed = run seed * 100003 + shard), so the transitions depend
on the seed and the shard layout only, never on how many pool workers there are or which served which shard.
Exactly ``num_transitions`` rows are written (the last shard is cut short when the layout does not divide it).
Every written shard is one step of the run (metrics, a commit, a Tune report inside a sweep), so a killed run
resumes with ``resume=true`` at the first unwritten shard.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cluster.journal import Journal
from cluster.metrics import Progress
from envs.control.tasks import MUJOCO_TASKS, TASKS, env_id

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
        if self.physics_state and self.task not in MUJOCO_TASKS:
            raise ValueError(f"experiment.physics_state: {self.task} has no MuJoCo state; set it to false")
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
    """Collect shard by shard; each written shard is a commit, so ``resume=true`` redoes only unwritten shards."""
    exp: Config = ctx.typed["experiment"]
    pool = ctx.pool
    sampler_cfg = {"task": exp.task, "num_envs": exp.envs_per_shard, "physics_state": exp.physics_state}
    weights = None
    if exp.policy != "random":
        import torch
        weights = f"{ctx.run_id}/policy"  # weight keys start with the run's unique id (two collects never share one)
        pool.publish(weights, torch.load(exp.policy, weights_only=True, map_location="cpu"))
    store = ctx.run_dir.store("transitions")
    episodes = ctx.run_dir.store("episodes")
    journal = Journal(ctx.run_dir.path, [store, episodes], metrics=ctx.metrics, report=ctx.tune_report)
    first = (journal.resume() if cfg["resume"] else journal.start()).step  # shards already written
    requests = requests_for(exp, cfg["seed"])[first:]
    written = len(store)
    progress = Progress("collect", exp.num_transitions, "transitions", done=written)  # a resume's rate: from here
    started, written_at_start = time.perf_counter(), written
    results: dict[int, dict] = {}
    # Shards arrive in completion order; they are written in shard order so the file is reproducible.
    next_to_write = first
    for i, result in pool.imap("env", requests, config=sampler_cfg, weights=weights):
        results[first + i] = result
        while next_to_write in results:
            r = results.pop(next_to_write)
            keep = min(r["num_samples"], exp.num_transitions - written)  # the last shard(s) may be cut short
            batch = {k: v[:keep] for k, v in r["transitions"].items()}
            batch["shard"] = np.full(keep, next_to_write, dtype=np.int64)
            store.append(batch)
            ep_returns = np.asarray(r["episode_returns"], dtype=np.float64)
            episodes.append({"episode_return": ep_returns, "episode_length": np.asarray(r["episode_lengths"]),
                             "shard": np.full(len(ep_returns), next_to_write, dtype=np.int64)})
            written += keep
            next_to_write += 1
            elapsed = time.perf_counter() - started
            metrics = {"transitions": written, "shards_done": next_to_write,
                       "transitions_per_s": (written - written_at_start) / max(elapsed, 1e-9)}
            if len(ep_returns):
                metrics["mean_episode_return"] = float(ep_returns.mean())
            journal.commit(next_to_write, metrics)
            progress.update(written, shards=next_to_write)
    progress.update(written, force=True, shards=next_to_write)
    returns = episodes.to_numpy(["episode_return"])["episode_return"] if episodes.num_parts else np.array([])
    summary = {"task": env_id(exp.task), "transitions": len(store), "shards": exp.num_shards,
               "resumed_at_shard": first if cfg["resume"] else None,
               "episodes_finished": len(returns), "mean_episode_return": float(np.mean(returns)) if len(returns) else None,
               "store": str(store.path), "pool": {k: v for k, v in pool.stats().items() if k != "workers"}}
    print(f"collected {summary['transitions']} transitions of {summary['task']} in {exp.num_shards} shards "
          f"-> {store.path}", flush=True)
    return summary
