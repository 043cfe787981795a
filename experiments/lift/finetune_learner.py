"""LIFT stage 3 learner: one Ray Train worker (rank) finetuning the pretrained SAC agent in the changed env.

Before the first epoch: stage 2 (the world model fitted on the pretraining replay, cached under run_dir/wm/), the
zero-shot point of the curve and a deterministic prefill of the real buffer. Per epoch e, in the order of LIFT's
``finetune_wm_ac.py`` (``lift`` and ``mbpo_wm``; ``sac_finetune`` replaces 1-3 by plain SAC on real data):
    1. retrain the world model on all real data of the changed env (early stopping, warm start);
    2. collect ``real_steps_per_epoch`` real steps through the pool with the deterministic policy;
    3. HUPT(e) x {model rollouts of H(e) steps from real states with the stochastic policy -> model buffer;
       ``updates_per_rollout`` SAC steps on batches with ``real_ratio`` real data};
    4. publish, evaluate deterministically in the changed env, log and checkpoint.
"""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from algos.lift.agent import SACAgent
from algos.lift.finetune import LinearSchedule, action_rate, branch_rollouts, mixed_sampler, sample_start_states
from algos.lift.replay import ReplayBuffer, transition_fields
from algos.lift.sac import SACConfig, update
from algos.lift.world_model_training import train_world_model
from cluster import ddp
from cluster.journal import Journal
from cluster.metrics import MetricsLogger, Progress
from experiments.lift.finetune_config import METHODS, Config
from experiments.lift.learner_common import (evaluate_on_rank0, learner_device, load_checkpoint, publish,
                                             save_checkpoint, sync_normalizer)
from experiments.lift.world_models import (early_stopping, pretrain_world_model, rollout_functions,
                                           world_model_columns, world_model_config)
from experiments.registry import attach_pool

log = logging.getLogger(__name__)


def train_fn(config: dict) -> None:
    """Stage 2, then the epochs of stage 3 (module docstring) until ``epochs`` are done."""
    learner = FinetuneLearner(config)
    exp = learner.exp
    learner.start()
    while learner.epoch < exp.epochs:
        learner.begin_epoch()
        if learner.uses_model:
            if exp.wm_retrain_first:
                learner.retrain_model()  # 1. the model follows the new env's data
            learner.collect_real(exp.real_steps_per_epoch // learner.world)  # 2. deterministic real steps
            if not exp.wm_retrain_first:
                learner.retrain_model()
            learner.branch_and_update()  # 3. branch in the model, update on mostly model data
        else:
            learner.update_on_real_data()  # sac_finetune: real steps with exploration, SAC in bursts
        learner.publish()
        learner.evaluate()  # 4.
        learner.end_epoch()
    learner.close()


def build_agent(agent_path: Path, exp: Config, device: torch.device) -> tuple[SACAgent, SACConfig]:
    """The pretrained SACAgent with LIFT's finetune coefficients: weights, targets, normalizer and (optionally) Adam
    states from ``agent.pt``; a fresh temperature at ``init_log_alpha`` with a fresh optimiser (LIFT does not load
    it)."""
    state = torch.load(agent_path, weights_only=True, map_location=device)
    ft = exp.finetune_sac()
    cfg = SACConfig(**{**state["config"], **ft, "utd": exp.updates_per_rollout})
    arch = state["arch"]
    agent = SACAgent(arch["obs_dim"], arch["act_dim"], cfg, critic_obs_dim=arch["critic_obs_dim"], device=device)
    if not exp.load_optimizer_state:
        state = {**state, "actor_opt": agent.actor_opt.state_dict(), "critic_opt": agent.critic_opt.state_dict()}
    if not exp.load_alpha:
        state = {**state, "log_alpha": agent.log_alpha.state_dict(), "alpha_opt": agent.alpha_opt.state_dict()}
    agent.load_state_dict(state)
    learning_rates = ((agent.actor_opt, ft["actor_lr"]), (agent.critic_opt, ft["critic_lr"]),
                      (agent.alpha_opt, ft["alpha_lr"]))
    for opt, lr in learning_rates:
        for group in opt.param_groups:  # loaded Adam states carry the pretraining lr
            group["lr"] = lr
    return agent, cfg


class FinetuneLearner:
    """This rank's agent, world model, real and model buffers, and its real env shard on the pool."""

    def __init__(self, config: dict) -> None:
        ddp.set_threads(config["torch_threads"])
        ddp.quiet_logs()
        self.exp = exp = Config(**config["experiment"])
        method, task, seed = config["method"], config["task"], config["seed"]
        self.method, self.task, self.seed = method, task, seed
        self.rank, self.world = ddp.rank(), ddp.world_size()
        self.run_path = run_path = Path(config["run_path"])
        self.device = device = learner_device(exp.device)
        torch.manual_seed(seed)
        self.agent, self.sac_cfg = build_agent(Path(config["agent_path"]), exp, device)
        self.obs_fn, self.reward_fn, self.action_scale = rollout_functions(task)
        self.uses_model = method != "sac_finetune"
        self.deterministic = method != "sac_finetune"  # LIFT's deterministic_in_env; the baseline explores for real
        fields = transition_fields(self.agent.obs_dim, self.agent.act_dim)
        self.real_buffer = ReplayBuffer(exp.env_buffer_capacity, fields, device=device)
        self.model_buffer = ReplayBuffer(exp.model_buffer_capacity, fields, device=device) if self.uses_model else None
        self.real_data: list[dict[str, np.ndarray]] = []  # the model's view of every real transition (ctrl as action)
        self.gen = torch.Generator(device=device).manual_seed(seed * 7 + self.rank)
        self.counters = {"epoch": 0, "real_env_steps": 0, "falls_total": 0, "wall_s": 0.0}
        self.model, self.wm_metrics = self.pretrain_model(run_path, [Path(p) for p in config["replay"]])
        self.metrics = MetricsLogger(run_path, flush_every=1) if self.rank == 0 else None
        self.journal = Journal(run_path, [], metrics=self.metrics)
        self.resume()
        self.agent.wrap(ddp.wrap_ddp)

        self.pool = attach_pool(config["pool"])
        self.policy_key = f"{config['run_id']}/{method}/policy"
        # the real env's interface: a model-based method's sampler refuses stochastic actions
        self.env_config = {"task": task, "num_envs": exp.num_real_envs, "seed": seed * 1000 + self.rank,
                           "change": config["change"], "physics_state": True,
                           "deterministic_only": self.deterministic, "shard": self.rank,
                           "run": f"{config['run_id']}/{method}"}
        self.first_request = self.counters["real_env_steps"] == 0
        self.stats = {"falls": 0, "episodes": 0, "action_rate": [], "stochastic_requests": 0}
        self.zero_shot_return = config["zero_shot_return"]
        self.progress = Progress(f"lift_finetune {method}", exp.epochs, "epochs") if self.rank == 0 else None
        self.method_id = float(METHODS.index(method))
        self.horizon = LinearSchedule.from_list(exp.horizon_schedule, "horizon_schedule")
        self.hupt = LinearSchedule.from_list(exp.hupt_schedule, "hupt_schedule")

    @property
    def epoch(self) -> int:
        return self.counters["epoch"]

    def pretrain_model(self, run_path: Path, replay: list[Path]) -> tuple[Any, dict[str, Any]]:
        """Stage 2 (model-based methods): the world model fitted on the pretraining replay, once per run and kind."""
        if not self.uses_model:
            return None, {}
        (run_path / "wm").mkdir(parents=True, exist_ok=True)
        cache = run_path / "wm" / f"{self.method}.pt"
        model, metrics = pretrain_world_model(self.method, self.task, self.exp, replay, cache, self.seed)
        model = model.to(self.device)
        if self.rank == 0 and not cache.exists():
            torch.save({"model": model.state_dict(), "metrics": metrics}, cache)
        log.info("%s stage 2: world model pretrained: %s", self.method, metrics)
        return model, metrics

    def resume(self) -> None:
        with ddp.latest_checkpoint() as ckpt:
            state = load_checkpoint(ckpt)
        if state is None:
            return
        self.agent.load_state_dict(state["agent"])
        self.real_buffer.load_state_dict(state["real_buffer"])
        self.real_data = [{k: v.numpy() for k, v in state["real_data"].items()}] if state["real_data"] else []
        self.counters = state["counters"]
        self.gen.set_state(state["gen"])
        if self.model is not None:
            self.model.load_state_dict(state["model"])
        if self.epoch < self.exp.epochs:
            # A resumed run re-enters every method's fit; a finished method redoes nothing and keeps its metric rows
            # (the methods after it wrote theirs into the same metrics store since).
            self.journal.rollback(state["journal"])
        log.info("rank %d resumed at epoch %d (%d real steps); the model buffer restarts empty", self.rank,
                 self.epoch, self.counters["real_env_steps"])

    # ----------------------------------------------------------------------------------------------- the steps

    def publish(self) -> None:
        publish(self.pool, self.policy_key, self.agent)

    def start(self) -> None:
        """Publish the pretrained policy; on a fresh start log the zero-shot point of the curve and prefill."""
        self.started = time.perf_counter() - self.counters["wall_s"]
        self.publish()
        if self.counters["real_env_steps"] > 0:
            return
        if self.metrics is not None:  # the starting point of the curve: the pretrained policy in the changed env
            self.metrics.log(0, {"real_env_steps": 0, "eval_return": self.zero_shot_return, "falls": 0,
                                 "falls_total": 0, "method_id": self.method_id, "epoch": -1, "wall_s": 0.0,
                                 "updates": self.agent.num_updates,
                                 **{f"wm_pretrain_{k}": v for k, v in self.wm_metrics.items()
                                    if isinstance(v, (int, float))}})
        if self.exp.prefill_steps:
            self.collect_real(self.exp.prefill_steps // self.world)

    def begin_epoch(self) -> None:
        self.stats.update(falls=0, episodes=0, action_rate=[])
        self.row: dict[str, Any] = {"method_id": self.method_id, "epoch": self.epoch}
        self.updates_before = self.agent.num_updates
        self.train_metrics: dict[str, float] = {}

    def collect_real(self, transitions: int) -> int:
        """Real steps through the pool (this rank's shard, always the same pool worker) into the real buffers."""
        exp, n = self.exp, self.exp.num_real_envs
        steps = max(1, math.ceil(transitions / n))
        request = {"steps": steps, "deterministic": self.deterministic}
        if self.first_request:
            request["reset_seed"] = self.env_config["seed"]
            self.first_request = False
        result = self.pool.map("env", [request], config=self.env_config, weights=self.policy_key,
                               affinity=[self.rank])[0]
        batch = result["transitions"]
        if exp.update_normalizer:
            sync_normalizer(self.agent.obs_normalizer, batch["obs"])
        self.real_buffer.add({k: batch[k] for k in self.real_buffer.specs})
        self.real_data.append(world_model_columns(batch))
        done = np.maximum(batch["terminated"], batch["truncated"]).reshape(steps, n)
        self.stats["action_rate"].append(action_rate(batch["action"].reshape(steps, n, -1), done))
        self.stats["falls"] += int(result["terminations"])
        self.stats["episodes"] += len(result["episode_returns"])
        self.stats["stochastic_requests"] = int(result["actions_sent"]["stochastic"])
        self.counters["real_env_steps"] += len(batch["reward"]) * self.world
        self.counters["falls_total"] += int(result["terminations"])
        return len(batch["reward"])

    def real_columns(self, keys: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        return {k: np.concatenate([d[k] for d in self.real_data]) for k in (keys or self.real_data[0])}

    def retrain_model(self) -> None:
        """Fit the world model (warm start, early stopping) on every real transition of the changed env so far."""
        if not self.real_data:  # no prefill: nothing from the changed env yet
            return
        exp = self.exp
        cfg = world_model_config(exp, pretrain=False, seed=self.seed * 1000 + self.epoch,
                                 ensemble=self.model.cfg.ensemble_size)
        try:  # keeping the stage-2 scalers unless asked: a refit would rest on ~1e3 rows
            out = train_world_model(self.model, self.real_columns(), cfg, early_stopping(exp),
                                    refit_normalizers=exp.wm_refit_scalers)
        except ValueError as err:  # too few whole real episodes for a hold-out yet: keep the current model
            log.warning("world model retraining skipped: %s", err)
            return
        self.row.update(wm_error_1step=out["error_1step"], wm_error_10step=out.get(f"error_{cfg.eval_horizon}step"),
                        wm_steps=out["steps"], wm_train_s=out["train_seconds"])

    def branch_and_update(self) -> None:
        """HUPT(e) times: model rollouts of H(e) steps from real states with the stochastic policy into the model
        buffer, then ``updates_per_rollout`` SAC steps on mixed real/model batches."""
        exp, model = self.exp, self.model
        data = self.real_columns(("qpos", "qvel"))
        states = torch.as_tensor(np.concatenate([data["qpos"], data["qvel"]], -1), device=self.device)
        states = states.to(model.delta_std.dtype)
        policy = lambda obs: self.agent.act(obs, False, self.gen)  # noqa: E731
        h, k_rollouts = self.horizon(self.epoch), self.hupt(self.epoch)
        model_transitions, rollout_metrics = 0, {}
        for _ in range(k_rollouts):
            start, _ = sample_start_states(states, exp.rollout_batch, self.gen)
            batch, rollout_metrics = branch_rollouts(model, start, policy, self.obs_fn, self.reward_fn,
                                                     self.action_scale, h,
                                                     member="random" if self.method == "mbpo_wm" else "mean")
            if len(batch["reward"]):
                self.model_buffer.add(batch)
            model_transitions += len(batch["reward"])
            if len(self.model_buffer) == 0:
                continue
            sample = mixed_sampler(lambda n: self.real_buffer.sample(n, self.gen),
                                   lambda n: self.model_buffer.sample(n, self.gen), exp.real_ratio, self.gen)
            self.train_metrics = update(self.agent, sample, self.sac_cfg)
        self.row.update(horizon=h, hupt=k_rollouts, model_transitions=model_transitions,
                        model_pred_std=rollout_metrics.get("model_pred_std", float("nan")))

    def update_on_real_data(self) -> None:
        """sac_finetune: chunks of real steps with the stochastic policy, each followed by a burst of SAC steps
        (``baseline_updates_per_step`` per real transition) and a publish."""
        exp, world = self.exp, self.world
        collected, per_chunk = 0, max(1, exp.baseline_chunk_steps // world)
        while collected < exp.real_steps_per_epoch // world:
            n = self.collect_real(min(per_chunk, exp.real_steps_per_epoch // world - collected))
            collected += n
            n_updates = max(1, int(round(n * world * exp.baseline_updates_per_step / self.sac_cfg.utd)))
            for _ in range(n_updates):
                self.train_metrics = update(self.agent, lambda m: self.real_buffer.sample(m, self.gen), self.sac_cfg)
            self.publish()

    def evaluate(self) -> None:
        """Deterministic episodes of the published policy in the changed env (rank 0's pool worker)."""
        exp = self.exp
        env_config = {**self.env_config, "num_envs": exp.eval_episodes, "shard": -1, "physics_state": False}
        self.eval_return = evaluate_on_rank0(self.pool, self.policy_key, env_config, exp.eval_episodes, self.seed,
                                             affinity=[0])

    def end_epoch(self) -> None:
        """The epoch's metrics row and the checkpoint."""
        c = self.counters
        c["epoch"] += 1
        c["wall_s"] = time.perf_counter() - self.started
        rates = [r for r in self.stats["action_rate"] if np.isfinite(r)]
        row = self.row
        row.update(real_env_steps=c["real_env_steps"], eval_return=self.eval_return, falls=self.stats["falls"],
                   falls_total=c["falls_total"], episodes=self.stats["episodes"],
                   action_rate=float(np.mean(rates)) if rates else float("nan"),
                   stochastic_requests=self.stats["stochastic_requests"], updates=self.agent.num_updates,
                   updates_epoch=self.agent.num_updates - self.updates_before, wall_s=c["wall_s"], **self.train_metrics)
        if self.metrics is not None:
            self.metrics.log(c["real_env_steps"], row)
            self.progress.update(c["epoch"], eval_return=self.eval_return, falls=self.stats["falls"])
        real_data = ({k: torch.as_tensor(v) for k, v in self.real_columns().items()} if self.real_data else {})
        state = {"agent": self.agent.state_dict(), "real_buffer": self.real_buffer.state_dict(),
                 "real_data": real_data, "counters": c, "gen": self.gen.get_state(),
                 "model": self.model.state_dict() if self.model is not None else None, "journal": self.journal.parts()}
        with ddp.checkpoint_dir() as d:
            save_checkpoint(d, state, self.agent, row)

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            torch.save(self.agent.policy_state(), self.run_path / f"policy-{self.method}.pt")
