"""LIFT stage 3 learner: one Ray Train worker (rank) finetuning the pretrained SAC agent in the changed env.

Before the first epoch: stage 2 (the world model fitted on the pretraining replay, cached in the pretraining run),
the zero-shot point of the curve and a prefill of the real buffer. Per epoch e, in the order of LIFT's
``world_model/finetune_wm_ac.py`` (model-based methods; the model-free ones replace 0-3 by SAC on real data):
    0. when H(e) changes, the model buffer is rebuilt at min(HUPT(e)·rollout_batch·H(e), cap) rows, keeping its
       newest rows (LIFT's ``update_model_horizon``);
    1. retrain the world model on all real data of the changed env (random 20 % hold-out, early stopping on its
       mean squared error, warm start, scalers refit); ``model_buffer_flush`` empties the model buffer after it;
    2. collect ``real_steps_per_epoch`` real steps through the pool (deterministic actions for LIFT) into the real
       buffer *and* the model buffer (LIFT's SAC buffer holds real steps too, the prefill's included); before the
       model sees them they are its held-out data: the per-epoch world-model error on real transitions;
    3. HUPT(e) x {model rollouts of H(e) steps from real states with the stochastic policy, the actor seeing the
       model's std as noise -> the model buffer; ``updates_per_rollout`` SAC steps on mixed batches};
    4. publish, evaluate deterministically in the changed env, log and checkpoint (every rank its own file).
Every rank runs the same number of SAC steps in every phase (DDP all-reduces each backward).

``train_fn`` runs under Ray Train with the shared pool; ``run_one_rank`` runs the same ``run_epochs`` in this process
(``ddp.local_session``, ``cluster.local_pool``): the study units measure the loop a cluster job runs.
"""
from __future__ import annotations

import copy
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from algos.lift.agent import SACAgent
from algos.lift.finetune import Branching, LinearSchedule, action_rate, branch_and_update, with_critic_view
from algos.lift.replay import ReplayBuffer, transition_fields
from algos.lift.sac import SACConfig, update
from algos.lift.world_model_training import heldout_errors, train_world_model
from cluster import ddp
from cluster.journal import Journal
from cluster.metrics import MetricsLogger, Progress, learner_tags
from envs.control.safety import JointSafety
from envs.control.tasks import make_env
from experiments.lift.finetune_config import METHOD_SPECS, METHODS, Config, rank_share
from experiments.lift.learner_common import (evaluate_on_rank0, gather_max, learner_device, load_checkpoint,
                                             param_divergence, publish, save_checkpoint, sync_normalizer)
from experiments.lift.world_models import (early_stopping, has_command, make_world_model, pretrain_world_model,
                                           rollout_functions, stage2_cache_path, world_model_columns,
                                           world_model_config)
from experiments.registry import attach_pool

log = logging.getLogger(__name__)
SAFETY_KEYS = ("joint_excursion", "joint_speed", "torso_tilt")
HELDOUT_HORIZON = 10  # steps of the open-loop error on each epoch's fresh real data


def train_fn(config: dict) -> None:
    """Stage 2, then the epochs of stage 3 (module docstring) until ``epochs`` are done: one Ray Train worker."""
    run_epochs(FinetuneLearner(config))


def run_one_rank(config: dict, pool: Any | None = None) -> Path:
    """``train_fn`` in this process as rank 0 of 1, without Ray: the pool's samplers run here (``LocalPool``) and the
    checkpoint is kept in ``run_path/checkpoints`` (a second call resumes). Returns the run path (metrics inside)."""
    from cluster.local_pool import LocalPool
    from experiments.registry import sampler_factories
    local = pool or LocalPool(sampler_factories())
    try:
        with ddp.local_session(Path(config["run_path"]) / "checkpoints"):
            run_epochs(FinetuneLearner(config, pool=local))
    finally:
        if pool is None:
            local.close()
    return Path(config["run_path"])


def run_epochs(learner: "FinetuneLearner") -> None:
    exp = learner.exp
    learner.start()
    while learner.epoch < exp.epochs and not learner.recovered:
        learner.begin_epoch()
        if learner.model is not None:
            learner.fit_model_buffer()  # 0. its size follows H(e)
            if exp.wm_retrain_first:
                learner.retrain_model()  # 1. the model follows the new env's data
            learner.collect_real(exp.real_steps_per_epoch // learner.world, heldout=True)  # 2.
            if not exp.wm_retrain_first:
                learner.retrain_model()
            learner.branch_and_update()  # 3. branch in the model, update on mostly model data
        else:
            learner.update_on_real_data()  # model-free: real steps with exploration, SAC in bursts
        learner.publish()
        learner.evaluate()  # 4.
        learner.end_epoch()
    learner.close()


def build_agent(agent_path: Path, exp: Config, device: torch.device) -> tuple[SACAgent, SACConfig]:
    """The pretrained SACAgent with LIFT's finetune coefficients, in fp32: weights, targets, normalizer and
    (optionally) Adam states from ``agent.pt``; unless ``load_alpha``, a fresh temperature at ``init_log_alpha`` with
    a fresh optimiser (LIFT does not load it)."""
    state = torch.load(agent_path, weights_only=True, map_location=device)
    ft = exp.finetune_sac()
    cfg = SACConfig(**{**state["config"], **ft, "utd": exp.updates_per_rollout, "bf16": False})
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

    def __init__(self, config: dict, pool: Any | None = None) -> None:
        ddp.set_threads(config["torch_threads"])
        ddp.quiet_logs()
        self.rank, self.world = ddp.rank(), ddp.world_size()
        # the run's global sizes, this rank's share of them
        self.exp = exp = rank_share(Config(**config["experiment"]), self.world, self.rank)
        method, task, seed = config["method"], config["task"], config["seed"]
        self.method, self.task, self.seed, self.spec = method, task, seed, METHOD_SPECS[method]
        self.run_path = run_path = Path(config["run_path"])
        self.device = device = learner_device(exp.device)
        torch.manual_seed(seed)
        self.agent, self.sac_cfg = build_agent(Path(config["agent_path"]), exp, device)
        change = config["change"]
        obs_fn, reward_fn, action_scale = rollout_functions(task, change)
        self.branching = Branching(obs_fn, reward_fn, action_scale,
                                   member="random" if self.spec.model == "blackbox" else "mean",
                                   obs_noise=exp.obs_noise)
        self.commanded = has_command(task, change)
        probe = make_env(task, change)
        self.safety = JointSafety.from_env(probe)
        probe.close()
        self.deterministic = self.spec.deterministic_real  # LIFT's deterministic_in_env; the baselines explore
        self.fields = transition_fields(self.agent.obs_dim, self.agent.act_dim)
        # LIFT's SAC buffer keeps the actor's (noisy) and the critic's (clean) view of each model transition
        self.model_fields = transition_fields(self.agent.obs_dim, self.agent.act_dim, critic_view=True)
        self.real_buffer = ReplayBuffer(exp.env_buffer_capacity, self.fields, device=device)
        # LIFT's SAC buffer: model rollouts and every real step, resized when H(e) changes (``fit_model_buffer``)
        self.model_buffer: ReplayBuffer | None = None
        self.buffer_horizon: int | None = None
        self.real_data: list[dict[str, np.ndarray]] = []  # the model's view of every real transition (ctrl as action)
        self.gen = torch.Generator(device=device).manual_seed(seed * 7 + self.rank)
        self.counters = {"epoch": 0, "real_env_steps": 0, "falls_total": 0, "wall_s": 0.0,
                         **{f"max_{k}": 0.0 for k in SAFETY_KEYS}}
        self.model, self.wm_metrics = self.pretrain_model(config)
        # the stage-2 model, frozen: its error on each epoch's fresh real data says how far the change is from it
        self.stage2_model = copy.deepcopy(self.model) if self.model is not None else None
        self.units = self.model.state_std.clone() if self.model is not None else None  # fixed error units
        self.metrics = (MetricsLogger(run_path, flush_every=1, gauges=learner_tags(config["run_id"], method))
                        if self.rank == 0 else None)
        self.journal = Journal(run_path, [], metrics=self.metrics)
        self.horizon = LinearSchedule.from_list(exp.horizon_schedule, "horizon_schedule")
        self.hupt = LinearSchedule.from_list(exp.hupt_schedule, "hupt_schedule")
        self.resume()
        if self.model is not None:
            self.fit_model_buffer()  # a fresh run's epoch-0 buffer (a resumed one brought its own): the prefill goes in
        self.agent.wrap(ddp.wrap_ddp)

        self.pool = pool if pool is not None else attach_pool(config["pool"], scope=config["run_id"])
        self.policy_key = f"{config['run_id']}/{method}/policy"
        # the real env's interface: a deterministic method's sampler refuses anything else
        self.env_config = {"task": task, "num_envs": exp.num_real_envs, "seed": seed * 1000 + self.rank,
                           "change": change, "physics_state": True, "deterministic_only": self.deterministic,
                           "shard": self.rank, "run": f"{config['run_id']}/{method}"}
        self.first_request = self.counters["real_env_steps"] == 0
        self.stats: dict[str, Any] = {"stochastic_requests": 0}
        self.zero_shot_return = config["zero_shot_return"]
        # 80 % of the return the change took away (the recovery line of the summary)
        self.recovery_return = self.zero_shot_return + 0.8 * (config["pre_change_return"] - self.zero_shot_return)
        self.recovered = False
        self.progress = (Progress(f"lift_finetune {method}", exp.epochs, "epochs", done=self.epoch)
                         if self.rank == 0 else None)  # a resume's rate and ETA count from its epoch
        self.method_id = float(METHODS.index(method))

    @property
    def epoch(self) -> int:
        return self.counters["epoch"]

    def pretrain_model(self, config: dict) -> tuple[Any, dict[str, Any]]:
        """Stage 2 (model-based methods): rank 0 fits the model on the pretraining replay (or loads the fit cached in
        the pretraining run); the other ranks load what it saved. ``config["stage2"]``: a saved stage-2 fit of this
        method's kind ({"model": state_dict, "metrics": ...}) to start from instead (a study's start model)."""
        kind = self.spec.model
        if kind is None:
            return None, {}
        if config.get("stage2"):
            model = make_world_model(kind, self.task, self.exp, self.exp.wm_pretrain_seed).to(self.device)
            saved = torch.load(config["stage2"], weights_only=True, map_location=self.device)
            model.load_state_dict(saved["model"])
            return model, saved.get("metrics", {})
        pretrain_run, replay = Path(config["pretrain_run"]), [Path(p) for p in config["replay"]]
        cache = stage2_cache_path(pretrain_run, kind, self.task, self.exp)
        if self.rank == 0:
            model, metrics = pretrain_world_model(kind, self.task, self.exp, replay, cache, self.device)
        ddp.barrier()  # the other ranks wait for rank 0's fit; the process group's timeout is set for it (cluster.train)
        if self.rank > 0:
            model, metrics = pretrain_world_model(kind, self.task, self.exp, replay, cache, self.device)
        log.info("%s stage 2 (%s, %s): %s", self.method, kind, cache.name, metrics)
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
        if state.get("model_buffer") is not None:
            self.buffer_horizon = state["buffer_horizon"]
            self.model_buffer = ReplayBuffer(state["model_buffer"]["capacity"], self.model_fields,
                                             device=self.device)
            self.model_buffer.load_state_dict(state["model_buffer"])
        if self.epoch < self.exp.epochs:
            # A resumed run re-enters every method's fit; a finished method redoes nothing and keeps its metric rows
            # (the methods after it wrote theirs into the same metrics store since).
            self.journal.rollback(state["journal"])
        log.info("rank %d resumed at epoch %d (%d real steps)", self.rank, self.epoch, self.counters["real_env_steps"])

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
        self.begin_epoch()  # the prefill's falls and excursions count towards the first epoch
        if self.exp.prefill_steps:
            self.collect_real(self.exp.prefill_steps // self.world)

    def begin_epoch(self) -> None:
        if getattr(self, "row", None) is not None and self.row.get("epoch") == self.epoch:
            return  # the prefill already opened this epoch
        self.stats.update(falls=0, episodes=0, action_rate=[], **{k: 0.0 for k in SAFETY_KEYS})
        self.row: dict[str, Any] = {"method_id": self.method_id, "epoch": self.epoch}
        self.updates_before = self.agent.num_updates
        self.train_metrics: dict[str, float] = {}

    def collect_real(self, transitions: int, heldout: bool = False) -> int:
        """Real steps through the pool (this rank's shard, always the same pool worker) into the real buffers.
        ``heldout``: first score the world models on these transitions, which they have not been trained on."""
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
        if self.model_buffer is not None:  # LIFT's get_experience_brax inserts every real step into the SAC buffer
            real = with_critic_view(batch)  # a real step's critic view is its own obs
            self.model_buffer.add({k: real[k] for k in self.model_buffer.specs})
        columns = world_model_columns(batch)
        if self.commanded:
            columns["command"] = batch["obs"][:, -1].astype(np.float64)
        if heldout and self.model is not None:
            self.score_heldout(columns)
        self.real_data.append(columns)
        done = np.maximum(batch["terminated"], batch["truncated"]).reshape(steps, n)
        self.stats["action_rate"].append(action_rate(batch["action"].reshape(steps, n, -1), done))
        self.stats["falls"] += int(result["terminations"])
        self.stats["episodes"] += len(result["episode_returns"])
        self.stats["stochastic_requests"] = int(result["actions_sent"]["stochastic"])
        for key, value in self.safety.measure(batch["next_qpos"], batch["next_qvel"]).items():
            self.stats[key] = float(np.nanmax([self.stats[key], value]))
        self.counters["real_env_steps"] += len(batch["reward"]) * self.world
        return len(batch["reward"])

    def score_heldout(self, columns: dict[str, np.ndarray]) -> None:
        """The current and the frozen stage-2 model's open-loop error on real transitions neither was trained on, in
        the stage-2 state units (comparable across epochs, refits and methods)."""
        h = HELDOUT_HORIZON
        for name, model in (("wm_heldout", self.model), ("wm_stage2_heldout", self.stage2_model)):
            errors = heldout_errors(model, columns, h, seed=self.seed, state_std=self.units)
            self.row.update({f"{name}_error_1step": float(errors[0]), f"{name}_error_{h}step": float(errors[-1])})

    def real_columns(self, keys: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        return {k: np.concatenate([d[k] for d in self.real_data]) for k in (keys or self.real_data[0])}

    def fit_model_buffer(self) -> None:
        """LIFT's ``update_model_horizon``: when H(e) differs from the buffer's, a buffer of min(HUPT(e)·rollout_batch·
        H(e), cap) rows replaces it, keeping its newest rows (none with ``model_buffer_flush``)."""
        h = self.horizon(self.epoch)
        if h == self.buffer_horizon:
            return
        capacity = min(self.hupt(self.epoch) * self.exp.rollout_batch * h, self.exp.model_buffer_capacity)
        old, self.buffer_horizon = self.model_buffer, h
        self.model_buffer = (old.resized(capacity) if old is not None and not self.exp.model_buffer_flush
                             else ReplayBuffer(capacity, self.model_fields, device=self.device))

    def retrain_model(self) -> None:
        """Fit the world model (warm start, early stopping, scalers refit keeping its predictions) on every real
        transition of the changed env so far; ``model_buffer_flush`` then empties the model buffer (LIFT's
        ``clear_model_buffer_after_model_train``, false in its finetuning config)."""
        if self.spec.frozen_model or not self.real_data:  # frozen, or no prefill: nothing from the changed env yet
            return
        exp = self.exp
        cfg = world_model_config(exp, pretrain=False, seed=self.seed * 1000 + self.epoch,
                                 ensemble=self.model.cfg.ensemble_size)
        try:
            out = train_world_model(self.model, self.real_columns(), cfg, early_stopping(exp, pretrain=False),
                                    scalers=exp.wm_scalers, state_std=self.units)
        except ValueError as err:  # raised before any change to the model: it stays as it was
            log.warning("world model retraining skipped, the model is unchanged: %s", err)
            return
        self.row.update(wm_error_1step=out["error_1step"], wm_error_10step=out.get(f"error_{cfg.eval_horizon}step"),
                        wm_steps=out["steps"], wm_train_s=out["train_seconds"],
                        wm_kept_incoming=float(out["kept_incoming"]))
        if self.exp.model_buffer_flush:
            self.model_buffer = ReplayBuffer(self.model_buffer.capacity, self.model_fields, device=self.device)

    def branch_and_update(self) -> None:
        """HUPT(e) branches of H(e)-step model rollouts from real states into the model buffer, each followed
        by ``updates_per_rollout`` SAC steps on mixed real/model batches (``algos.lift.finetune.branch_and_update``)."""
        exp = self.exp
        data = self.real_columns(("qpos", "qvel", "command") if self.commanded else ("qpos", "qvel"))
        dtype = self.model.delta_std.dtype
        states = torch.as_tensor(np.concatenate([data["qpos"], data["qvel"]], -1), device=self.device).to(dtype)
        commands = torch.as_tensor(data["command"], device=self.device).to(dtype) if self.commanded else None
        h, n_branches = self.horizon(self.epoch), self.hupt(self.epoch)
        policy = lambda obs: self.agent.act(obs, False, self.gen)  # noqa: E731
        out = branch_and_update(
            self.model, self.branching, states, commands, policy, n_branches=n_branches, horizon=h,
            rollout_batch=exp.rollout_batch, model_buffer=self.model_buffer,
            real_sample=lambda n: self.real_buffer.sample(n, self.gen),
            update=lambda sampler: update(self.agent, sampler, self.sac_cfg), real_ratio=exp.real_ratio,
            generator=self.gen)
        self.train_metrics = {k: v for k, v in out.items() if not k.startswith("model_")}
        self.row.update(horizon=h, hupt=n_branches, model_buffer=len(self.model_buffer),
                        **{k: v for k, v in out.items() if k.startswith("model_")})

    def baseline_calls(self) -> int:
        """``update`` calls (each ``updates_per_rollout`` SAC steps) of a model-free method in this epoch: UTD
        ``baseline_updates_per_step``, or exactly LIFT's number in the same epoch (HUPT(e))."""
        if self.spec.updates == "matched":
            return self.hupt(self.epoch)
        return max(1, round(self.exp.real_steps_per_epoch * self.exp.baseline_updates_per_step / self.sac_cfg.utd))

    def update_on_real_data(self) -> None:
        """Model-free methods: chunks of real steps with the stochastic policy, each followed by its share of the
        epoch's SAC steps and a publish (the same count on every rank)."""
        exp = self.exp
        goal, per_chunk = exp.real_steps_per_epoch // self.world, max(1, exp.baseline_chunk_steps // self.world)
        total, collected, done = self.baseline_calls(), 0, 0
        while collected < goal:
            collected += self.collect_real(min(per_chunk, goal - collected))
            due = math.floor(total * min(collected / goal, 1.0) + 1e-9)
            for _ in range(due - done):
                self.train_metrics = update(self.agent, lambda m: self.real_buffer.sample(m, self.gen), self.sac_cfg)
            done = due
            self.publish()

    def evaluate(self) -> None:
        """Deterministic episodes of the published policy in the changed env (rank 0's pool worker)."""
        exp = self.exp
        env_config = {**self.env_config, "num_envs": exp.eval_episodes, "shard": -1, "physics_state": False}
        self.eval_return = evaluate_on_rank0(self.pool, self.policy_key, env_config, exp.eval_episodes, self.seed,
                                             affinity=[0])
        # the same value on every rank (broadcast), so every rank stops at the same epoch
        self.recovered = exp.stop_at_recovery and self.eval_return >= self.recovery_return

    def end_epoch(self) -> None:
        """The epoch's metrics row (falls summed, excursions the worst over ranks) and this rank's checkpoint."""
        c = self.counters
        c["epoch"] += 1
        c["wall_s"] = time.perf_counter() - self.started
        falls = torch.tensor([float(self.stats["falls"])], dtype=torch.float64)
        ddp.all_reduce_mean_([falls])
        falls_epoch = int(round(float(falls.item()) * self.world))
        c["falls_total"] += falls_epoch
        worst = {k: gather_max(self.stats[k]) for k in SAFETY_KEYS}
        for k, v in worst.items():
            if np.isfinite(v):
                c[f"max_{k}"] = max(c[f"max_{k}"], v)
        rates = [r for r in self.stats["action_rate"] if np.isfinite(r)]
        row = self.row
        if c["epoch"] == self.exp.epochs or self.recovered:  # DDP keeps the ranks' policies identical (a collective: every rank calls)
            row["param_max_abs_diff"] = param_divergence(self.agent)
        row.update(real_env_steps=c["real_env_steps"], eval_return=self.eval_return, falls=falls_epoch,
                   falls_total=c["falls_total"], episodes=self.stats["episodes"],
                   action_rate=float(np.mean(rates)) if rates else float("nan"),
                   stochastic_requests=self.stats["stochastic_requests"], updates=self.agent.num_updates,
                   updates_epoch=self.agent.num_updates - self.updates_before, wall_s=c["wall_s"],
                   **worst, **{f"max_{k}_total": c[f"max_{k}"] for k in SAFETY_KEYS}, **self.train_metrics)
        if self.metrics is not None:
            self.metrics.log(c["real_env_steps"], row)
            self.progress.update(c["epoch"], eval_return=self.eval_return, falls=falls_epoch)
        real_data = ({k: torch.as_tensor(v) for k, v in self.real_columns().items()} if self.real_data else {})
        state = {"agent": self.agent.state_dict(), "real_buffer": self.real_buffer.state_dict(),
                 "real_data": real_data, "counters": c, "gen": self.gen.get_state(),
                 "model": self.model.state_dict() if self.model is not None else None, "journal": self.journal.parts(),
                 "model_buffer": self.model_buffer.state_dict() if self.model_buffer is not None else None,
                 "buffer_horizon": self.buffer_horizon}
        with ddp.checkpoint_dir() as d:
            save_checkpoint(d, state, self.agent, row)
        self.row = None

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            torch.save(self.agent.policy_state(), self.run_path / f"policy-{self.method}.pt")
