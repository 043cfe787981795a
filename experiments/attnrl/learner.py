"""The AttnRL learner, one Ray Train worker: ``algos.attnrl.train.train`` from the SFT model, with every generation
call sampled on the pool (:mod:`experiments.attnrl.pool_generation`), greedy evaluation through the pool every
``eval_every_updates``, one metrics row per update and a checkpoint every ``checkpoint_every_updates``.

``train`` keeps its optimizer, RNGs and pipeline state inside, so an unfinished method restarts from SFT (its
journal drops what the abandoned attempt wrote) and a finished one is not run again.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from pathlib import Path

import torch

from algos.attnrl.config import METHODS
from algos.attnrl.train import train
from cluster import ddp
from cluster.journal import Journal
from cluster.metrics import MetricsLogger, Progress
from cluster.store import ParquetStore
from envs.reasoning.task import ReasoningTask
from experiments.attnrl.config import Config
from experiments.attnrl.pool_generation import PoolGenerator, RecordingTask
from experiments.attnrl.sft_stage import load_sft
from experiments.attnrl.weights import build_policy, with_state
from experiments.registry import attach_pool

log = logging.getLogger(__name__)

STATE_FILE = "learner.pt"  # in every checkpoint: {"weights", "updates", "start_parts"}


def train_fn(config: dict) -> None:
    ddp.set_threads(config["torch_threads"])
    ddp.quiet_logs()
    if ddp.world_size() != 1:
        raise RuntimeError("the AttnRL learner runs on one Train worker")
    saved = saved_state(config["method"])
    if saved is not None and saved["done"]:
        ddp.report({"resumed_done": 1.0})
        return
    learner = Learner(config, saved)
    learner.evaluate_start()
    out = train(learner.method, learner.policy, learner.ref, learner.task, learner.rl_cfg,
                generate_fn=learner.generation, log_fn=learner.after_update)
    learner.finish(out["generated_tokens"])


def saved_state(method: str) -> dict | None:
    """The last checkpoint's learner state, ``done`` set when the method finished; None on a first attempt."""
    with ddp.latest_checkpoint() as ckpt:
        if ckpt is None:
            return None
        state = torch.load(ckpt / STATE_FILE, weights_only=True)
        state["done"] = (ckpt / "done").exists()
    if state["done"]:
        log.info("%s already finished in this run: nothing to do", method)
    else:
        log.warning("%s: unfinished attempt found; algos.attnrl.train.train cannot resume mid-run, restarting",
                    method)
    return state


class Learner:
    """One method's run on the pool: what ``train`` is given, and what happens after each update and at the end."""

    def __init__(self, config: dict, saved: dict | None) -> None:
        self.exp = exp = Config(**config["experiment"])
        self.method, seed = config["method"], config["seed"]
        self.run_path = Path(config["run_path"])
        sft_weights, _ = load_sft(config["sft_path"])
        self.policy = build_policy(sft_weights, exp.autocast_bf16)
        self.policy.model.to(ddp.device())
        self.ref = copy.deepcopy(self.policy)
        self.weights_fn = lambda policy: with_state(sft_weights, policy)  # same model, new version
        base_task = ReasoningTask(exp.task_config())
        self.task = RecordingTask(base_task, self.policy.codec.encode)
        self.rl_cfg = exp.rl_config(self.method, seed)
        pool_cfg = config["pool"]
        sampler_cfg = {"task": dataclasses.asdict(exp.task_config()), "seed": seed, "run": config["run_id"],
                       "autocast_bf16": exp.autocast_bf16, "max_batch_size": exp.sampler_max_batch}
        self.generation = PoolGenerator(attach_pool(pool_cfg), f"{config['run_id']}/{self.method}/policy",
                                        self.policy, self.weights_fn, self.task,
                                        int(pool_cfg["num_workers"]) * exp.requests_per_worker,
                                        sampler_config=sampler_cfg)
        self.eval_set = base_task.evaluation_problems(exp.eval_problems_per_difficulty, exp.eval_seed)
        self.max_tokens = self.rl_cfg.max_response_tokens or base_task.max_response_chars()
        self.metrics = MetricsLogger(self.run_path, flush_every=10)
        self.calls = ParquetStore(self.run_path / "data" / f"generation-{self.method}")
        self.journal = Journal(self.run_path, [self.calls], metrics=self.metrics)
        if saved is not None:
            self.journal.rollback(saved["start_parts"])  # rows of the abandoned attempt
        self.start_parts = self.journal.parts()
        self.progress = Progress(f"attnrl {self.method}", self.rl_cfg.token_budget, "tokens")
        self.method_id = METHODS.index(self.method)
        self.t_start = time.perf_counter()
        self.last_row: dict = {}

    @property
    def updates(self) -> int:
        return self.generation.updates

    def evaluate(self) -> dict:
        acc, by_d = self.generation.evaluate(self.eval_set, self.max_tokens)
        return {"eval_accuracy": acc, **{f"eval_acc_d{d}": a for d, a in by_d.items()}}

    def evaluate_start(self) -> None:
        self.last_row = {"method_id": self.method_id, "update": 0, "generated_tokens": 0, "policy_version": 0,
                         "wall_s": 0.0, **self.evaluate()}
        self.metrics.log(0, self.last_row)

    def after_update(self, m: dict) -> None:
        """``train``'s ``log_fn``, called right after each update: one metrics row, evaluation and checkpoint due."""
        self.generation.updates += 1
        row = {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        row |= {"method_id": self.method_id, "policy_version": self.updates, "batch_size": m.get("prompts"),
                "wall_s": time.perf_counter() - self.t_start,
                **self.generation.batch_stats.pop(self.updates - 1, {})}
        if self.updates % self.exp.eval_every_updates == 0:
            row |= self.evaluate()
        self.metrics.log(self.updates, row)
        self.progress.update(m["generated_tokens"], update=self.updates, reward=m.get("mean_reward", float("nan")))
        self.last_row = row
        if self.updates % self.exp.checkpoint_every_updates == 0:
            self.checkpoint(row, done=False)
        else:
            ddp.report(reportable(row))

    def finish(self, generated_tokens: int) -> None:
        """Evaluate the final weights unless the last update did, keep the generation calls and the policy."""
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
        return {"weights": self.weights_fn(self.policy), "updates": self.updates, "start_parts": self.start_parts}

    def checkpoint(self, row: dict, done: bool) -> None:
        with ddp.checkpoint_dir() as d:
            torch.save(self.state(), d / STATE_FILE)
            if done:
                (d / "done").write_text("1")
            self.metrics.flush()
            ddp.report(reportable(row), checkpoint_dir=d)


def reportable(row: dict) -> dict:
    return {k: float(v) for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}
