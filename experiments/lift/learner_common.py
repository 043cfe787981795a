"""What the two LIFT learners (stage 1 pretraining, stage 3 finetuning) share inside a Ray Train worker.

Every rank drives its own env shard through the pool and keeps its own replay; the policy stays identical on all
ranks because SAC gradients are averaged (DDP) and the observation normalizer merges every rank's batch. Rank 0
publishes the policy, evaluates it and logs the metrics; every rank reports its own checkpoint file. A checkpoint is a
plain dict per rank (``torch.load(..., weights_only=True)`` reads it) with the rank's ``Journal`` parts, so a
resumed learner drops the Parquet rows and metric rows written after it.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from algos.lift.agent import SACAgent
from algos.normalizer import RunningNormalizer
from cluster import ddp
from experiments.lift.driver_common import evaluate_policy

log = logging.getLogger(__name__)


def learner_device(setting: str) -> torch.device:
    """``auto``: this Train worker's device (its GPU if there is one); otherwise the named device (logged: the GPU
    check asserts it)."""
    device = ddp.device() if setting == "auto" else torch.device(setting)
    log.info("learner rank %d computes on %s", _rank_or_0(), device)
    return device


def _rank_or_0() -> int:
    try:
        return ddp.rank()
    except Exception:  # noqa: BLE001 - outside a Ray Train worker (a unit test): one process
        return 0


def env_dims(task: str, change: dict | None = None) -> tuple[int, int]:
    """(observation size, action size) of the task's env (with ``change``: a velocity command adds an input)."""
    from envs.control.tasks import make_env
    probe = make_env(task, change)
    dims = probe.observation_space.shape[0], probe.action_space.shape[0]
    probe.close()
    return dims


def sync_normalizer(normalizer: RunningNormalizer, obs: np.ndarray) -> None:
    """Merge a batch into the normalizer with the statistics of every rank's batch (identical on all ranks)."""
    x = torch.tensor(np.asarray(obs), dtype=torch.float64).reshape(-1, *normalizer.shape)  # a copy: Ray's arrays are read-only
    moments = torch.stack([torch.full_like(x[0], float(len(x))), x.sum(0), x.square().sum(0)])
    ddp.all_reduce_mean_([moments])
    moments *= ddp.world_size()
    n = moments[0][0] if moments.ndim > 1 else moments[0]
    mean = moments[1] / n
    var = (moments[2] / n - mean.square()).clamp_min(0.0)
    normalizer.merge_({"mean": mean, "var": var, "count": n})


def publish(pool: Any, policy_key: str, agent: SACAgent) -> None:
    """Rank 0 publishes the current policy; every rank waits, so no rank collects with an older one."""
    if ddp.rank() == 0:
        pool.publish(policy_key, agent.policy_state())
    ddp.barrier()


def evaluate_on_rank0(pool: Any, policy_key: str, env_config: dict, episodes: int, seed: int,
                      affinity: list[int] | None = None) -> float:
    """Rank 0 evaluates (``evaluate_policy``) and shares the value, so every rank takes the same decisions."""
    value = float("nan")
    if ddp.rank() == 0:
        value = evaluate_policy(pool, policy_key, env_config, episodes, seed, affinity)
    shared = torch.tensor([value], dtype=torch.float64)
    ddp.broadcast_([shared], src=0)
    return float(shared.item())


def load_checkpoint(ckpt: Path | None) -> dict[str, Any] | None:
    """This rank's state in the checkpoint being resumed, or None on a fresh start. Loaded to the host: the saving
    process's GPU (a restart or a PBT clone may land on another layout) plays no part; each learner's
    ``load_state_dict`` copies the tensors onto its own device."""
    if ckpt is None:
        return None
    return torch.load(ckpt / f"rank{ddp.rank()}.pt", weights_only=True, map_location="cpu")


def save_checkpoint(d: Path, state: dict[str, Any], agent: SACAgent, metrics: dict[str, Any]) -> None:
    """Write this rank's ``state`` (and, on rank 0, the policy) into ``d`` and report ``metrics`` with it: every rank
    reports its own directory (``ddp.report``), Ray Train merges them into one checkpoint, and each rank resumes from
    its own ``rank<r>.pt`` (``load_checkpoint``); no rank's replay travels through another."""
    rank = ddp.rank()
    torch.save(state, d / f"rank{rank}.pt")
    if rank == 0:
        torch.save(agent.policy_state(), d / "policy.pt")
    ddp.report(reportable(metrics), checkpoint_dir=d)


def gather_max(value: float) -> float:
    """The largest finite ``value`` over the ranks (NaN if none is finite), with the mean all-reduce: every rank
    writes its value into its own slot of a zero vector."""
    world = ddp.world_size()
    if world == 1:
        return float(value)
    ok = bool(np.isfinite(value))
    slots, finite = torch.zeros(world, dtype=torch.float64), torch.zeros(world, dtype=torch.float64)
    slots[ddp.rank()], finite[ddp.rank()] = (float(value), 1.0) if ok else (0.0, 0.0)
    ddp.all_reduce_mean_([slots, finite])
    slots, finite = slots * world, finite * world
    return float(slots[finite > 0.5].max()) if bool((finite > 0.5).any()) else float("nan")


def reportable(row: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics row (what Ray Train reports)."""
    return {k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}


def param_divergence(agent: SACAgent) -> float:
    """Largest parameter difference between this rank and rank 0 (0 when DDP keeps them identical)."""
    return ddp.replica_divergence(agent.actor, agent.critic)
