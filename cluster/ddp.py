"""Inside a Ray Train ``train_fn``: this worker's rank and device, DDP wrapping, collectives, reports, checkpoints.

    from cluster import ddp
    ddp.set_threads(n); device = ddp.device(); model = ddp.wrap_ddp(model)
    ddp.all_reduce_mean_([stats]); ddp.report(metrics, checkpoint_dir=d)

``local_session(dir)`` runs the same ``train_fn`` code as rank 0 of 1 in this process, with no Ray: reports keep the
latest checkpoint under ``dir`` and ``latest_checkpoint`` resumes from it (a study unit runs a learner this way, so
what a study measures is the loop a cluster job runs).
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


START_FROM: str | None = None  # set by cluster.train.fit: a checkpoint to start from when the run has none (PBT)
_LOCAL: Path | None = None  # the checkpoint folder of a ``local_session``; None inside Ray Train


@contextmanager
def local_session(checkpoints: str | Path) -> Iterator[None]:
    """Run ``train_fn`` code in this process as rank 0 of 1 (no Ray): ``report`` keeps the newest checkpoint in
    ``checkpoints/latest`` (replaced whole, so a kill mid-write leaves the previous one) and ``latest_checkpoint``
    yields it, so a second session on the same folder resumes."""
    global _LOCAL
    if _LOCAL is not None:
        raise RuntimeError(f"a local session is already open on {_LOCAL}")
    _LOCAL = Path(checkpoints)
    _LOCAL.mkdir(parents=True, exist_ok=True)
    try:
        yield
    finally:
        _LOCAL = None


def rank() -> int:
    return 0 if _LOCAL is not None else ray.train.get_context().get_world_rank()


def world_size() -> int:
    return 1 if _LOCAL is not None else ray.train.get_context().get_world_size()


def device():
    """The device Ray gave this worker: its GPU when one is assigned and CUDA works, else the CPU (logical GPUs of a
    CPU-only rehearsal cluster included). A local session computes on the CPU."""
    import torch
    if _LOCAL is not None:
        return torch.device("cpu")
    from cluster.devices import pick_device
    return pick_device(ray.get_gpu_ids(), ray_device=lambda: ray.train.torch.get_device())


def collective_device():
    """Where collectives' tensors must live: the GPU under NCCL (which refuses CPU tensors), else the CPU."""
    import torch
    import torch.distributed as dist
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


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
    param = next(module.parameters(), None)
    on_cuda = param is not None and param.device.type == "cuda"
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=[param.device.index] if on_cuda else None)


def quiet_logs() -> None:
    """Ray Train logs every report at INFO; a learner reporting each round would drown its own progress lines."""
    for name in ("ray.train", "ray.train.v2"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _on_collective_device(tensors, op, target=None) -> None:
    """Run ``op(tensor)`` on a copy on the process group's device (a CPU tensor under NCCL goes to the GPU and back),
    writing the result back in place, so callers keep their tensors where they are."""
    target = collective_device() if target is None else target
    for t in tensors:
        if t.device == target:
            op(t)
        else:
            moved = t.to(target)
            op(moved)
            t.copy_(moved.to(t.device))


def all_reduce_mean_(tensors) -> None:
    """Average tensors in place across workers (e.g. normalizer statistics, evaluation metrics)."""
    if world_size() == 1:
        return
    import torch.distributed as dist
    _on_collective_device(tensors, lambda t: dist.all_reduce(t, op=dist.ReduceOp.SUM))
    for t in tensors:
        t.div_(world_size())


def barrier() -> None:
    if world_size() > 1:
        import torch.distributed as dist
        dist.barrier()


def broadcast_(tensors, src: int = 0) -> None:
    if world_size() == 1:
        return
    import torch.distributed as dist
    _on_collective_device(tensors, lambda t: dist.broadcast(t, src=src))


def replica_divergence(*modules) -> float:
    """Largest parameter difference between this rank and rank 0 over ``modules`` (DDP-wrapped or not); 0.0 when the
    replicas are identical. A collective: every rank calls it at the same point."""
    import torch
    flat = torch.cat([p.detach().flatten().double().cpu() for m in modules
                      for p in getattr(m, "module", m).parameters()])
    ref = flat.clone()
    broadcast_([ref], src=0)
    diff = (flat - ref).abs().max().reshape(1)
    all_reduce_mean_([diff])  # a mean of non-negative numbers is 0 only when all are
    return float(diff.item()) * world_size()


def report(metrics: dict[str, Any], checkpoint_dir: str | Path | None = None) -> None:
    """Report metrics (every rank must call this equally often) and, with ``checkpoint_dir``, this rank's checkpoint
    shard: Ray Train merges every rank's directory into one checkpoint, so files must carry the rank in their name
    (``rank1.pt``) and each rank resumes from its own."""
    if _LOCAL is not None:
        if checkpoint_dir is not None:
            import shutil
            staged = _LOCAL / "latest.partial"
            shutil.rmtree(staged, ignore_errors=True)
            shutil.copytree(checkpoint_dir, staged)
            old = _LOCAL / "latest.old"
            shutil.rmtree(old, ignore_errors=True)
            if (_LOCAL / "latest").exists():
                (_LOCAL / "latest").rename(old)
            staged.rename(_LOCAL / "latest")
            shutil.rmtree(old, ignore_errors=True)
        return
    checkpoint = None
    if checkpoint_dir is not None:
        checkpoint = ray.train.Checkpoint.from_directory(str(checkpoint_dir))
    ray.train.report({k: float(v) for k, v in metrics.items()}, checkpoint=checkpoint)


@contextmanager
def checkpoint_dir() -> Iterator[Path]:
    """A temporary directory to write a checkpoint into before ``report`` (Ray copies it to storage)."""
    with tempfile.TemporaryDirectory(prefix="orrery-ckpt-") as d:
        yield Path(d)


@contextmanager
def latest_checkpoint() -> Iterator[Path | None]:
    """The checkpoint to resume from: the last one reported by this run (or by an earlier run of the same name), else
    the one a PBT exploit gave it to start from, else None."""
    if _LOCAL is not None:
        latest = _LOCAL / "latest" if (_LOCAL / "latest").is_dir() else _LOCAL / "latest.old"
        yield latest if latest.is_dir() else None
        return
    ckpt = ray.train.get_checkpoint()
    if ckpt is None:
        yield Path(START_FROM) if START_FROM else None
        return
    with ckpt.as_directory() as d:
        yield Path(d)
