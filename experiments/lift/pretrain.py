"""LIFT stage 1: large-batch, high-UTD SAC pretraining; env rollouts on the shared pool, learner on Ray Train.

    python -m experiments.run experiment=lift_pretrain env=pendulum scale=smoke
    python -m experiments.run experiment=lift_pretrain env=humanoid scale=paper cluster=remote

One round (LIFT's training step, per Train worker = rank):
    1. take the transitions of the round in flight (``steps_per_round`` vectorised steps of every env shard of this
       rank, acted by the policy version published before the previous updates) and immediately send the next
       round to the pool, so acting overlaps learning (``overlap=true``; the policy lag is reported);
    2. merge the new observations into the normalizer (all ranks pool their statistics: identical normalizers),
       append them to the replay ring and, in chunks, to Parquet (stage 2 trains the world model from it);
    3. ``steps_per_round * utd`` SAC updates (G per vectorised env step) at batch B; DDP all-reduces gradients;
    4. rank 0 publishes the new policy version to the pool; evaluation, metrics and checkpoints on schedule.
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

MUJOCO_TASKS = {"humanoid", "humanoid_state", "inverted_pendulum", "half_cheetah", "walker2d", "hopper"}


@dataclass
class Config:
    sac_preset: str = "pendulum"
    sac: dict = field(default_factory=dict)  # overrides of the preset (algos.lift.sac.SACConfig fields)
    total_env_steps: int = 16_000
    num_shards: int = 1  # the sac.num_envs envs of each Train worker are split into this many pool requests
    steps_per_round: int = 8  # vectorised env steps per pool request; updates per round = steps_per_round * utd
    overlap: bool = True  # collect round k+1 while updating on round k (policy lag of one round)
    eval_every_steps: int = 2_000
    eval_episodes: int = 8
    checkpoint_every_updates: int = 2_000
    parquet_chunk: int = 4_096  # transitions per Parquet part
    physics_state: bool = True  # record qpos/qvel/ctrl for the world model (MuJoCo tasks)
    stop_return: float | None = None  # stop early once the evaluation return reaches this
    device: str = "auto"

    def __post_init__(self) -> None:
        from algos.lift.sac import PRESETS
        if self.sac_preset not in PRESETS:
            raise ValueError(f"experiment.sac_preset: unknown preset {self.sac_preset!r} (choose from {sorted(PRESETS)})")
        for key in ("total_env_steps", "num_shards", "steps_per_round", "eval_every_steps", "eval_episodes",
                    "checkpoint_every_updates", "parquet_chunk"):
            if getattr(self, key) < 1:
                raise ValueError(f"experiment.{key}: must be >= 1, got {getattr(self, key)}")

    def sac_config(self):
        from algos.lift.sac import PRESETS, SACConfig
        from experiments.config import from_dict
        overrides = {k: v for k, v in self.sac.items() if v is not None}
        return from_dict(SACConfig, {**PRESETS[self.sac_preset], **overrides}, "experiment.sac")


def check(exp: Config, raw: dict) -> None:
    sac = exp.sac_config()  # validates experiment.sac against SACConfig, naming the key
    if sac.num_envs % exp.num_shards:
        from experiments.config import ConfigError
        raise ConfigError(f"experiment.num_shards: {exp.num_shards} must divide sac.num_envs={sac.num_envs}")
    task_of(raw)


def task_of(raw: dict) -> str:
    task = (raw.get("env") or {}).get("task")
    if task not in TASKS:
        from experiments.config import ConfigError
        raise ConfigError(f"env.task: unknown task {task!r} (choose from {', '.join(sorted(TASKS))})")
    return task


# ------------------------------------------------------------------------------------------ learner (Train worker)

def _sampler_config(task: str, exp: Config, seed: int, shard: int, run: str, change: dict | None) -> dict:
    return {"task": task, "num_envs": exp.sac_config().num_envs // exp.num_shards, "seed": seed * 1000 + shard,
            "physics_state": exp.physics_state and task in MUJOCO_TASKS, "run": run, "shard": shard,
            "change": change}


def _sync_normalizer(normalizer, obs: np.ndarray) -> None:
    """Merge a batch into the normalizer with the statistics of every rank's batch (identical on all ranks)."""
    import torch
    from cluster import ddp
    x = torch.as_tensor(obs, dtype=torch.float64).reshape(-1, *normalizer.shape)
    moments = torch.stack([torch.full_like(x[0], float(len(x))), x.sum(0), x.square().sum(0)])
    ddp.all_reduce_mean_([moments])
    moments *= ddp.world_size()
    n = moments[0][0] if moments.ndim > 1 else moments[0]
    mean = moments[1] / n
    var = (moments[2] / n - mean.square()).clamp_min(0.0)
    normalizer.merge_({"mean": mean, "var": var, "count": n})


def train_fn(config: dict) -> None:
    import torch

    from algos.lift.replay import ReplayBuffer
    from algos.lift.sac import SACAgent, update
    from cluster import ddp
    from cluster.metrics import MetricsLogger, Progress
    from cluster.store import ParquetStore
    from experiments.registry import attach_pool

    ddp.set_threads(config["torch_threads"])
    ddp.quiet_logs()
    exp = Config(**config["experiment"])
    sac = exp.sac_config()
    rank, world = ddp.rank(), ddp.world_size()
    run_path = Path(config["run_path"])
    task, seed = config["task"], config["seed"]
    device = torch.device("cuda" if exp.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if exp.device == "auto" else exp.device))

    probe = __import__("envs.control.tasks", fromlist=["make_env"]).make_env(task)
    obs_dim, act_dim = probe.observation_space.shape[0], probe.action_space.shape[0]
    probe.close()
    torch.manual_seed(seed)  # same initial weights and target critic on every rank
    agent = SACAgent(obs_dim, act_dim, sac, device=device)
    fields = {"obs": ((obs_dim,), torch.float32), "action": ((act_dim,), torch.float32),
              "reward": ((), torch.float32), "next_obs": ((obs_dim,), torch.float32),
              "terminated": ((), torch.float32), "truncated": ((), torch.float32)}
    buffer = ReplayBuffer(sac.replay_capacity, fields, device=device)
    store = ParquetStore(run_path / "data" / f"replay-rank{rank}")
    sample_gen = torch.Generator(device=device).manual_seed(seed * 7 + rank)
    counters = {"env_steps": 0, "rounds": 0, "wall_s": 0.0, "parquet_parts": 0, "resumed_from": -1}
    with ddp.latest_checkpoint() as ckpt:
        if ckpt is not None:
            state = torch.load(ckpt / f"rank{rank}.pt", weights_only=False)
            agent.load_state_dict(state["agent"])
            buffer.load_state_dict(state["buffer"])
            counters = state["counters"]
            sample_gen.set_state(state["sample_gen"])
            counters["resumed_from"] = counters["env_steps"]
            removed = store.rollback(counters["parquet_parts"])
            log.info("rank %d resumed at %d env steps, %d updates, buffer %d (dropped %d Parquet parts written "
                     "after the checkpoint)", rank, counters["env_steps"], agent.num_updates, len(buffer), removed)
    agent.wrap(ddp.wrap_ddp)

    pool = attach_pool(config["pool"])
    policy_key = f"{config['run_id']}/policy"
    shards = [rank * exp.num_shards + s for s in range(exp.num_shards)]
    env_cfgs = [_sampler_config(task, exp, seed, g, config["run_id"], config.get("change")) for g in shards]
    steps_per_round_all = world * sac.num_envs * exp.steps_per_round

    def publish() -> None:
        if rank == 0:
            pool.publish(policy_key, agent.policy_state())
        ddp.barrier()

    def submit_round(first: bool):
        # one request per shard; shard g always goes to the same pool worker (its envs live there)
        reqs = [{"steps": exp.steps_per_round, **({"reset_seed": c["seed"] + counters["env_steps"]} if first else {})}
                for c in env_cfgs]
        return [pool.submit("env", [r], config=c, weights=policy_key, affinity=[g])
                for r, c, g in zip(reqs, env_cfgs, shards)]

    metrics_log = MetricsLogger(run_path, flush_every=20) if rank == 0 else None
    progress = Progress(f"lift_pretrain rank{rank}", exp.total_env_steps, "env steps") if rank == 0 else None
    publish()
    pending = submit_round(first=True)
    pending_chunk: list[dict] = []
    last_eval = counters["env_steps"] - exp.eval_every_steps if counters["env_steps"] == 0 else counters["env_steps"]
    last_ckpt_updates = agent.num_updates
    t_start = time.perf_counter() - counters["wall_s"]
    eval_return = float("nan")
    episode_returns: list[float] = []
    terminations = 0
    while counters["env_steps"] < exp.total_env_steps:
        results = [p.result()[0] for p in pending]
        if exp.overlap:
            pending = submit_round(first=False)
        batch = {k: np.concatenate([r["transitions"][k] for r in results]) for k in results[0]["transitions"]}
        lag = agent.num_updates - min(int(r["policy_updates"]) for r in results)
        for r in results:
            episode_returns.extend(r["episode_returns"].tolist())
            terminations += int(r["terminations"])
        _sync_normalizer(agent.obs_normalizer, batch["obs"])
        buffer.add({k: batch[k] for k in fields})
        pending_chunk.append(batch)
        if sum(len(b["reward"]) for b in pending_chunk) >= exp.parquet_chunk:
            store.append({k: np.concatenate([b[k] for b in pending_chunk]) for k in pending_chunk[0]})
            counters["parquet_parts"] += 1
            pending_chunk = []
        counters["env_steps"] += steps_per_round_all
        counters["rounds"] += 1
        train_metrics: dict[str, float] = {}
        t_update = time.perf_counter()
        n_updates = 0
        if len(buffer) >= sac.min_replay_size:
            for _ in range(exp.steps_per_round):
                train_metrics = update(agent, lambda n: buffer.sample(n, sample_gen), sac)
                n_updates += sac.utd
        update_s = time.perf_counter() - t_update
        publish()
        if not exp.overlap:
            pending = submit_round(first=False)

        row = {"env_steps": counters["env_steps"], "updates": agent.num_updates, "buffer": len(buffer),
               "policy_lag_updates": lag, "updates_per_s": n_updates / max(update_s, 1e-9),
               "wall_s": time.perf_counter() - t_start, "resumed_from": counters["resumed_from"], **train_metrics}
        if episode_returns:
            row["train_return"] = float(np.mean(episode_returns))
            row["falls"] = terminations
            episode_returns, terminations = [], 0
        if counters["env_steps"] - last_eval >= exp.eval_every_steps or counters["env_steps"] >= exp.total_env_steps:
            last_eval = counters["env_steps"]
            if rank == 0:
                ev = pool.map("env", [{"evaluate_episodes": exp.eval_episodes, "reset_seed": 10_000 + seed,
                                       "deterministic": True}],
                              config={**env_cfgs[0], "shard": -1, "physics_state": False}, weights=policy_key)[0]
                eval_return = float(np.mean(ev["episode_returns"]))
            shared = torch.tensor([eval_return], dtype=torch.float64)
            ddp.broadcast_([shared], src=0)  # every rank takes the same stop decision
            eval_return = float(shared.item())
            row["eval_return"] = eval_return
        ckpt_due = agent.num_updates - last_ckpt_updates >= exp.checkpoint_every_updates
        done = counters["env_steps"] >= exp.total_env_steps or (
            exp.stop_return is not None and eval_return >= exp.stop_return)
        if (done or ckpt_due) and pending_chunk:
            # a checkpoint covers exactly the Parquet parts written so far: flush the partial chunk first
            store.append({k: np.concatenate([b[k] for b in pending_chunk]) for k in pending_chunk[0]})
            counters["parquet_parts"] += 1
            pending_chunk = []
        if done:
            row["param_max_abs_diff"] = _param_divergence(agent)
        if metrics_log is not None:
            metrics_log.log(counters["env_steps"], row)
            progress.update(counters["env_steps"], eval_return=eval_return, updates=agent.num_updates)
        if ckpt_due or done:
            counters["wall_s"] = time.perf_counter() - t_start
            last_ckpt_updates = agent.num_updates
            with ddp.checkpoint_dir() as d:
                torch.save({"agent": agent.state_dict(), "buffer": buffer.state_dict(), "counters": counters,
                            "sample_gen": sample_gen.get_state()}, d / f"rank{rank}.pt")
                if rank == 0:
                    torch.save(agent.policy_state(), d / "policy.pt")
                _gather_checkpoint(d, rank)
                if metrics_log is not None:
                    metrics_log.flush()
                ddp.report(_reportable(row), checkpoint_dir=d)
        elif counters["rounds"] % 10 == 0 or done:
            ddp.report(_reportable(row))
        if done:
            break
    for p in pending if exp.overlap else []:
        p.result()
    if metrics_log is not None:
        metrics_log.close()
        if rank == 0:
            torch.save(agent.policy_state(), run_path / "policy.pt")
            torch.save(agent.state_dict(), run_path / "agent.pt")


def _reportable(row: dict) -> dict:
    return {k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}


def _param_divergence(agent) -> float:
    """Largest parameter difference between this rank and rank 0 (0 when DDP keeps them identical)."""
    import torch
    from algos.lift.sac import unwrap
    from cluster import ddp
    flat = torch.cat([p.detach().flatten().double() for m in (agent.actor, agent.critic)
                      for p in unwrap(m).parameters()])
    ref = flat.clone()
    ddp.broadcast_([ref], src=0)
    diff = (flat - ref).abs().max().reshape(1)
    ddp.all_reduce_mean_([diff])  # mean of non-negative diffs is 0 iff all are 0
    return float(diff.item()) * ddp.world_size()


def _gather_checkpoint(d: Path, rank: int) -> None:
    """Every rank's state must land in rank 0's checkpoint directory: ranks > 0 send theirs through torch.distributed."""
    from cluster import ddp
    if ddp.world_size() == 1:
        return
    import torch.distributed as dist
    payload = (d / f"rank{rank}.pt").read_bytes()
    gathered: list[Any] = [None] * ddp.world_size()
    dist.all_gather_object(gathered, payload)
    if rank == 0:
        for r, data in enumerate(gathered):
            (d / f"rank{r}.pt").write_bytes(data)


# ------------------------------------------------------------------------------------------------------ driver

def loop_config(cfg: dict, ctx, task: str, change: dict | None = None) -> dict:
    return {"experiment": dataclasses.asdict(ctx.typed["experiment"]), "pool": dataclasses.asdict(ctx.typed["pool"]),
            "run_path": str(ctx.run_dir.path), "run_id": f"{cfg['experiment']['name']}/{ctx.run_dir.name}",
            "task": task, "seed": cfg["seed"], "torch_threads": cfg["torch_threads"], "change": change}


def plot_learning_curve(run_path: Path, title: str) -> Path | None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cluster.metrics import read_metrics
    df = read_metrics(run_path)
    if "eval_return" not in df:
        return None
    ev = df.dropna(subset=["eval_return"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    axes[0].plot(ev["env_steps"], ev["eval_return"], marker="o")
    axes[0].set_xlabel("env steps")
    axes[1].plot(ev["wall_s"], ev["eval_return"], marker="o", color="C1")
    axes[1].set_xlabel("wall time (s)")
    for ax in axes:
        ax.set_ylabel("eval return (deterministic)")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    out = run_path / "plots" / "learning_curve.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def run(cfg: dict, ctx) -> dict[str, Any]:
    from cluster.metrics import read_metrics
    from cluster.train import fit

    task = task_of(cfg)
    ctx.pool  # create the pool (named) before the learner attaches to it
    result = fit(train_fn, loop_config(cfg, ctx, task), name="learner", storage_path=ctx.run_dir.checkpoints,
                 train=ctx.typed["train"])
    plot = plot_learning_curve(ctx.run_dir.path, f"LIFT pretraining on {TASKS[task]}")
    df = read_metrics(ctx.run_dir.path)
    ev = df.dropna(subset=["eval_return"]) if "eval_return" in df else df.iloc[:0]
    summary = {
        "task": TASKS[task], "env_steps": int(df["env_steps"].iloc[-1]), "updates": int(df["updates"].iloc[-1]),
        "final_eval_return": float(ev["eval_return"].iloc[-1]) if len(ev) else None,
        "best_eval_return": float(ev["eval_return"].max()) if len(ev) else None,
        "first_eval_return": float(ev["eval_return"].iloc[0]) if len(ev) else None,
        "wall_s": float(df["wall_s"].iloc[-1]), "train_workers": ctx.typed["train"].num_workers,
        "param_max_abs_diff": float(df["param_max_abs_diff"].dropna().iloc[-1]) if "param_max_abs_diff" in df else None,
        "policy": str(ctx.run_dir.path / "policy.pt"), "replay": str(ctx.run_dir.path / "data"),
        "plot": str(plot) if plot else None, "checkpoint": str(result.checkpoint.path) if result.checkpoint else None,
    }
    print(f"LIFT pretrain {summary['task']}: eval return {summary['final_eval_return']} after "
          f"{summary['env_steps']} env steps, {summary['updates']} updates, {summary['wall_s']:.0f} s", flush=True)
    return summary
