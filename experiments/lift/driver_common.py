"""What the LIFT drivers share (on the driver, no Ray Train import): the task of the composed config, the loop
config a learner's ``train_fn`` receives, and evaluating a published policy through the pool.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

EVAL_SEED_OFFSET = 10_000  # evaluation episodes are seeded apart from every training env


def env_task(raw: dict, choices: Any, requirement: str) -> str:
    """``env.task`` of the composed config, if it is one of ``choices``; else a ConfigError saying what is needed."""
    from experiments.config import ConfigError
    task = (raw.get("env") or {}).get("task")
    if task not in choices:
        raise ConfigError(f"env.task: {requirement} ({', '.join(sorted(choices))}), got {task!r}")
    return task


def loop_config(cfg: dict, ctx: Any, task: str, **extra: Any) -> dict[str, Any]:
    """What a learner's ``train_fn`` receives: its experiment and pool sections, where to write, the task and the run's
    unique id (the prefix of its pool weight keys and the scope of its pool entries)."""
    return {"experiment": dataclasses.asdict(ctx.typed["experiment"]), "pool": dataclasses.asdict(ctx.typed["pool"]),
            "run_path": str(ctx.run_dir.path), "run_id": ctx.run_id,
            "task": task, "seed": cfg["seed"], "torch_threads": cfg["torch_threads"], **extra}


def evaluate_policy(pool: Any, policy_key: str, env_config: dict, episodes: int, seed: int,
                    affinity: list[int] | None = None) -> float:
    """Mean return of ``episodes`` deterministic episodes of the published policy, through the pool."""
    request = {"evaluate_episodes": episodes, "reset_seed": EVAL_SEED_OFFSET + seed, "deterministic": True}
    placement = {} if affinity is None else {"affinity": affinity}
    result = pool.map("env", [request], config=env_config, weights=policy_key, **placement)[0]
    return float(np.mean(result["episode_returns"]))
