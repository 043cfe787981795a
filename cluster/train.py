"""Ray Train (V2) for orrery's learners: one call on the driver, a few helpers inside the training function.

Driver side: ``fit(train_fn, loop_config, name=..., storage_path=..., train=TrainConfig)`` runs ``train_fn`` on
``train.num_workers`` processes (DDP over gloo on CPU, NCCL on GPU). Runs are named after the run directory, so
re-running a killed run with the same name restores the latest checkpoint (``latest_checkpoint()`` inside
``train_fn``). Inside a Tune trial the learner's reports are forwarded to Tune automatically.

Worker side (inside ``train_fn``): ``rank()``, ``world_size()``, ``device()``, ``wrap_ddp(module)``,
``all_reduce_mean_(tensors)``, ``report(metrics, checkpoint_dir)``, ``latest_checkpoint()``.
"""
from __future__ import annotations

import logging
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import ray
import ray.train
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

log = logging.getLogger(__name__)


def _in_tune_trial() -> bool:
    import warnings
    try:
        from ray import tune
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tune.get_context().get_trial_id() is not None
    except Exception:  # noqa: BLE001 - not inside Tune
        return False


def fit(train_fn: Callable[[dict], None], loop_config: dict[str, Any], *, name: str, storage_path: str | Path,
        train: Any, max_failures: int = 0, num_to_keep: int = 2) -> ray.train.Result:
    """Run ``train_fn(loop_config)`` under a ``TorchTrainer``; raises with the worker's error if training fails."""
    resources = {"CPU": float(train.cpus_per_worker)}
    if train.use_gpu:
        resources["GPU"] = float(train.gpus_per_worker)
    backend = train.backend or ("nccl" if train.use_gpu else "gloo")
    callbacks = []
    if _in_tune_trial():
        from ray.tune.integration.ray_train import TuneReportCallback
        callbacks.append(TuneReportCallback())
    trainer = TorchTrainer(
        train_fn,
        train_loop_config=loop_config,
        torch_config=TorchConfig(backend=backend),
        scaling_config=ScalingConfig(num_workers=train.num_workers, use_gpu=train.use_gpu,
                                     resources_per_worker=resources),
        run_config=RunConfig(name=name, storage_path=str(Path(storage_path).resolve()),
                             checkpoint_config=CheckpointConfig(num_to_keep=num_to_keep),
                             failure_config=FailureConfig(max_failures=max_failures), callbacks=callbacks),
    )
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    return result


# -- inside train_fn ----------------------------------------------------------------------------------------------

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
    """Average tensors in place across workers (e.g. normaliser statistics, evaluation metrics)."""
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
