"""One fine-tuning method's learner, a Ray Train ``train_fn`` (DDP over gloo on CPU, NCCL on GPUs).

Every iteration: publish the weights, collect this rank's share of the batch and of the remaining budget through the
pool, update (gradients all-reduced), count the queries of all ranks, evaluate on schedule, checkpoint. The pool holds
three weight roles: "pretrained" (p_pre), "teacher" (p_out) and "student" (p_theta). The models live on the device Ray
gave this worker (``cluster.ddp.device()``: its GPU, else the CPU); batches from the pool are moved there.

    train_fn(config)   config: experiment (Config fields), pool, run_path, run_id, method, seed, torch_threads,
                       pretrained_path, sampler_config
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from algos.vidd import ddpo
from algos.vidd.config import METHODS, X0_METHODS, VIDDConfig
from algos.vidd.finetune import frozen_copy
from algos.vidd.vidd import refresh_due, refresh_teacher, rollin_with_teacher, vidd_update
from algos.vidd.x0_losses import x0_update
from cluster import ddp
from cluster.journal import Journal
from cluster.metrics import MetricsLogger, Progress, learner_tags
from cluster.pool import SharedPool
from cluster.store import ParquetStore
from experiments.registry import attach_pool
from experiments.vidd.config import Config
from experiments.vidd.data import build_model, load_bundle
from experiments.vidd.metrics import task_metrics, write_samples
from experiments.vidd.sampler_requests import (
    ddpo_trajectories,
    evaluate_through_pool,
    queries_of,
    split_requests,
    sum_info,
    vidd_transitions,
    x0_transitions,
)

log = logging.getLogger(__name__)


@dataclass
class Learner:
    """What one rank holds between iterations."""

    exp: Config
    cfg: VIDDConfig  # the method's settings (exp.for_method(method))
    method: str
    seed: int
    rank: int
    world: int
    run_path: Path
    bundle: dict  # the pretrained model (experiments.vidd.data)
    pre: nn.Module
    student: nn.Module
    teacher: nn.Module
    model: nn.Module  # the student, DDP-wrapped when there are several ranks
    optimizer: torch.optim.Optimizer
    counters: dict
    pool: SharedPool
    weights_key: str
    sampler_config: dict
    n_requests: int
    samples: ParquetStore  # evaluation samples (written by rank 0)
    metrics_log: MetricsLogger | None  # rank 0 only
    progress: Progress | None  # rank 0 only
    journal: Journal
    device: torch.device
    t_start: float = 0.0
    task_metrics: Callable | None = None  # DNA: held-out oracle and 3-mer correlation (built at the first evaluation)

    @property
    def method_id(self) -> int:
        return METHODS.index(self.method)

    def finished(self) -> bool:
        """Out of iterations, or of budget: every rank needs one query (DDPO: one sample; RW_MLE: one final sample)
        or two (VIDD, DDPP: one value pair) to make an iteration."""
        remaining = self.exp.query_budget - self.counters["queries"]
        return (self.counters["iteration"] >= self.exp.max_iterations
                or remaining < (1 if self.method in ("ddpo", "rw_mle") else 2) * self.world)


def train_fn(config: dict) -> None:
    ddp.set_threads(config["torch_threads"])
    ddp.quiet_logs()
    learner = setup(config)
    resume(learner)
    while not learner.finished():
        it = learner.counters["iteration"] = learner.counters["iteration"] + 1
        publish(learner)
        row = {"method_id": float(learner.method_id), "iteration": it}
        results = step_of(learner.method, learner.cfg)(learner, it, row)
        count_queries(learner, results, row)
        last = learner.finished()
        if evaluation_due(learner.exp, it, last):
            publish(learner)  # the student after this update
            if learner.rank == 0:
                evaluate(learner, it, row)
        record(learner, it, row, last)
        checkpoint(learner, row)
    finish(learner)


def step_of(method: str, cfg: VIDDConfig) -> Callable[[Learner, int, dict], list[dict]]:
    """The iteration ``method`` runs: DDPO's, the final-sample losses' (DDPP, RW_MLE, ``distill_target=final_sample``)
    or eq. 7's."""
    if method == "ddpo":
        return ddpo_step
    return x0_step if method in X0_METHODS or cfg.distill_target == "final_sample" else vidd_step


def evaluation_due(exp: Config, it: int, last: bool) -> bool:
    """Evaluate after the last iteration and every ``eval_every`` iterations (0: only at the end)."""
    return last or bool(exp.eval_every and it % exp.eval_every == 0)


def make_optimizer(student: nn.Module, cfg: VIDDConfig) -> torch.optim.Optimizer:
    """Adam at the method's lr (DDPO: ``ddpo_lr``) and ``adam_eps`` (the official code: torch's defaults)."""
    return torch.optim.Adam(student.parameters(), lr=cfg.lr, eps=cfg.adam_eps)


# ------------------------------------------------------------------------------------------ setup and resume

def setup(config: dict) -> Learner:
    exp = Config(**config["experiment"])
    method = config["method"]
    cfg = exp.for_method(method)
    rank, world = ddp.rank(), ddp.world_size()
    run_path = Path(config["run_path"])
    device = ddp.device()
    bundle = load_bundle(config["pretrained_path"])
    pre = frozen_copy(build_model(bundle).to(device))
    student = build_model(bundle).to(device).train()
    teacher = frozen_copy(pre)  # p_out (VIDD); DDPO samples from the student itself
    model = ddp.wrap_ddp(student)
    model.mask_id, model.seq_len = student.mask_id, student.seq_len  # algos read these off the module
    samples = ParquetStore(run_path / "data" / "samples")
    metrics_log = (MetricsLogger(run_path, flush_every=1_000_000, gauges=learner_tags(config["run_id"], method))
                   if rank == 0 else None)
    return Learner(
        exp=exp, cfg=cfg, method=method, seed=config["seed"], rank=rank, world=world, run_path=run_path,
        bundle=bundle, pre=pre, student=student, teacher=teacher, model=model,
        optimizer=make_optimizer(student, cfg),
        counters={"iteration": 0, "queries": 0, "eval_queries": 0, "wall_s": 0.0},
        pool=attach_pool(config["pool"], scope=config["run_id"]), weights_key=f"{config['run_id']}/{method}",
        sampler_config=config["sampler_config"], n_requests=max(1, config["pool"]["num_workers"]), samples=samples,
        metrics_log=metrics_log,
        progress=Progress(f"vidd {method}", exp.query_budget, "queries") if rank == 0 else None,
        # rank 0 writes the samples and the metrics; a resume cuts both back to the checkpoint
        journal=Journal(run_path, [samples] if rank == 0 else [], metrics=metrics_log), device=device)


def resume(learner: Learner) -> None:
    with ddp.latest_checkpoint() as ckpt:
        if ckpt is not None:
            state = torch.load(ckpt / "learner.pt", weights_only=True, map_location=learner.device)
            learner.student.load_state_dict(state["student"])
            learner.teacher.load_state_dict(state["teacher"])
            learner.optimizer.load_state_dict(state["optimizer"])
            learner.counters = state["counters"]
            # cut what was written after the checkpoint; a finished learner wrote nothing after its last one, and
            # the methods that ran after it share its stores: their rows must stay
            if not learner.finished():
                learner.journal.rollback(state["parts"])
            log.info("%s resumed at iteration %d, %d queries", learner.method, learner.counters["iteration"],
                     learner.counters["queries"])
            if learner.progress is not None:  # the rate and ETA of this attempt
                learner.progress.resumed_at(learner.counters["queries"])
    learner.t_start = time.perf_counter() - learner.counters["wall_s"]


# ------------------------------------------------------------------------------------------ one iteration

def publish(learner: Learner) -> None:
    """The three roles' current weights to the pool (rank 0), then every rank waits for them."""
    if learner.rank == 0:
        cpu = lambda m: {k: v.detach().cpu() for k, v in m.state_dict().items()}  # noqa: E731
        learner.pool.publish(learner.weights_key, {"pretrained": learner.bundle["state_dict"],
                                                   "teacher": cpu(learner.teacher), "student": cpu(learner.student)})
    ddp.barrier()


def rank_seed(learner: Learner, it: int) -> int:
    """Distinct per (seed, method, iteration, rank): the seed of this rank's pool requests and updates."""
    return learner.seed * 1_000_003 + learner.method_id * 100_019 + it * 1009 + learner.rank * 101


def rank_share(learner: Learner) -> tuple[int, int]:
    """This rank's trajectories per iteration and its share of the remaining budget."""
    exp, world = learner.exp, learner.world
    share = split_requests(exp.batch_size, world)[learner.rank] if exp.batch_size >= world else 1
    return share, (exp.query_budget - learner.counters["queries"]) // world


def ddpo_step(learner: Learner, it: int, row: dict) -> list[dict]:
    """Trajectories of the current student scored in the pool, then PPO-clip updates (algos.vidd.ddpo)."""
    share, budget = rank_share(learner)
    seed = rank_seed(learner, it)
    learner.student.train()
    states, rewards, results = ddpo_trajectories(learner.pool, learner.sampler_config, learner.weights_key,
                                                 int(min(share, budget)), seed, learner.n_requests)
    # the official variant's theta_old rides in the (checkpointed) teacher, which DDPO has no other use for
    old = ddpo.previous_iterate(learner.teacher, learner.student) if learner.cfg.ddpo_variant == "official" else None
    metrics = ddpo.ddpo_update(learner.model, learner.optimizer, states, ddpo.normalized_advantages(rewards),
                               learner.cfg, torch.Generator().manual_seed(seed), old)
    finite = rewards[torch.isfinite(rewards)]
    row.update(metrics, train_reward_mean=float(finite.mean()) if len(finite) else float("nan"),
               trajectories=float(len(rewards)))
    return results


def vidd_step(learner: Learner, it: int, row: dict) -> list[dict]:
    """Alg. 1 lines 4-10: roll-in, roll-out and values in the pool; distillation here; the lazy teacher refresh."""
    share, budget = rank_share(learner)
    coin = torch.Generator().manual_seed(learner.seed * 100_003 + it)  # the same roll-in coin on every rank
    with_teacher = rollin_with_teacher(learner.cfg.beta, coin)
    learner.student.train()
    batch, results = vidd_transitions(learner.pool, learner.sampler_config, learner.weights_key, learner.cfg, share,
                                      budget, rank_seed(learner, it), learner.n_requests, with_teacher)
    metrics = vidd_update(learner.model, learner.optimizer, batch.to(learner.device), learner.cfg)
    refreshed = refresh_due(learner.cfg, it)
    if refreshed:
        refresh_teacher(learner.teacher, learner.student)
    row.update({k: v for k, v in metrics.items() if math.isfinite(v)}, rollin_from_teacher=float(with_teacher),
               teacher_refreshed=float(refreshed), transitions=float(batch.changed.sum()),
               trajectories=float(share))
    return results


def x0_step(learner: Learner, it: int, row: dict) -> list[dict]:
    """DDPP, RW_MLE and the released VIDD variant: roll-in, final samples and values in the pool; the loss on
    log p_theta(x0 | x_t) here (algos.vidd.x0_losses); the teacher refresh (DDPP: every iteration, on-policy)."""
    share, budget = rank_share(learner)
    coin = torch.Generator().manual_seed(learner.seed * 100_003 + it)
    with_teacher = rollin_with_teacher(learner.cfg.beta, coin)
    learner.student.train()
    batch, results = x0_transitions(learner.pool, learner.sampler_config, learner.weights_key, learner.cfg,
                                    learner.method, share, budget, rank_seed(learner, it), learner.n_requests,
                                    with_teacher)
    metrics = x0_update(learner.model, learner.optimizer, batch.to(learner.device), learner.cfg,
                        learner.pre if learner.method == "ddpp" else None)
    refreshed = refresh_due(learner.cfg, it)
    if refreshed:
        refresh_teacher(learner.teacher, learner.student)
    row.update({k: v for k, v in metrics.items() if math.isfinite(v)}, rollin_from_teacher=float(with_teacher),
               teacher_refreshed=float(refreshed), transitions=float(batch.valid.sum()), trajectories=float(share))
    return results


def count_queries(learner: Learner, results: list[dict], row: dict) -> None:
    """All ranks' oracle queries (and the oracle's counts) of this iteration."""
    def all_sum(value: float) -> float:
        t = torch.tensor([float(value)], dtype=torch.float64)
        ddp.all_reduce_mean_([t])
        return float(t.item()) * learner.world

    learner.counters["queries"] += int(all_sum(queries_of(results)))
    row.update(queries=learner.counters["queries"],
               **{f"train_{k}": all_sum(v) for k, v in sorted(sum_info(results).items())})


def evaluate(learner: Learner, it: int, row: dict) -> None:
    """Rank 0: fresh samples of the student scored in the pool; metrics into ``row``, samples into the store."""
    exp = learner.exp
    if learner.task_metrics is None and exp.task == "dna":
        learner.task_metrics = task_metrics(exp, learner.seed)
    metrics, columns = evaluate_through_pool(learner.pool, learner.sampler_config, learner.weights_key, "student",
                                             exp.eval_samples, learner.seed + 17, learner.n_requests, exp.task,
                                             learner.pre, exp.nll_time_samples, learner.task_metrics,
                                             model=learner.student)
    learner.counters["eval_queries"] += int(metrics["eval_queries"])
    row.update(metrics)
    write_samples(learner.samples, columns, learner.method, it, learner.counters["queries"], learner.seed)


def record(learner: Learner, it: int, row: dict, last: bool) -> None:
    """Wall time and evaluation totals into ``row``; rank 0 logs it and shows progress."""
    learner.counters["wall_s"] = time.perf_counter() - learner.t_start
    row.update(wall_s=learner.counters["wall_s"], eval_queries_total=learner.counters["eval_queries"])
    if last:  # a collective on every rank: the DDP replicas must end identical
        row["param_max_abs_diff"] = ddp.replica_divergence(learner.student)
    if learner.metrics_log is not None:
        learner.metrics_log.log(it, row)
        learner.progress.update(learner.counters["queries"], force=last, iteration=it,
                                **({"median": row["reward_median"]} if "reward_median" in row else {}))


def checkpoint(learner: Learner, row: dict) -> None:
    """Rank 0 saves the models, the optimizer, the counters and the stores' parts; every rank reports ``row``."""
    with ddp.checkpoint_dir() as d:
        if learner.rank == 0:
            torch.save({"student": learner.student.state_dict(), "teacher": learner.teacher.state_dict(),
                        "optimizer": learner.optimizer.state_dict(), "counters": learner.counters,
                        "parts": learner.journal.parts()}, d / "learner.pt")
        ddp.report({k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and math.isfinite(float(v))},
                   checkpoint_dir=d)


def finish(learner: Learner) -> None:
    """Rank 0: the last metrics to Parquet, the fine-tuned student to run_dir/finetuned-<method>.pt."""
    if learner.metrics_log is not None:
        learner.metrics_log.close()
        torch.save(learner.student.state_dict(), learner.run_path / f"finetuned-{learner.method}.pt")
