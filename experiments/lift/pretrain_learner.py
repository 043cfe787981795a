"""LIFT stage 1 learner: one Ray Train worker (rank) of the large-batch, high-UTD SAC pretraining.

One round (LIFT's training step, per rank):
    1. take the transitions of the round in flight (``steps_per_round`` vectorised steps of every env shard of this
       rank, acted by the policy version published before the previous updates) and immediately send the next
       round to the pool, so acting overlaps learning (``overlap=true``; the policy lag is reported);
    2. merge the new observations into the normalizer (all ranks pool their statistics: identical normalizers),
       append them to the replay ring and, in chunks, to Parquet (stage 2 trains the world model from it);
    3. ``steps_per_round * utd`` SAC updates (G per vectorised env step) at batch B; DDP all-reduces gradients;
    4. rank 0 publishes the new policy version to the pool; evaluation, metrics and checkpoints on schedule.

``train_fn`` runs the rounds (``run_rounds``) under Ray Train with the shared pool; ``run_one_rank`` runs the same
rounds in this process (``ddp.local_session``, ``cluster.local_pool``), paused and resumed at a deadline: the studies'
start models (``pretrain_local.LocalPretrain``, ``benchmarks/studies/lift_command/stage.py``) come from this loop.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from algos.lift.agent import SACAgent
from algos.lift.replay import ReplayBuffer, transition_fields
from algos.lift.sac import update
from cluster import ddp
from cluster.journal import Journal
from cluster.metrics import MetricsLogger, Progress, learner_tags
from cluster.store import ParquetStore
from envs.control.tasks import MUJOCO_TASKS
from experiments.lift.learner_common import (env_dims, evaluate_on_rank0, learner_device, load_checkpoint,
                                             param_divergence, publish, reportable, save_checkpoint, sync_normalizer)
from experiments.lift.pretrain_config import Config, rank_share, split
from experiments.registry import attach_pool

log = logging.getLogger(__name__)


def train_fn(config: dict) -> None:
    """Rounds of collect -> remember -> update -> publish until the env-step budget (or ``stop_return``)."""
    run_rounds(PretrainLearner(config))


def run_rounds(learner: "PretrainLearner", should_stop: Callable[[], bool] | None = None) -> bool:
    """The one pretraining loop. ``should_stop`` (a study's deadline) pauses it between rounds with a checkpoint that
    the next call resumes from; returns True once the budget is done (``agent.pt`` and ``policy.pt`` written)."""
    learner.start()
    while not learner.done:
        if should_stop is not None and should_stop():
            learner.pause()
            return False
        batch, lag = learner.take_round()  # 1.
        learner.remember(batch)  # 2.
        train_metrics = learner.update()  # 3.
        learner.publish()  # 4.
        if not learner.exp.overlap and learner.round_fits(learner.counters["env_steps"]):
            learner.send_round()  # the next round acts with the policy just published
        learner.end_round(lag, train_metrics)
    learner.close()
    return True


def run_one_rank(config: dict, should_stop: Callable[[], bool] | None = None, pool: Any | None = None) -> bool:
    """``train_fn`` in this process as rank 0 of 1, without Ray: the pool's samplers run here (``LocalPool``, its
    env steps counted in this process's CPU time) and the checkpoint is kept in ``run_path/checkpoints`` (a second
    call resumes). Returns True when the budget is done; False when ``should_stop`` paused it."""
    from cluster.local_pool import LocalPool
    from experiments.registry import sampler_factories
    local = pool or LocalPool(sampler_factories())
    try:
        with ddp.local_session(Path(config["run_path"]) / "checkpoints"):
            return run_rounds(PretrainLearner(config, pool=SubmittingPool(local)), should_stop)
    finally:
        if pool is None:
            local.close()


class SubmittingPool:
    """``LocalPool`` with ``SharedPool.submit``: the map runs at once and its result waits (one process has nothing
    to overlap with, so the learner's one-round policy lag stays as on the cluster)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def submit(self, sampler: str, requests: list[dict], **kwargs: Any) -> "_Done":
        return _Done(self.pool.map(sampler, requests, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)


class _Done:
    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        return self.value


class PretrainLearner:
    """This rank's SAC agent (identical on every rank), replay ring, Parquet replay and env shards on the pool."""

    def __init__(self, config: dict, pool: Any | None = None) -> None:
        ddp.set_threads(config["torch_threads"])
        ddp.quiet_logs()
        self.exp = exp = Config(**config["experiment"])
        self.rank, world = ddp.rank(), ddp.world_size()
        self.sac_total = exp.sac_config()  # the run's global sizes
        self.sac = sac = rank_share(self.sac_total, world, self.rank)  # this rank's envs, replay and batch
        self.seed = seed = config["seed"]
        run_path = Path(config["run_path"])
        device = learner_device(exp.device)
        obs_dim, act_dim = env_dims(config["task"], config.get("change"))
        torch.manual_seed(seed)  # same initial weights and target critic on every rank
        self.agent = SACAgent(obs_dim, act_dim, sac, device=device)
        self.buffer = ReplayBuffer(sac.replay_capacity, transition_fields(obs_dim, act_dim), device=device)
        self.replay = ParquetStore(run_path / "data" / f"replay-rank{self.rank}")
        self.unsaved: list[dict[str, np.ndarray]] = []  # transitions not yet in a Parquet part
        self.metrics = (MetricsLogger(run_path, flush_every=20, gauges=learner_tags(config["run_id"], "lift"))
                        if self.rank == 0 else None)
        self.journal = Journal(run_path, [self.replay], metrics=self.metrics)
        self.sample_gen = torch.Generator(device=device).manual_seed(seed * 7 + self.rank)
        self.counters = {"env_steps": 0, "rounds": 0, "wall_s": 0.0, "resumed_from": -1}
        self.run_path = run_path
        self.resume()
        if exp.init_agent and self.counters["resumed_from"] < 0:
            self.start_from(exp.init_agent)
        self.agent.wrap(ddp.wrap_ddp)

        self.pool = pool if pool is not None else attach_pool(config["pool"], scope=config["run_id"])
        self.policy_key = f"{config['run_id']}/policy"
        self.shards = [self.rank * exp.num_shards + s for s in range(exp.num_shards)]
        self.env_configs = [self.shard_config(config, g) for g in self.shards]
        self.round_steps = self.sac_total.num_envs * exp.steps_per_round  # env steps of one round, all ranks
        self.progress = (Progress(f"lift_pretrain rank{self.rank}", exp.total_env_steps, "env steps",
                                  done=self.counters["env_steps"]) if self.rank == 0 else None)
        self.done = not self.round_fits(self.counters["env_steps"])

    def shard_config(self, config: dict, shard: int) -> dict[str, Any]:
        """The pool sampler config of one env shard (its share of this rank's envs, seeded by shard)."""
        task = config["task"]
        return {"task": task, "num_envs": split(self.sac.num_envs, self.exp.num_shards, shard % self.exp.num_shards),
                "seed": self.seed * 1000 + shard, "physics_state": self.exp.physics_state and task in MUJOCO_TASKS,
                "run": config["run_id"], "shard": shard, "change": config.get("change")}

    def resume(self) -> None:
        with ddp.latest_checkpoint() as ckpt:
            state = load_checkpoint(ckpt)
        if state is None:
            return
        self.agent.load_state_dict(state["agent"])
        self.buffer.load_state_dict(state["buffer"])
        self.counters = state["counters"]
        self.sample_gen.set_state(state["sample_gen"])
        self.counters["resumed_from"] = self.counters["env_steps"]
        removed = self.journal.rollback(state["journal"])
        log.info("rank %d resumed at %d env steps, %d updates, buffer %d (dropped %d Parquet parts written "
                 "after the checkpoint)", self.rank, self.counters["env_steps"], self.agent.num_updates,
                 len(self.buffer), removed)

    def start_from(self, path: str) -> None:
        """A fresh run's agent from a pretraining's agent file (every rank loads the same file, so DDP's replicas
        start identical); its update count carries on, the replay starts empty."""
        state = torch.load(path, weights_only=True, map_location=self.agent.device)
        try:
            self.agent.load_state_dict(state)
        except (ValueError, KeyError, RuntimeError) as err:
            raise ValueError(f"experiment.init_agent: {path} does not fit this run's agent ({err})") from None
        # an optimiser's state carries the learning rate it was saved with: this run's own rates apply
        for opt, lr in ((self.agent.actor_opt, self.sac.actor_lr), (self.agent.critic_opt, self.sac.critic_lr),
                        (self.agent.alpha_opt, self.sac.alpha_lr)):
            for group in opt.param_groups:
                group.update(lr=lr, weight_decay=self.sac.weight_decay)
        log.info("rank %d starts from %s (%d updates in it)", self.rank, path, self.agent.num_updates)

    def start(self) -> None:
        """Publish the starting policy and send the first round."""
        self.publish()
        self.send_round(first=True)
        steps = self.counters["env_steps"]
        self.last_eval = steps - self.exp.eval_every_steps if steps == 0 else steps  # a fresh run evaluates at once
        self.last_checkpoint_updates = self.agent.num_updates
        self.started = time.perf_counter() - self.counters["wall_s"]
        self.eval_return = float("nan")
        self.episode_returns: list[float] = []
        self.falls = 0

    def publish(self) -> None:
        publish(self.pool, self.policy_key, self.agent)

    def round_fits(self, steps: int) -> bool:
        """Whether one more round after ``steps`` env steps stays within the budget: a round that would cross it
        does not start, so a run ends at or below ``total_env_steps``."""
        return steps + self.round_steps <= self.exp.total_env_steps

    def send_round(self, first: bool = False) -> None:
        """Ask every shard of this rank for ``steps_per_round`` vectorised steps with the latest policy."""
        # one request per shard; shard g always goes to the same pool worker (its envs live there)
        requests = [{"steps": self.exp.steps_per_round,
                     **({"reset_seed": c["seed"] + self.counters["env_steps"]} if first else {})}
                    for c in self.env_configs]
        self.pending = [self.pool.submit("env", [r], config=c, weights=self.policy_key, affinity=[g])
                        for r, c, g in zip(requests, self.env_configs, self.shards)]

    def take_round(self) -> tuple[dict[str, np.ndarray], int]:
        """1. The round in flight, every shard's transitions in one batch, and its policy lag in updates."""
        results = [p.result()[0] for p in self.pending]
        if self.exp.overlap and self.round_fits(self.counters["env_steps"] + self.round_steps):
            self.send_round()  # acted by the policy of the previous round: learning overlaps acting
        batch = {k: np.concatenate([r["transitions"][k] for r in results]) for k in results[0]["transitions"]}
        lag = self.agent.num_updates - min(int(r["policy_updates"]) for r in results)
        for r in results:
            self.episode_returns.extend(r["episode_returns"].tolist())
            self.falls += int(r["terminations"])
        return batch, lag

    def remember(self, batch: dict[str, np.ndarray]) -> None:
        """2. Normalizer statistics (merged over ranks), replay ring, and Parquet once a chunk is full."""
        sync_normalizer(self.agent.obs_normalizer, batch["obs"])
        self.buffer.add({k: batch[k] for k in self.buffer.specs})
        self.unsaved.append(batch)
        if sum(len(b["reward"]) for b in self.unsaved) >= self.exp.parquet_chunk:
            self.save_replay()
        self.counters["env_steps"] += self.round_steps
        self.counters["rounds"] += 1

    def save_replay(self) -> None:
        if self.unsaved:
            self.replay.append({k: np.concatenate([b[k] for b in self.unsaved]) for k in self.unsaved[0]})
            self.unsaved = []

    def update(self) -> dict[str, float]:
        """3. ``steps_per_round`` x G SAC steps at batch B, once the replay holds ``min_replay_size`` transitions."""
        metrics: dict[str, float] = {}
        n_updates, started = 0, time.perf_counter()
        if len(self.buffer) >= self.sac.min_replay_size:
            for _ in range(self.exp.steps_per_round):
                metrics = update(self.agent, lambda n: self.buffer.sample(n, self.sample_gen), self.sac)
                n_updates += self.sac.utd
        return {"updates_per_s": n_updates / max(time.perf_counter() - started, 1e-9), **metrics}

    def end_round(self, lag: int, train_metrics: dict[str, float]) -> None:
        """Metrics of the round; evaluation, checkpoint and the stop decision on their schedules."""
        exp, steps = self.exp, self.counters["env_steps"]
        row = {"env_steps": steps, "updates": self.agent.num_updates, "buffer": len(self.buffer),
               "policy_lag_updates": lag, "wall_s": time.perf_counter() - self.started,
               "resumed_from": self.counters["resumed_from"], **train_metrics}
        if self.episode_returns:
            row["train_return"] = float(np.mean(self.episode_returns))
            row["falls"] = self.falls
            self.episode_returns, self.falls = [], 0
        if steps - self.last_eval >= exp.eval_every_steps or not self.round_fits(steps):
            self.last_eval = steps
            self.eval_return = evaluate_on_rank0(self.pool, self.policy_key,
                                                 {**self.env_configs[0], "shard": -1, "physics_state": False},
                                                 exp.eval_episodes, self.seed)
            row["eval_return"] = self.eval_return
        checkpoint_due = self.agent.num_updates - self.last_checkpoint_updates >= exp.checkpoint_every_updates
        self.done = not self.round_fits(steps) or (exp.stop_return is not None
                                                   and self.eval_return >= exp.stop_return)
        if checkpoint_due or self.done:
            self.save_replay()  # a checkpoint covers exactly the Parquet parts written so far
        if self.done:
            row["param_max_abs_diff"] = param_divergence(self.agent)
        if self.metrics is not None:
            self.metrics.log(steps, row)
            # the last round forces its line: a capped run ends below its total, which the throttle waits for
            self.progress.update(steps, force=self.done, eval_return=self.eval_return,
                                 updates=self.agent.num_updates)
        if checkpoint_due or self.done:
            self.checkpoint(row)
        elif self.counters["rounds"] % 10 == 0:
            ddp.report(reportable(row))

    def checkpoint(self, row: dict[str, Any]) -> None:
        self.counters["wall_s"] = time.perf_counter() - self.started
        self.last_checkpoint_updates = self.agent.num_updates
        state = {"agent": self.agent.state_dict(), "buffer": self.buffer.state_dict(), "counters": self.counters,
                 "sample_gen": self.sample_gen.get_state(), "journal": self.journal.parts()}
        with ddp.checkpoint_dir() as d:
            save_checkpoint(d, state, self.agent, row)

    def pause(self) -> None:
        """Stop between rounds with a checkpoint (the round in flight is dropped: its steps were never counted)."""
        for p in self.pending if self.exp.overlap else []:
            p.result()
        self.save_replay()
        self.checkpoint({"env_steps": self.counters["env_steps"], "updates": self.agent.num_updates})
        if self.metrics is not None:
            self.metrics.close()

    def close(self) -> None:
        """Wait for the round still in flight; rank 0 writes the final policy and agent (what stage 2-3 load)."""
        for p in self.pending if self.exp.overlap else []:
            p.result()
        if self.metrics is not None:
            self.metrics.close()
            torch.save(self.agent.policy_state(), self.run_path / "policy.pt")
            torch.save(self.agent.state_dict(), self.run_path / "agent.pt")
