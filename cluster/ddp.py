"""Inside a Ray Train ``train_fn``: this worker's rank and device, DDP wrapping, collectives, reports, checkpoints.

    from cluster import ddp
    ddp.set_threads(n); device = ddp.device(); model = ddp.wrap_ddp(model)
    ddp.all_reduce_mean_([stats]); ddp.report(metrics, checkpoint_dir=d)
"""
from __future__ import annotations

import logging
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import ray
import ray.train


def rank() -> int:
    return ray.train.get_context().get_world_rank()


def world_size() -> int:
    return ray.train.get_context().get_world_size()


def device():
    import torch
    return ray.train.torch.get_device() if torch.cuda.is_available() else torch.device("cpu")


def set_threads(n: int) -> None:
    """Ray sets OMP_NUM_THREADS from the worker's CPUs (1 for fractions); make torch agree explicitly."""
    import torch
    os.environ["OMP_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)


def wrap_ddp(module):
    """DDP-wrap ``module`` when there is more than one worker (gradients all-reduced on backward)."""
    import torch
    if world_size() == 1:
        return module
    dev = device()
    ids = [dev.index] if dev.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids)


def quiet_logs() -> None:
    """Ray Train logs every report at INFO; a learner reporting each round would drown its own progress lines."""
    for name in ("ray.train", "ray.train.v2"):
        logging.getLogger(name).setLevel(logging.WARNING)


def all_reduce_mean_(tensors) -> None:
    """Average tensors in place across workers (e.g. normalizer statistics, evaluation metrics)."""
    if world_size() == 1:
        return
    import torch.distributed as dist
    for t in tensors:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t.div_(world_size())


def barrier() -> None:
    if world_size() > 1:
        import torch.distributed as dist
        dist.barrier()


def broadcast_(tensors, src: int = 0) -> None:
    if world_size() == 1:
        return
    import torch.distributed as dist
    for t in tensors:
        dist.broadcast(t, src=src)


def report(metrics: dict[str, Any], checkpoint_dir: str | Path | None = None) -> None:
    """Report metrics (every rank must call this equally often); rank 0's ``checkpoint_dir`` becomes a checkpoint."""
    checkpoint = None
    if checkpoint_dir is not None and rank() == 0:
        checkpoint = ray.train.Checkpoint.from_directory(str(checkpoint_dir))
    ray.train.report({k: float(v) for k, v in metrics.items()}, checkpoint=checkpoint)


@contextmanager
def checkpoint_dir() -> Iterator[Path]:
    """A temporary directory to write a checkpoint into before ``report`` (Ray copies it to storage)."""
    with tempfile.TemporaryDirectory(prefix="orrery-ckpt-") as d:
        yield Path(d)


@contextmanager
def latest_checkpoint() -> Iterator[Path | None]:
    """The checkpoint to resume from (the last one reported by this run, or by an earlier run of the same name)."""
    ckpt = ray.train.get_checkpoint()
    if ckpt is None:
        yield None
        return
    with ckpt.as_directory() as d:
        yield Path(d)
