"""``experiment.*`` of lift_pretrain: the SAC preset and its overrides, the round, evaluation and checkpoint
schedules, and the checks against the rest of the config (the task, the shard layout).

Sizes are global: ``sac.num_envs``, ``sac.batch_size``, ``sac.replay_capacity`` and ``sac.min_replay_size`` are the
run's totals (LIFT's 1000 envs and batch 1024 at scale=paper) whatever ``train.num_workers`` is; each Train worker
takes its share (``rank_share``), and every rank runs the same ``steps_per_round * utd`` DDP updates per round, so
the run makes G gradient steps (at the global batch) per vectorised step of all its envs, as LIFT does.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from envs.control.tasks import TASKS


@dataclass
class Config:
    sac_preset: str = "pendulum"
    sac: dict = field(default_factory=dict)  # overrides of the preset (algos.lift.sac.SACConfig fields)
    total_env_steps: int = 16_000
    num_shards: int = 1  # each Train worker's share of the sac.num_envs envs goes as this many pool requests
    steps_per_round: int = 8  # vectorised env steps per pool request; updates per round = steps_per_round * utd
    overlap: bool = True  # collect round k+1 while updating on round k (policy lag of one round)
    eval_every_steps: int = 2_000
    eval_episodes: int = 8
    checkpoint_every_updates: int = 2_000
    parquet_chunk: int = 4_096  # transitions per Parquet part
    physics_state: bool = True  # record qpos/qvel/ctrl for the world model (MuJoCo tasks)
    stop_return: float | None = None  # stop early once the evaluation return reaches this
    # envs.control.changes spec of the pretraining env itself, e.g. a velocity command for LIFT's OOD-command
    # finetuning: {name: target_velocity, command_range: [0, 1.5]} (stage 3 then asks for a command outside it)
    change: dict | None = None
    # start from a pretraining's agent file (its agent.pt: weights, optimisers, temperature, obs statistics) instead
    # of fresh weights, e.g. to go on training a policy under domain randomisation; the replay starts empty. A resumed
    # run keeps its own checkpoint.
    init_agent: str | None = None
    device: str = "auto"

    def __post_init__(self) -> None:
        from algos.lift.sac import PRESETS
        if self.sac_preset not in PRESETS:
            raise ValueError(f"experiment.sac_preset: unknown preset {self.sac_preset!r} (choose from {sorted(PRESETS)})")
        for key in ("total_env_steps", "num_shards", "steps_per_round", "eval_every_steps", "eval_episodes",
                    "checkpoint_every_updates", "parquet_chunk"):
            if getattr(self, key) < 1:
                raise ValueError(f"experiment.{key}: must be >= 1, got {getattr(self, key)}")
        if self.init_agent is not None and not Path(self.init_agent).is_file():
            raise ValueError(f"experiment.init_agent: no agent file at {self.init_agent!r} (a pretraining's agent.pt)")

    def sac_config(self):
        from algos.lift.sac import PRESETS, SACConfig
        from experiments.config import from_dict
        overrides = {k: v for k, v in self.sac.items() if v is not None}
        return from_dict(SACConfig, {**PRESETS[self.sac_preset], **overrides}, "experiment.sac")


def split(total: int, parts: int, index: int) -> int:
    """Part ``index`` of ``total`` split into ``parts`` near-equal integers (the first ``total % parts`` get one more)."""
    return total // parts + (1 if index < total % parts else 0)


def rank_share(sac, world: int, rank: int):
    """This rank's ``SACConfig``: its share of the global envs, replay and warm-up, and batch / world (DDP averages the
    ranks' gradients, so the global batch is the preset's). ``check`` has made sure the shares are whole."""
    return dataclasses.replace(sac, num_envs=split(sac.num_envs, world, rank),
                               replay_capacity=split(sac.replay_capacity, world, rank),
                               min_replay_size=max(1, -(-sac.min_replay_size // world)),
                               batch_size=sac.batch_size // world)


def task_of(raw: dict) -> str:
    from experiments.lift.driver_common import env_task
    return env_task(raw, TASKS, "unknown task; choose one of the control tasks")


def check(exp: Config, raw: dict) -> None:
    from envs.control.changes import parse_changes
    from experiments.config import ConfigError
    sac = exp.sac_config()  # validates experiment.sac against SACConfig, naming the key
    world = int((raw.get("train") or {}).get("num_workers", 1))
    if sac.batch_size % world:
        raise ConfigError(f"experiment.sac.batch_size: the global batch {sac.batch_size} must split evenly over "
                          f"train.num_workers={world} (DDP averages equal shares)")
    if sac.num_envs < world * exp.num_shards:
        raise ConfigError(f"experiment.sac.num_envs: {sac.num_envs} envs in all cannot fill train.num_workers={world} "
                          f"x experiment.num_shards={exp.num_shards} shards")
    task = task_of(raw)
    if exp.change:
        from envs.control.tasks import make_env
        try:
            parse_changes(exp.change)
            make_env(task, exp.change).close()  # a change that does not apply to the task fails here, not in a worker
        except (ValueError, TypeError) as err:
            raise ConfigError(f"experiment.change: {err}") from None
