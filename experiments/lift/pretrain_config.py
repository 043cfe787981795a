"""``experiment.*`` of lift_pretrain: the SAC preset and its overrides, the round, evaluation and checkpoint
schedules, and the checks against the rest of the config (the task, the shard layout)."""
from __future__ import annotations

from dataclasses import dataclass, field

from envs.control.tasks import TASKS


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
    # envs.control.changes spec of the pretraining env itself, e.g. a velocity command for LIFT's OOD-command
    # finetuning: {name: target_velocity, command_range: [0, 1.5]} (stage 3 then asks for a command outside it)
    change: dict | None = None
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


def task_of(raw: dict) -> str:
    from experiments.lift.driver_common import env_task
    return env_task(raw, TASKS, "unknown task; choose one of the control tasks")


def check(exp: Config, raw: dict) -> None:
    from envs.control.changes import parse_changes
    from experiments.config import ConfigError
    sac = exp.sac_config()  # validates experiment.sac against SACConfig, naming the key
    if sac.num_envs % exp.num_shards:
        raise ConfigError(f"experiment.num_shards: {exp.num_shards} must divide sac.num_envs={sac.num_envs}")
    task = task_of(raw)
    if exp.change:
        from envs.control.tasks import make_env
        try:
            parse_changes(exp.change)
            make_env(task, exp.change).close()  # a change that does not apply to the task fails here, not in a worker
        except (ValueError, TypeError) as err:
            raise ConfigError(f"experiment.change: {err}") from None
