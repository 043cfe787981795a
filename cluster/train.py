"""Ray Train (V2) for orrery's learners: one call on the driver, a few helpers inside the training function.

Driver side: ``fit(train_fn, loop_config, name=..., storage_path=..., train=TrainConfig)`` runs ``train_fn`` on
``train.num_workers`` processes (DDP over gloo on CPU, NCCL on GPU). Runs are named after the run directory, so
re-running a killed run with the same name restores the latest checkpoint (``cluster.ddp.latest_checkpoint()`` inside
``train_fn``). Inside a Tune trial the learner's reports are forwarded to Tune automatically.

Worker side (inside ``train_fn``): :mod:`cluster.ddp`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import ray
import ray.train
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    """How learners are placed by Ray Train (one process per worker, DDP across them)."""

    num_workers: int = 1
    use_gpu: bool = False
    cpus_per_worker: float = 0.5
    gpus_per_worker: float = 1.0
    backend: str | None = None  # None: gloo on CPU, cpu:gloo,cuda:nccl on GPUs

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"train.num_workers: must be >= 1, got {self.num_workers}")
        if self.cpus_per_worker <= 0:
            raise ValueError(f"train.cpus_per_worker: must be > 0 (fractions are fine), got {self.cpus_per_worker}")


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
        train: TrainConfig, max_failures: int = 0, num_to_keep: int = 2) -> ray.train.Result:
    """Run ``train_fn(loop_config)`` under a ``TorchTrainer``; raises with the worker's error if training fails."""
    resources = {"CPU": float(train.cpus_per_worker)}
    if train.use_gpu:
        resources["GPU"] = float(train.gpus_per_worker)
    # Mixed backend on GPUs: NCCL for CUDA tensors (DDP gradients), gloo for CPU ones (counters, stop flags).
    backend = train.backend or ("cpu:gloo,cuda:nccl" if train.use_gpu else "gloo")
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
