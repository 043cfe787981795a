"""LIFT stages 2-3: physics-informed world model from the pretraining replay, then safe finetuning in a changed env.

    python -m experiments.run experiment=lift_finetune env=inverted_pendulum experiment.pretrain_run=<lift_pretrain run>
    python -m experiments.run experiment=lift_finetune env=walker2d experiment.pretrain_run=... \
        experiment.methods=[lift,sac_finetune,mbpo_wm]             # compare mode (the tour)

Methods (``experiment.method``; ``experiment.methods`` runs several one after another, each its own fit):
  lift          physics-informed world model; the real env only ever receives deterministic actions
                (its pool sampler is built with ``deterministic_only=true`` and refuses anything else)
  mbpo_wm       the same loop with the black-box MBPO ensemble (baseline b)
  sac_finetune  plain SAC finetuning with stochastic exploration in the real env, no model (baseline a)

Stage 2 (learner, once per world-model kind, cached under run_dir/wm/): fit the model on the pretraining Parquet replay
(the simulator's ``ctrl`` is the model's action) with early stopping.
Stage 3, per epoch e, in the order of LIFT's ``finetune_wm_ac.py`` (after a deterministic prefill of the real buffer):
  1. retrain the model on all real data of the changed env (early stopping, warm start);
  2. collect ``real_steps_per_epoch`` real steps through the pool with the deterministic policy;
  3. HUPT(e) x {``rollout_batch`` start states from the real buffer -> H(e)-step model rollouts with the stochastic
     policy -> model buffer; ``updates_per_rollout`` SAC steps on batches with ``real_ratio`` real data};
  4. deterministic evaluation in the changed env (pool), metrics, checkpoint.
Actor, critics, targets, normalizer and Adam states come from pretraining (``agent.pt``); the temperature is reset
(LIFT's ``sac_init_log_alpha``) and the learning rates, gamma, tau are LIFT's finetune values (``experiment.sac``).

Recovery (summary ``real_steps_to_recover``): the first real-env step count (prefill included) at which the
deterministic evaluation return in the changed env reaches ``zero_shot + 0.8 (pre_change - zero_shot)``, i.e. the
policy has won back 80 % of the return the change took away (pre_change: the pretrained policy in the original env;
zero_shot: the pretrained policy in the changed env). None if never reached.

DDP: with several Train workers every rank drives its own real env shard and world model; SAC gradients are averaged
and the observation normalizer is merged across ranks, so the policy stays identical on all ranks.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from envs.control.tasks import TASKS

log = logging.getLogger(__name__)

METHODS = ("lift", "sac_finetune", "mbpo_wm")
FINETUNE_TASKS = ("inverted_pendulum", "walker2d", "half_cheetah", "humanoid_state")
# A change per task where the pretrained policy clearly loses return. InvertedPendulum (a policy at 1000): gravity x4
# -> 236 zero-shot, a state-dependent force the residual can learn from deterministic data; gear x0.4 -> 454 is
# harder for a model fed only deterministic actions (see benchmarks/RESULTS.md).
DEFAULT_CHANGES: dict[str, dict] = {
    "inverted_pendulum": {"name": "gravity", "scale": 4.0},
    "walker2d": {"name": "friction", "scale": 0.4},
    "half_cheetah": {"name": "friction", "scale": 0.4},
    "humanoid_state": {"name": "mass", "scale": 1.4},
}
# LIFT's finetune_sac_config (reference card §3.2).
FINETUNE_SAC = dict(actor_lr=2e-4, critic_lr=2e-4, alpha_lr=3e-4, gamma=0.99, tau=0.001, init_log_alpha=-7.13,
                    target_entropy_coef=0.5, batch_size=256)


@dataclass
class Config:
    pretrain_run: str | None = None  # run directory of lift_pretrain (policy.pt, agent.pt, data/replay-rank*)
    change: dict | None = None  # envs.control.changes spec; None = DEFAULT_CHANGES[task]
    method: str = "lift"
    methods: list[str] = field(default_factory=list)  # compare mode when non-empty
    epochs: int = 6
    real_steps_per_epoch: int = 1000
    prefill_steps: int = 1000  # LIFT: 1000 deterministic steps before the first epoch
    num_real_envs: int = 4  # envs behind the real-env interface (>= 2 so the model's hold-out has whole episodes)
    rollout_batch: int = 400  # start states per branch (LIFT 400)
    horizon_schedule: list[int] = field(default_factory=lambda: [0, 4, 1, 5])  # LIFT [0, 10, 1, 20]
    hupt_schedule: list[int] = field(default_factory=lambda: [0, 4, 10, 40])  # LIFT [0, 4, 10, 1000]
    updates_per_rollout: int = 20  # SAC steps per branch (LIFT 20)
    real_ratio: float = 0.06
    model_buffer_capacity: int = 100_000  # LIFT min(HUPT*400*H, 400k)
    env_buffer_capacity: int = 60_000
    sac: dict = field(default_factory=dict)  # overrides of FINETUNE_SAC (actor_lr, critic_lr, ..., batch_size)
    load_optimizer_state: bool = True
    # LIFT resets the temperature to e^init_log_alpha; true keeps the pretrained one (and its Adam state). With a small
    # pretraining (α ≈ 1e-2, not LIFT's ≈ 8e-4) the reset changes the soft targets at once: the early dip (§3.4).
    load_alpha: bool = False
    # LIFT's order retrains the model before collecting the epoch's real steps (it lags one epoch, harmless with a
    # 1000-step prefill and 1000-step epochs); false collects first, so with small epochs and no prefill the rollouts of
    # epoch e already branch from a model that has seen epoch e's data.
    wm_retrain_first: bool = True
    # Our pretraining statistics rest on 1e4-1e5 samples, not LIFT's 4e7: folding ~1e3 changed-env observations into
    # them moves the policy's input a lot (InvertedPendulum gear x0.4: 454 -> 84 zero-shot from that alone). Off
    # by default: the pretrained normalizer is kept. Likewise the world model keeps its stage-2 scalers.
    update_normalizer: bool = False
    wm_refit_scalers: bool = False
    baseline_updates_per_step: float = 1.0  # sac_finetune: SAC steps per real transition
    baseline_chunk_steps: int = 100  # sac_finetune: real transitions per request between update bursts
    wm_hidden: list[int] = field(default_factory=lambda: [200, 200, 200])  # LIFT 4 x 400
    wm_prior_mode: str = "frozen"  # "substep" for HalfCheetah
    wm_pretrain_steps: int = 1500
    wm_pretrain_rows: int = 50_000  # newest pretraining transitions used for stage 2
    wm_retrain_steps: int = 600
    wm_loss_horizon: int = 4  # LIFT finetuning: 4
    wm_eval_every: int = 100
    wm_patience: int = 6
    wm_min_improvement: float = 0.01
    blackbox_ensemble_size: int = 5
    eval_episodes: int = 5
    device: str = "auto"

    def __post_init__(self) -> None:
        from algos.lift.finetune import LinearSchedule
        self.methods = list(self.methods)
        for m in [self.method, *self.methods]:
            if m not in METHODS:
                raise ValueError(f"experiment.method: unknown method {m!r} (choose from {', '.join(METHODS)})")
        for key in ("epochs", "real_steps_per_epoch", "num_real_envs", "rollout_batch", "updates_per_rollout",
                    "model_buffer_capacity", "env_buffer_capacity", "baseline_chunk_steps", "wm_pretrain_steps",
                    "wm_pretrain_rows", "wm_retrain_steps", "wm_loss_horizon", "wm_eval_every", "wm_patience",
                    "blackbox_ensemble_size", "eval_episodes"):
            if getattr(self, key) < 1:
                raise ValueError(f"experiment.{key}: must be >= 1, got {getattr(self, key)}")
        if self.prefill_steps < 0:
            raise ValueError(f"experiment.prefill_steps: must be >= 0, got {self.prefill_steps}")
        if not 0.0 <= self.real_ratio <= 1.0:
            raise ValueError(f"experiment.real_ratio: must be in [0, 1], got {self.real_ratio}")
        if self.baseline_updates_per_step <= 0:
            raise ValueError(f"experiment.baseline_updates_per_step: must be > 0, got {self.baseline_updates_per_step}")
        if self.wm_prior_mode not in ("frozen", "substep"):
            raise ValueError(f"experiment.wm_prior_mode: 'frozen' or 'substep', got {self.wm_prior_mode!r}")
        unknown = sorted(set(self.sac) - set(FINETUNE_SAC))
        if unknown:
            raise ValueError(f"experiment.sac.{unknown[0]}: unknown key (valid: {', '.join(sorted(FINETUNE_SAC))})")
        for name in ("horizon_schedule", "hupt_schedule"):
            LinearSchedule.from_list(getattr(self, name), f"experiment.{name}")

    def method_list(self) -> list[str]:
        return self.methods or [self.method]

    def finetune_sac(self) -> dict:
        return {**FINETUNE_SAC, **{k: v for k, v in self.sac.items() if v is not None}}


def task_of(raw: dict) -> str:
    from experiments.config import ConfigError
    task = (raw.get("env") or {}).get("task")
    if task not in FINETUNE_TASKS:
        raise ConfigError(f"env.task: lift_finetune needs a MuJoCo task with a physics prior and task reward "
                          f"({', '.join(FINETUNE_TASKS)}), got {task!r}")
    return task


def pretrain_files(pretrain_run: str | None) -> dict[str, Path]:
    """policy.pt, agent.pt and the replay Parquet folders of a lift_pretrain run, or ConfigError naming what is missing."""
    from experiments.config import ConfigError
    if not pretrain_run:
        raise ConfigError("experiment.pretrain_run: missing; pass the run directory of a lift_pretrain run "
                          "(experiment.pretrain_run=runs/lift_pretrain/<run>)")
    run = Path(pretrain_run).expanduser()
    if not run.is_dir():
        raise ConfigError(f"experiment.pretrain_run: {run} is not a directory")
    missing = [name for name in ("policy.pt", "agent.pt") if not (run / name).is_file()]
    replay = sorted((run / "data").glob("replay-rank*"))
    if not replay or not any(replay[0].glob("*.parquet")):
        missing.append("data/replay-rank*/ (Parquet replay)")
    if missing:
        raise ConfigError(f"experiment.pretrain_run: {run} lacks {', '.join(missing)}; is it a finished lift_pretrain "
                          f"run (physics_state=true)?")
    return {"policy": run / "policy.pt", "agent": run / "agent.pt", "replay": replay}


def check(exp: Config, raw: dict) -> None:
    from experiments.config import ConfigError
    task_of(raw)
    pretrain_files(exp.pretrain_run)
    change = exp.change or DEFAULT_CHANGES[task_of(raw)]
    from envs.control.changes import parse_changes
    try:
        changes = parse_changes(change)
    except ValueError as err:
        raise ConfigError(f"experiment.change: {err}") from None
    if any(c.name == "target_velocity" for c in changes):
        raise ConfigError("experiment.change: target_velocity needs a command-conditioned pretraining; use a physics "
                          "change (friction, mass, gear, gravity)")


# ------------------------------------------------------------------------------------------------- world models

def world_model_config(exp: Config, *, pretrain: bool, seed: int, ensemble: int = 1):
    from algos.lift.world_model import WorldModelConfig
    return WorldModelConfig(hidden_sizes=tuple(exp.wm_hidden), ensemble_size=ensemble, prior_mode=exp.wm_prior_mode,
                            train_steps=exp.wm_pretrain_steps if pretrain else exp.wm_retrain_steps,
                            loss_horizon=1 if pretrain else exp.wm_loss_horizon, eval_every=exp.wm_eval_every,
                            seed=seed)


def make_world_model(kind: str, task: str, exp: Config, seed: int):
    """The physics-informed model (``lift``) or the black-box ensemble (``mbpo_wm``) over the task's nominal model."""
    from algos.lift.world_model import BlackBoxEnsemble, PhysicsWorldModel
    from envs.control.tasks import make_env
    from envs.control.mujoco_prior import MujocoPrior
    env = make_env(task)
    prior = MujocoPrior.from_env(env)
    act_dim = env.action_space.shape[0]
    env.close()
    if kind == "lift":
        return PhysicsWorldModel(prior, act_dim, world_model_config(exp, pretrain=True, seed=seed))
    cfg = world_model_config(exp, pretrain=True, seed=seed, ensemble=exp.blackbox_ensemble_size)
    return BlackBoxEnsemble.like(prior, act_dim, cfg)


def load_pretrain_replay(replay_dirs: list[Path], max_rows: int) -> dict[str, np.ndarray]:
    """World-model columns of the pretraining replay (newest ``max_rows`` per rank); ``action`` := simulator ctrl."""
    from cluster.store import ParquetStore
    parts = []
    for d in replay_dirs:
        data = ParquetStore(d).to_numpy()
        if "ctrl" not in data:
            raise ValueError(f"{d}: the replay has no ctrl/qpos columns (pretrain with physics_state=true)")
        n = len(data["ctrl"])
        keep = slice(max(0, n - max_rows), n)
        parts.append({"qpos": data["qpos"][keep], "qvel": data["qvel"][keep], "action": data["ctrl"][keep],
                      "next_qpos": data["next_qpos"][keep], "next_qvel": data["next_qvel"][keep],
                      "terminated": data["terminated"][keep], "truncated": data["truncated"][keep]})
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def pretrain_world_model(kind: str, task: str, exp: Config, replay_dirs: list[Path], cache: Path, seed: int):
    """Stage 2: fit the model on the pretraining replay (early stopping), cached in ``cache`` for later fits/resumes."""
    import torch
    from algos.lift.world_model import EarlyStopping, train_world_model
    model = make_world_model(kind, task, exp, seed)
    if cache.exists():
        model.load_state_dict(torch.load(cache, weights_only=False)["model"])
        return model, torch.load(cache, weights_only=False)["metrics"]
    data = load_pretrain_replay(replay_dirs, exp.wm_pretrain_rows)
    metrics = train_world_model(model, data, early_stopping=EarlyStopping(exp.wm_patience, exp.wm_min_improvement))
    metrics = {k: v for k, v in metrics.items() if not isinstance(v, list)}
    return model, metrics


# ------------------------------------------------------------------------------------------ learner (Train worker)

def build_agent(agent_path: Path, exp: Config, device):
    """The pretrained SACAgent with LIFT's finetune coefficients: weights, targets, normalizer and (optionally) Adam
    states from ``agent.pt``; a fresh temperature at ``init_log_alpha`` with a fresh optimiser (LIFT does not load it)."""
    import torch
    from algos.lift.sac import SACAgent, SACConfig
    state = torch.load(agent_path, weights_only=False, map_location=device)
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


def train_fn(config: dict) -> None:
    import torch

    from algos.lift.finetune import (ActionScale, LinearSchedule, action_rate, branch_rollouts, mixed_sampler,
                                     sample_start_states)
    from algos.lift.replay import ReplayBuffer
    from algos.lift.sac import unwrap, update
    from algos.lift.world_model import EarlyStopping, train_world_model
    from cluster import ddp
    from cluster.metrics import MetricsLogger, Progress
    from envs.control.tasks import make_env
    from envs.control.task_rewards import make_observation_fn, make_task_reward
    from experiments.lift.pretrain import _sync_normalizer
    from experiments.registry import attach_pool

    ddp.set_threads(config["torch_threads"])
    ddp.quiet_logs()
    exp = Config(**config["experiment"])
    method, task, seed = config["method"], config["task"], config["seed"]
    rank, world = ddp.rank(), ddp.world_size()
    run_path = Path(config["run_path"])
    device = torch.device("cuda" if exp.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if exp.device == "auto" else exp.device))
    torch.manual_seed(seed)
    agent, sac_cfg = build_agent(Path(config["agent_path"]), exp, device)
    probe = make_env(task)
    obs_fn, reward_fn = make_observation_fn(probe), make_task_reward(probe)
    base_space = probe.unwrapped.action_space  # the env's own control range (RescaleAction wraps it)
    scale = ActionScale(torch.as_tensor(base_space.low, dtype=torch.float64),
                        torch.as_tensor(base_space.high, dtype=torch.float64))
    probe.close()
    uses_model = method != "sac_finetune"
    fields = {"obs": ((agent.obs_dim,), torch.float32), "action": ((agent.act_dim,), torch.float32),
              "reward": ((), torch.float32), "next_obs": ((agent.obs_dim,), torch.float32),
              "terminated": ((), torch.float32), "truncated": ((), torch.float32)}
    real_buffer = ReplayBuffer(exp.env_buffer_capacity, fields, device=device)
    model_buffer = ReplayBuffer(exp.model_buffer_capacity, fields, device=device) if uses_model else None
    real_wm: list[dict[str, np.ndarray]] = []  # the model's view of every real transition (ctrl as action)
    gen = torch.Generator(device=device).manual_seed(seed * 7 + rank)
    counters = {"epoch": 0, "real_env_steps": 0, "falls_total": 0, "wall_s": 0.0}

    model, wm_metrics = None, {}
    if uses_model:
        (run_path / "wm").mkdir(parents=True, exist_ok=True)
        cache = run_path / "wm" / f"{method}.pt"
        model, wm_metrics = pretrain_world_model(method, task, exp, [Path(p) for p in config["replay"]], cache, seed)
        model = model.to(device)
        if rank == 0 and not cache.exists():
            torch.save({"model": model.state_dict(), "metrics": wm_metrics}, cache)
        log.info("%s stage 2: world model pretrained: %s", method, wm_metrics)

    with ddp.latest_checkpoint() as ckpt:
        if ckpt is not None:
            state = torch.load(ckpt / f"rank{rank}.pt", weights_only=False)
            agent.load_state_dict(state["agent"])
            real_buffer.load_state_dict(state["real_buffer"])
            real_wm, counters = state["real_wm"], state["counters"]
            gen.set_state(state["gen"])
            if model is not None:
                model.load_state_dict(state["model"])
            log.info("rank %d resumed at epoch %d (%d real steps); the model buffer restarts empty", rank,
                     counters["epoch"], counters["real_env_steps"])
    agent.wrap(ddp.wrap_ddp)

    pool = attach_pool(config["pool"])
    policy_key = f"{config['run_id']}/{method}/policy"
    env_cfg = {"task": task, "num_envs": exp.num_real_envs, "seed": seed * 1000 + rank, "change": config["change"],
               "physics_state": True, "deterministic_only": method != "sac_finetune", "shard": rank,
               "run": f"{config['run_id']}/{method}"}
    deterministic = method != "sac_finetune"  # LIFT's deterministic_in_env; the baseline explores for real
    first_request = [counters["real_env_steps"] == 0]
    stats = {"falls": 0, "episodes": 0, "action_rate": [], "stochastic_requests": 0}

    def publish() -> None:
        if rank == 0:
            pool.publish(policy_key, agent.policy_state())
        ddp.barrier()

    def collect(transitions: int) -> int:
        """Real steps through the pool (this rank's shard, always the same pool worker); into the buffers."""
        steps = max(1, math.ceil(transitions / exp.num_real_envs))
        request = {"steps": steps, "deterministic": deterministic}
        if first_request[0]:
            request["reset_seed"] = env_cfg["seed"]
            first_request[0] = False
        result = pool.map("env", [request], config=env_cfg, weights=policy_key, affinity=[rank])[0]
        batch = result["transitions"]
        if exp.update_normalizer:
            _sync_normalizer(agent.obs_normalizer, batch["obs"])
        real_buffer.add({k: batch[k] for k in fields})
        real_wm.append({"qpos": batch["qpos"], "qvel": batch["qvel"], "action": batch["ctrl"],
                        "next_qpos": batch["next_qpos"], "next_qvel": batch["next_qvel"],
                        "terminated": batch["terminated"], "truncated": batch["truncated"]})
        n = exp.num_real_envs
        done = np.maximum(batch["terminated"], batch["truncated"]).reshape(steps, n)
        stats["action_rate"].append(action_rate(batch["action"].reshape(steps, n, -1), done))
        stats["falls"] += int(result["terminations"])
        stats["episodes"] += len(result["episode_returns"])
        stats["stochastic_requests"] = int(result["actions_sent"]["stochastic"])
        counters["real_env_steps"] += len(batch["reward"]) * world
        counters["falls_total"] += int(result["terminations"])
        return len(batch["reward"])

    def real_states() -> torch.Tensor:
        data = {k: np.concatenate([d[k] for d in real_wm]) for k in ("qpos", "qvel")}
        return torch.as_tensor(np.concatenate([data["qpos"], data["qvel"]], -1), device=device)

    def evaluate() -> float:
        value = float("nan")
        if rank == 0:
            ev = pool.map("env", [{"evaluate_episodes": exp.eval_episodes, "reset_seed": 10_000 + seed,
                                   "deterministic": True}],
                          config={**env_cfg, "num_envs": exp.eval_episodes, "shard": -1, "physics_state": False},
                          weights=policy_key, affinity=[0])[0]
            value = float(np.mean(ev["episode_returns"]))
        shared = torch.tensor([value], dtype=torch.float64)
        ddp.broadcast_([shared], src=0)
        return float(shared.item())

    def retrain_model() -> dict[str, float]:
        if not real_wm:  # no prefill: nothing from the changed env yet
            return {}
        data = {k: np.concatenate([d[k] for d in real_wm]) for k in real_wm[0]}
        cfg = world_model_config(exp, pretrain=False, seed=seed * 1000 + counters["epoch"],
                                 ensemble=model.cfg.ensemble_size)
        if not exp.wm_refit_scalers:  # keep the stage-2 scalers (train_world_model refits them on ~1e3 rows)
            model.fit_normalizers = lambda batch: None
        try:
            out = train_world_model(model, data, cfg, EarlyStopping(exp.wm_patience, exp.wm_min_improvement))
        except ValueError as err:  # too few whole real episodes for a hold-out yet: keep the current model
            log.warning("world model retraining skipped: %s", err)
            return {}
        finally:
            model.__dict__.pop("fit_normalizers", None)
        return {"wm_error_1step": out["error_1step"], "wm_error_10step": out.get(f"error_{cfg.eval_horizon}step"),
                "wm_steps": out["steps"], "wm_train_s": out["train_seconds"]}

    metrics_log = MetricsLogger(run_path, flush_every=1) if rank == 0 else None
    progress = Progress(f"lift_finetune {method}", exp.epochs, "epochs") if rank == 0 else None
    method_id = float(METHODS.index(method))
    horizon, hupt = (LinearSchedule.from_list(exp.horizon_schedule, "horizon_schedule"),
                     LinearSchedule.from_list(exp.hupt_schedule, "hupt_schedule"))
    t_start = time.perf_counter() - counters["wall_s"]
    publish()
    if counters["real_env_steps"] == 0:
        if metrics_log is not None:  # the starting point of the curve: the pretrained policy in the changed env
            metrics_log.log(0, {"real_env_steps": 0, "eval_return": config["zero_shot_return"], "falls": 0,
                                "falls_total": 0, "method_id": method_id, "epoch": -1, "wall_s": 0.0,
                                "updates": agent.num_updates, **{f"wm_pretrain_{k}": v for k, v in wm_metrics.items()
                                                                 if isinstance(v, (int, float))}})
        if exp.prefill_steps:
            collect(exp.prefill_steps // world)

    def sac_step(sample) -> dict[str, float]:
        return update(agent, sample, sac_cfg)

    while counters["epoch"] < exp.epochs:
        epoch = counters["epoch"]
        stats.update(falls=0, episodes=0, action_rate=[])
        row: dict[str, Any] = {"method_id": method_id, "epoch": epoch}
        updates_before, model_transitions, train_metrics, rollout_metrics = agent.num_updates, 0, {}, {}
        if uses_model:
            if exp.wm_retrain_first:
                row.update(retrain_model())  # 1. the model follows the new env's data
            collect(exp.real_steps_per_epoch // world)  # 2. deterministic real steps
            if not exp.wm_retrain_first:
                row.update(retrain_model())
            states = real_states().to(model.delta_std.dtype)
            policy = lambda obs: unwrap(agent.actor).act(agent.obs_normalizer.normalize(obs), False, gen)  # noqa: E731
            h, k_rollouts = horizon(epoch), hupt(epoch)
            for _ in range(k_rollouts):  # 3. branch in the model, update on mostly model data
                start, _ = sample_start_states(states, exp.rollout_batch, gen)
                batch, rollout_metrics = branch_rollouts(model, start, policy, obs_fn, reward_fn, scale, h,
                                                         member="random" if method == "mbpo_wm" else "mean")
                if len(batch["reward"]):
                    model_buffer.add(batch)
                model_transitions += len(batch["reward"])
                if len(model_buffer) == 0:
                    continue
                sample = mixed_sampler(lambda n: real_buffer.sample(n, gen), lambda n: model_buffer.sample(n, gen),
                                       exp.real_ratio, gen)
                train_metrics = sac_step(sample)
            row.update(horizon=h, hupt=k_rollouts, model_transitions=model_transitions,
                       model_pred_std=rollout_metrics.get("model_pred_std", float("nan")))
        else:
            collected = 0
            per_chunk = max(1, exp.baseline_chunk_steps // world)
            while collected < exp.real_steps_per_epoch // world:
                n = collect(min(per_chunk, exp.real_steps_per_epoch // world - collected))
                collected += n
                n_updates = max(1, int(round(n * world * exp.baseline_updates_per_step / sac_cfg.utd)))
                for _ in range(n_updates):
                    train_metrics = sac_step(lambda m: real_buffer.sample(m, gen))
                publish()
        publish()
        eval_return = evaluate()  # 4.
        counters["epoch"] += 1
        counters["wall_s"] = time.perf_counter() - t_start
        rates = [r for r in stats["action_rate"] if np.isfinite(r)]
        row.update(real_env_steps=counters["real_env_steps"], eval_return=eval_return, falls=stats["falls"],
                   falls_total=counters["falls_total"], episodes=stats["episodes"],
                   action_rate=float(np.mean(rates)) if rates else float("nan"),
                   stochastic_requests=stats["stochastic_requests"], updates=agent.num_updates,
                   updates_epoch=agent.num_updates - updates_before, wall_s=counters["wall_s"], **train_metrics)
        if metrics_log is not None:
            metrics_log.log(counters["real_env_steps"], row)
            progress.update(counters["epoch"], eval_return=eval_return, falls=stats["falls"])
        with ddp.checkpoint_dir() as d:
            torch.save({"agent": agent.state_dict(), "real_buffer": real_buffer.state_dict(), "real_wm": real_wm,
                        "counters": counters, "gen": gen.get_state(),
                        "model": model.state_dict() if model is not None else None}, d / f"rank{rank}.pt")
            if rank == 0:
                torch.save(agent.policy_state(), d / "policy.pt")
            from experiments.lift.pretrain import _gather_checkpoint
            _gather_checkpoint(d, rank)
            ddp.report({k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and math.isfinite(float(v))},
                     checkpoint_dir=d)
    if metrics_log is not None:
        metrics_log.close()
        torch.save(agent.policy_state(), run_path / f"policy-{method}.pt")


# ------------------------------------------------------------------------------------------------------ driver

def evaluate_policy(pool, policy_key: str, task: str, change: dict | None, episodes: int, seed: int) -> float:
    """Deterministic evaluation return of the published policy, through the pool (same seeds as the learner's)."""
    cfg = {"task": task, "num_envs": episodes, "seed": seed, "change": change, "physics_state": False}
    ev = pool.map("env", [{"evaluate_episodes": episodes, "reset_seed": 10_000 + seed, "deterministic": True}],
                  config=cfg, weights=policy_key)[0]
    return float(np.mean(ev["episode_returns"]))


def summarise(df, methods: list[str], pre_change: float, zero_shot: float) -> dict[str, dict]:
    from algos.lift.finetune import steps_to_recover
    out = {}
    for m in methods:
        rows = df[df["method_id"] == METHODS.index(m)].sort_values("real_env_steps")
        ev = rows.dropna(subset=["eval_return"])
        trained = ev[ev["epoch"] >= 0]
        out[m] = {
            "final_return": float(trained["eval_return"].iloc[-1]) if len(trained) else None,
            "best_return": float(trained["eval_return"].max()) if len(trained) else None,
            "real_steps_to_recover": steps_to_recover(ev["real_env_steps"].to_numpy(), ev["eval_return"].to_numpy(),
                                                      pre_change, zero_shot),
            "falls": int(rows["falls_total"].max()) if "falls_total" in rows and len(rows) else 0,
            "real_steps": int(rows["real_env_steps"].max()) if len(rows) else 0,
            "wall_s": float(rows["wall_s"].max()) if len(rows) else 0.0,
        }
    return out


def plot_recovery(df, methods: list[str], pre_change: float, zero_shot: float, out: Path, title: str) -> Path:
    """Eval return vs real env steps per method (with the pre-change and zero-shot lines) and falls per method."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax_falls) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [2, 1]})
    for i, m in enumerate(methods):
        rows = df[df["method_id"] == METHODS.index(m)].sort_values("real_env_steps").dropna(subset=["eval_return"])
        ax.plot(rows["real_env_steps"], rows["eval_return"], marker="o", color=f"C{i}", label=m)
        ax_falls.bar(i, float(rows["falls_total"].max()) if len(rows) else 0.0, color=f"C{i}")
    ax.axhline(pre_change, color="k", ls="--", lw=1, label="pre-change")
    ax.axhline(zero_shot, color="grey", ls=":", lw=1, label="zero-shot")
    ax.axhline(zero_shot + 0.8 * (pre_change - zero_shot), color="k", ls="-.", lw=0.7, alpha=0.5, label="80% recovery")
    ax.set_xlabel("real env steps")
    ax.set_ylabel("eval return (deterministic, changed env)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax_falls.set_xticks(range(len(methods)), methods)
    ax_falls.set_ylabel("real-env falls during finetuning")
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def run(cfg: dict, ctx) -> dict[str, Any]:
    import torch

    from cluster.metrics import read_metrics
    from cluster.train import fit

    exp: Config = ctx.typed["experiment"]
    task = task_of(cfg)
    files = pretrain_files(exp.pretrain_run)
    change = exp.change or DEFAULT_CHANGES[task]
    methods = exp.method_list()
    pool = ctx.pool
    run_id = f"{cfg['experiment']['name']}/{ctx.run_dir.name}"
    pretrained_key = f"{run_id}/pretrained"
    pool.publish(pretrained_key, torch.load(files["policy"], weights_only=False))
    pre_change = evaluate_policy(pool, pretrained_key, task, None, exp.eval_episodes, cfg["seed"])
    zero_shot = evaluate_policy(pool, pretrained_key, task, change, exp.eval_episodes, cfg["seed"])
    log.info("pretrained policy: %.1f in the original env, %.1f zero-shot in the changed env (%s)", pre_change,
             zero_shot, change)
    for m in methods:
        loop = {"experiment": dataclasses.asdict(exp), "pool": dataclasses.asdict(ctx.typed["pool"]),
                "run_path": str(ctx.run_dir.path), "run_id": run_id, "task": task, "seed": cfg["seed"],
                "torch_threads": cfg["torch_threads"], "change": change, "method": m,
                "agent_path": str(files["agent"]), "replay": [str(p) for p in files["replay"]],
                "zero_shot_return": zero_shot}
        fit(train_fn, loop, name=f"learner-{m}", storage_path=ctx.run_dir.checkpoints, train=ctx.typed["train"])
    df = read_metrics(ctx.run_dir.path)
    plot = plot_recovery(df, methods, pre_change, zero_shot, ctx.run_dir.path / "plots" / "finetune_recovery.png",
                         f"LIFT finetuning on {TASKS[task]} with {change}")
    summary = {"task": TASKS[task], "change": change, "pre_change_return": pre_change, "zero_shot_return": zero_shot,
               "methods": summarise(df, methods, pre_change, zero_shot), "plot": str(plot)}
    for m, s in summary["methods"].items():
        print(f"LIFT finetune {TASKS[task]} [{m}]: final {s['final_return']}, best {s['best_return']}, recovered at "
              f"{s['real_steps_to_recover']} real steps, {s['falls']} falls, {s['wall_s']:.0f} s", flush=True)
    return summary
