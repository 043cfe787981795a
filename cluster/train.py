"""Ray Train (V2) for orrery's learners: one call on the driver, a few helpers inside the training function.

Driver side: ``fit(train_fn, loop_config, name=..., storage_path=..., train=TrainConfig)`` runs ``train_fn`` on
``train.num_workers`` processes (DDP over gloo on CPU, NCCL on GPU). Runs are named after the run directory, so
re-running a killed run with the same name restores the latest checkpoint (``cluster.ddp.latest_checkpoint()`` inside
``train_fn``); a run with no checkpoint of its own starts from ``<storage>/<name>.init`` when a PBT exploit put a donor's
there. Inside a sweep trial every report and checkpoint is forwarded to Tune (``cluster.tune_trial``).

Worker side (inside ``train_fn``): :mod:`cluster.ddp`.
"""
from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import ray
import ray.train
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

log = logging.getLogger(__name__)

REPORT_POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"  # Ray Train's name for the controller's poll interval
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"


@dataclass
class TrainConfig:
    """How learners are placed by Ray Train (one process per worker, DDP across them)."""

    num_workers: int = 1
    use_gpu: bool = False
    cpus_per_worker: float = 0.5
    gpus_per_worker: float = 1.0
    backend: str | None = None  # None: gloo on CPU, cpu:gloo,cuda:nccl on GPUs
    # How long a collective (a barrier included) waits for the slowest rank before failing the run: ranks wait at a
    # barrier while rank 0 alone does a long step (LIFT's stage-2 world-model fit, a first pool attach). Ray's default
    # is 1800 s; scale=paper sets hours.
    collective_timeout_s: int = 1800
    # Stage 0 of a method (VIDD's denoiser pretraining, AttnRL's SFT) as a Ray task on one learner's resources
    # (gpus_per_worker GPUs, cpus_per_worker CPUs) instead of in the driver's process (the head: no GPU, one thread).
    stage0_on_worker: bool = False
    # How often the Train controller collects the ranks' reports. A rank's report waits until the controller has
    # taken its previous one (Ray keeps one per rank), so at Ray's default of 2 s a learner that reports every update
    # runs at most one update per 2 s, and every fit ends up to 2 s late. Each poll is one actor call per rank.
    report_poll_s: float = 0.2
    # Ray Train's preemption watcher: one more actor per learner, reading the nodes' preemption notices so that a
    # learner on a preempted spot node fails with that reason. Nothing preempts a laptop's or an owned cluster's
    # nodes, and on two cores each such process costs the learners CPU; scale=paper turns it on.
    preemption_watcher: bool = False

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"train.num_workers: must be >= 1, got {self.num_workers}")
        if self.cpus_per_worker <= 0:
            raise ValueError(f"train.cpus_per_worker: must be > 0 (fractions are fine), got {self.cpus_per_worker}")
        if not 0 < self.report_poll_s <= 60:
            raise ValueError(f"train.report_poll_s: must be in (0, 60] seconds, got {self.report_poll_s}")
        if self.collective_timeout_s < 1:
            raise ValueError(f"train.collective_timeout_s: must be >= 1, got {self.collective_timeout_s}")


def torch_config(train: TrainConfig) -> TorchConfig:
    """The process group of the learners: NCCL for CUDA tensors (DDP gradients) and gloo for CPU ones (counters, stop
    flags) on GPUs, gloo on CPUs; collectives wait ``train.collective_timeout_s`` for the slowest rank."""
    backend = train.backend or ("cpu:gloo,cuda:nccl" if train.use_gpu else "gloo")
    return TorchConfig(backend=backend, timeout_s=int(train.collective_timeout_s))


def stage0_options(train: TrainConfig) -> dict[str, Any] | None:
    """The Ray task options stage 0 runs with (``train.stage0_on_worker``), or None: in the driver's process."""
    if not train.stage0_on_worker:
        return None
    options: dict[str, Any] = {"num_cpus": float(train.cpus_per_worker), "max_retries": 0}
    if train.use_gpu:
        options["num_gpus"] = float(train.gpus_per_worker)
    return options


def _stage0_task(fn: Callable[..., Any], threads: int, args: tuple, kwargs: dict) -> tuple[str, Any]:
    """(the device this task computes on, as it sees it; ``fn``'s result)."""
    import torch

    from cluster.devices import assigned_device
    torch.set_num_threads(threads)  # Ray sets OMP_NUM_THREADS from the task's CPUs; torch follows explicitly
    return str(assigned_device()), fn(*args, **kwargs)


def stage0(fn: Callable[..., Any], *args: Any, train: TrainConfig, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` where stage 0 belongs: a Ray task on a learner's GPU and CPUs at ``scale=paper``
    (``fn`` picks ``cluster.devices.assigned_device()``, the task's GPU), in this process on CPU scales. Its result
    comes back through the object store (keep it to CPU tensors and paths)."""
    options = stage0_options(train)
    if options is None:
        return fn(*args, **kwargs)
    threads = max(1, int(options["num_cpus"]))
    name = getattr(fn, "__name__", fn)
    log.info("stage 0 (%s) as a Ray task with %s", name, options)
    device, result = ray.get(ray.remote(**options)(_stage0_task).remote(fn, threads, args, kwargs))
    # the device as the task found it (benchmarks/gpu_check.py asserts it is the GPU): asking for a GPU is not
    # the same as computing on one
    log.info("stage 0 (%s) ran on %s (reported by the task)", name, device)
    return result


def _run_from(train_fn: Callable[[dict], None], start_from: str | None, config: dict) -> None:
    """On each Train worker: the checkpoint to start from when this run has none of its own (a PBT donor's)."""
    import torch.distributed as dist

    from cluster import ddp
    _quiet_report_log()
    if dist.is_initialized():  # what the group really is (benchmarks/gpu_check.py asserts NCCL where asked for)
        log.info("learner rank %d of %d: process group backend %s", dist.get_rank(), dist.get_world_size(),
                 dist.get_backend())
    ddp.START_FROM = start_from
    train_fn(config)


def _quiet_report_log() -> None:
    """Ray Train logs every report's full metrics at INFO from each worker (forwarded to the driver): a wall of text
    around the learners' own progress lines. Those reports still reach the metrics files and the dashboard."""
    try:
        from ray.train.v2._internal.execution import context
    except ImportError:  # another Ray layout: its logging is left as it is
        return
    logging.getLogger(context.__file__).setLevel(logging.WARNING)  # that module names its logger by its file


class _Trainer(TorchTrainer):
    """A ``TorchTrainer`` without Ray Data's shard server when the run has no Ray Dataset. Ray Train starts a
    ``DatasetManager`` actor for every run, datasets or not: a process that imports Ray Data (~1.4 CPU-s), on every
    fit and every restart. orrery's learners read their own Parquet and pass no datasets, and a worker given no shard
    provider is what Ray Train itself builds in that case (``dataset_shard_provider`` is optional)."""

    def _create_default_callbacks(self) -> list:
        callbacks = super()._create_default_callbacks()
        if self.datasets:
            return callbacks
        try:
            from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
        except ImportError:  # another Ray layout: keep its callbacks as they are
            return callbacks
        return [cb for cb in callbacks if not isinstance(cb, DatasetsCallback)]


def fit(train_fn: Callable[[dict], None], loop_config: dict[str, Any], *, name: str, storage_path: str | Path,
        train: TrainConfig, max_failures: int = 0, num_to_keep: int = 2) -> ray.train.Result:
    """Run ``train_fn(loop_config)`` under a ``TorchTrainer``; raises with the worker's error if training fails."""
    from cluster import tune_trial
    resources = {"CPU": float(train.cpus_per_worker)}
    if train.use_gpu:
        resources["GPU"] = float(train.gpus_per_worker)
    callbacks = []
    if tune_trial.relay() is not None:  # inside a sweep trial: every report (and checkpoint) goes to Tune
        callbacks.append(tune_trial.LearnerReports(tune_trial.relay(), name))
    init = tune_trial.init_checkpoint_dir(storage_path, name)
    train_fn = functools.partial(_run_from, train_fn, str(init.resolve()) if init.is_dir() else None)
    # Ray Train hands these variables from the driver to its controller when the run starts
    os.environ[REPORT_POLL_ENV] = str(float(train.report_poll_s))
    os.environ[PREEMPTION_WATCHER_ENV] = "1" if train.preemption_watcher else "0"
    trainer = _Trainer(
        train_fn,
        train_loop_config=loop_config,
        torch_config=torch_config(train),
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
