"""The AttnRL learner under Ray Train: ``algos.attnrl.train.train`` from the SFT model on rank 0, every generation
call sampled on the pool (:mod:`experiments.attnrl.pool_generation`), the updates data-parallel over all ranks
(:mod:`experiments.attnrl.ranks`), greedy evaluation through the pool every ``eval_every_updates``, one metrics row
per update and a checkpoint every ``checkpoint_every_updates``.

Resume: a checkpoint holds the policy, the optimizer, the update and token counts and the parts of the run's stores
(metrics, the rollout log); the reference is the SFT model of the run. The training loop keeps the rest of its state
(off-policy pending batch, attention filter mean, adaptive batch size, RNGs) inside, so a resumed rank 0 runs it
again from the start on the logged rollouts (:mod:`experiments.attnrl.rollout_log`), skipping the updates, until it
reaches the checkpoint; there it loads the checkpoint's weights and optimizer and goes on live. Rows written after
the checkpoint are dropped (the journal), so a killed run ends with the same rows as an uninterrupted one.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path

import torch

from algos.attnrl.config import METHODS
from algos.attnrl.ppo import UpdateContext, stop_followers
from algos.attnrl.train import train
from cluster import ddp
from cluster.journal import Journal
from cluster.metrics import MetricsLogger, Progress, learner_tags
from cluster.pool_config import DEFAULT_GROUP, PoolConfig
from cluster.store import ParquetStore
from envs.reasoning.task import ReasoningTask
from experiments.attnrl.config import Config
from experiments.attnrl.learner_state import learner_state
from experiments.attnrl.pool_generation import PoolGenerator, RecordingTask
from experiments.attnrl.ranks import (DONE_FILE, STATE_FILE, Follower, load_policies, saved_state, update_context,
                                      write_rank_shard)
from experiments.attnrl.rollout_log import RolloutLog
from experiments.attnrl.weights import with_state
from experiments.registry import attach_pool, sampler_factories

log = logging.getLogger(__name__)


def train_fn(config: dict) -> None:
    ddp.set_threads(config["torch_threads"])
    ddp.quiet_logs()
    saved = saved_state(config["method"])
    if saved is not None and saved["done"]:
        ddp.report({"resumed_done": 1.0})
        return
    context = update_context(saved)
    if context.rank == 0:
        Learner(config, saved, context).run()
    else:
        Follower(config, saved, context).run()


def lm_workers(pool_cfg: dict) -> int:
    """Workers of the pool group the "lm" sampler runs in (its own group where the pool defines it)."""
    groups = PoolConfig(**pool_cfg).worker_groups()
    return groups.get(sampler_factories()["lm"][1], groups[DEFAULT_GROUP]).num_workers


class Learner:
    """Rank 0: one method's run on the pool, what ``train`` is given, and what happens after each update and at
    the end."""

    def __init__(self, config: dict, saved: dict | None, context: UpdateContext) -> None:
        self.exp = exp = Config(**config["experiment"])
        self.method, seed = config["method"], config["seed"]
        self.run_path = Path(config["run_path"])
        self.context, self.saved = context, saved
        self.policy, self.ref, sft_weights = load_policies(exp, config["sft_path"], saved, context)
        self.weights_fn = lambda policy: with_state(sft_weights, policy)  # same model, new version
        base_task = ReasoningTask(exp.task_config())
        self.task = RecordingTask(base_task, self.policy.codec.encode)
        self.rl_cfg = exp.rl_config(self.method, seed)
        run_id, pool_cfg = config["run_id"], config["pool"]
        self.metrics = MetricsLogger(self.run_path, flush_every=10, gauges=learner_tags(run_id, self.method))
        self.calls = ParquetStore(self.run_path / "data" / f"generation-{self.method}")
        rollout_log = RolloutLog(self.run_path / "data" / f"rollouts-{self.method}")
        self.journal = Journal(self.run_path, [self.calls, rollout_log.store], metrics=self.metrics)
        self.resume_at = 0
        if saved is not None:
            if Path(saved["run_path"]).resolve() != self.run_path.resolve():
                raise RuntimeError(f"the AttnRL learner resumes from checkpoints of its own run only (its rollout log "
                                   f"is in the run directory); this one is from {saved['run_path']} (a PBT donor?)")
            self.journal.rollback(saved["parts"])  # rows and rollouts of the abandoned attempt
            self.resume_at = saved["updates"]
        sampler_cfg = {"task": dataclasses.asdict(exp.task_config()), "seed": seed, "run": run_id,
                       "autocast_bf16": exp.autocast_bf16, "max_batch_size": exp.sampler_max_batch}
        self.generation = PoolGenerator(attach_pool(pool_cfg, scope=run_id), f"{run_id}/{self.method}/policy",
                                        self.policy, self.weights_fn, self.task,
                                        lm_workers(pool_cfg) * exp.requests_per_worker, sampler_config=sampler_cfg,
                                        log=rollout_log, replay=rollout_log.read() if self.resume_at else ())
        self.eval_set = base_task.evaluation_problems(exp.eval_problems_per_difficulty, exp.eval_seed)
        self.max_tokens = self.rl_cfg.max_response_tokens or base_task.max_response_chars()
        self.progress = Progress(f"attnrl {self.method}", self.rl_cfg.token_budget, "tokens")
        self.method_id = METHODS.index(self.method)
        self.t_start = time.perf_counter() - (saved["wall_s"] if saved is not None else 0.0)
        self.last_row: dict = {}

    @property
    def updates(self) -> int:
        return self.generation.updates

    def run(self) -> None:
        if self.saved is None:
            self.checkpoint({}, done=False)  # update 0: where a run killed before its first checkpoint restarts
        else:
            ddp.report({"update": float(self.resume_at)})
        if self.resume_at == 0:
            self.evaluate_start()
        out = train(self.method, self.policy, self.ref, self.task, self.rl_cfg, generate_fn=self.generation,
                    log_fn=self.after_update)
        if self.updates < self.resume_at:
            raise RuntimeError(f"resume: the replayed run ended after {self.updates} updates, before the "
                               f"checkpoint's {self.resume_at} (changed code or config?)")
        self.finish(out["generated_tokens"])

    def evaluate(self) -> dict:
        acc, by_d = self.generation.evaluate(self.eval_set, self.max_tokens)
        return {"eval_accuracy": acc, **{f"eval_acc_d{d}": a for d, a in by_d.items()}}

    def evaluate_start(self) -> None:
        self.last_row = {"method_id": self.method_id, "update": 0, "generated_tokens": 0, "policy_version": 0,
                         "wall_s": 0.0, **self.evaluate()}
        self.metrics.log(0, self.last_row)

    def after_update(self, m: dict) -> None:
        """``train``'s ``log_fn``, called right after each update: one metrics row, evaluation and checkpoint due."""
        self.generation.on_update()
        batch_stats = self.generation.batch_stats.pop(self.updates - 1, {})
        if self.updates <= self.resume_at:  # replayed: its row and checkpoint exist already
            if self.updates == self.resume_at:
                self.go_live(m)
            return
        row = {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        row |= {"method_id": self.method_id, "policy_version": self.updates, "batch_size": m.get("prompts"),
                "wall_s": time.perf_counter() - self.t_start, **batch_stats}
        if self.updates % self.exp.eval_every_updates == 0:
            row |= self.evaluate()
        self.metrics.log(self.updates, row)
        self.progress.update(m["generated_tokens"], update=self.updates, reward=m.get("mean_reward", float("nan")))
        self.last_row = row
        if self.updates % self.exp.checkpoint_every_updates == 0:
            self.checkpoint(row, done=False)
        else:
            ddp.report(reportable(row))

    def go_live(self, m: dict) -> None:
        """The replay reached the checkpoint: check that it arrived where the run was, load the weights."""
        saved = self.saved
        where = (self.generation.generated_tokens, len(self.generation.calls), self.generation.replaying)
        if where != (saved["generated_tokens"], saved["calls"], False):
            raise RuntimeError(f"resume: the replay reached update {self.updates} with (tokens, calls, replaying) "
                               f"{where}, the checkpoint has {(saved['generated_tokens'], saved['calls'], False)}")
        self.policy.model.load_state_dict(saved["weights"]["state_dict"])
        self.progress.resumed_at(saved["generated_tokens"])  # the rate and ETA of this attempt
        log.info("%s: replayed %d updates (%d generation calls), continuing live", self.method, self.updates,
                 saved["calls"])

    def finish(self, generated_tokens: int) -> None:
        """Evaluate the final weights unless the last update did, keep the generation calls and the policy."""
        stop_followers(self.context)
        if "eval_accuracy" not in self.last_row:
            self.last_row = {"method_id": self.method_id, "update": self.updates, "generated_tokens": generated_tokens,
                             "policy_version": self.updates, "wall_s": time.perf_counter() - self.t_start,
                             **self.evaluate()}
            self.metrics.log(self.updates, self.last_row)  # same step as the last update: a separate evaluation row
        calls = self.generation.calls
        self.calls.append({k: [c[k] for c in calls] for k in calls[0]} if calls else {"call": []})
        torch.save({"weights": self.weights_fn(self.policy), "updates": self.updates},
                   self.run_path / f"policy-{self.method}.pt")
        self.checkpoint(self.last_row, done=True)
        self.metrics.close()

    def state(self) -> dict:
        """The learner's state after ``self.updates`` updates (the rest is rebuilt by replaying the rollout log)."""
        return learner_state(self.weights_fn(self.policy) if self.updates else None, self.context.optimizer,
                             self.updates, len(self.generation.calls), self.generation.generated_tokens,
                             time.perf_counter() - self.t_start, self.journal.parts(), self.run_path)

    def checkpoint(self, row: dict, done: bool) -> None:
        with ddp.checkpoint_dir() as d:
            torch.save(self.state(), d / STATE_FILE)
            write_rank_shard(d, self.policy.model, self.updates, self.context)
            if done:
                (d / DONE_FILE).write_text("1")
            ddp.report(reportable(row), checkpoint_dir=d)


def reportable(row: dict) -> dict:
    return {k: float(v) for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}
