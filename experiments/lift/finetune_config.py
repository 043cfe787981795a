"""``experiment.*`` of lift_finetune: the methods, the task's default change, LIFT's finetune SAC coefficients, the
loop's sizes and schedules, and the checks against the rest of the config (the task, the pretraining run's files)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MethodSpec:
    """One finetuning method: which world model (None: model-free), whether the real env only receives deterministic
    actions, and (model-free) how many SAC steps per real step: ``baseline_updates_per_step`` ("fixed") or exactly as
    many as LIFT's schedule does in the same epoch ("matched")."""

    model: str | None  # "physics" | "prior_only" | "residual_only" | "blackbox" | None
    deterministic_real: bool
    updates: str = "fixed"
    frozen_model: bool = False  # the stage-2 model is never refitted (does the refit carry LIFT's gain?)


# The order is the ``method_id`` of the metric rows: append, never reorder.
METHOD_SPECS: dict[str, MethodSpec] = {
    "lift": MethodSpec("physics", True),  # LIFT: physics-informed model, deterministic real actions
    "sac_finetune": MethodSpec(None, False),  # plain SAC finetuning, stochastic real actions, UTD 1
    "mbpo_wm": MethodSpec("blackbox", True),  # the same loop with MBPO's black-box ensemble
    "sac_finetune_matched": MethodSpec(None, False, "matched"),  # plain SAC at LIFT's SAC steps per real step
    "lift_stochastic": MethodSpec("physics", False),  # LIFT collecting with stochastic real actions
    "lift_prior_only": MethodSpec("prior_only", True),  # LIFT's model without the residual force (τ_θ = 0)
    "lift_residual_only": MethodSpec("residual_only", True),  # LIFT's model without the prior (M = I, no bias)
    # the 2x2's fourth cell (no model, deterministic real actions) at LIFT's SAC steps per real step
    "sac_deterministic": MethodSpec(None, True, "matched"),
    "lift_frozen_model": MethodSpec("physics", True, frozen_model=True),  # LIFT with the stage-2 model kept as it is
}
METHODS = tuple(METHOD_SPECS)
FINETUNE_TASKS = ("inverted_pendulum", "walker2d", "half_cheetah", "humanoid_state")
# A change per task where the pretrained policy clearly loses return. InvertedPendulum (a policy at 1000): gravity x4
# -> 236 zero-shot, a state-dependent force the residual can learn from deterministic data; gear x0.4 -> 454 is
# harder for a model fed only deterministic actions (see benchmarks/RESULTS.md). Walker2d: see the benchmark's tasks.
DEFAULT_CHANGES: dict[str, dict] = {
    "inverted_pendulum": {"name": "gravity", "scale": 4.0},
    "walker2d": {"name": "friction", "scale": 0.4},
    "half_cheetah": {"name": "friction", "scale": 0.4},
    "humanoid_state": {"name": "mass", "scale": 1.4},
}
# LIFT's finetune_sac_config (reference card §3.2). Finetuning always runs in fp32 (LIFT forces it).
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
    horizon_schedule: list[int] = field(default_factory=lambda: [0, 10, 1, 10])  # LIFT [0, 10, 1, 20]
    hupt_schedule: list[int] = field(default_factory=lambda: [0, 4, 10, 200])  # LIFT [0, 4, 10, 1000]
    updates_per_rollout: int = 20  # SAC steps per branch (LIFT 20)
    real_ratio: float = 0.06
    # The model buffer (LIFT's SAC buffer) holds model rollouts and every real step, is sized
    # min(HUPT(e)·rollout_batch·H(e), cap) whenever H changes and keeps its newest rows then (LIFT's
    # update_model_horizon); true empties it after every model refit (LIFT's clear_model_buffer_after_model_train,
    # false in its finetuning config).
    model_buffer_flush: bool = False
    model_buffer_capacity: int = 400_000
    # The actor sees model states through Gaussian noise of this many predicted stds (LIFT's
    # wm_noise_to_actor_noise: 1); 0 feeds it the model's mean.
    obs_noise: float = 1.0
    env_buffer_capacity: int = 60_000
    sac: dict = field(default_factory=dict)  # overrides of FINETUNE_SAC (actor_lr, critic_lr, ..., batch_size)
    load_optimizer_state: bool = True
    # The causes of LIFT's early dip (§3.4), as knobs; the paper's values are the defaults. LIFT resets the temperature
    # to e^init_log_alpha = e^-7.13 (load_alpha=false); true keeps the pretrained one and its Adam state. LIFT's
    # target-critic rate is tau = 0.001 (experiment.sac.tau); both slow the first epochs' learning.
    load_alpha: bool = False
    # LIFT's order retrains the model before collecting the epoch's real steps (it lags one epoch, harmless with a
    # 1000-step prefill and 1000-step epochs); false collects first, so with small epochs and no prefill the rollouts of
    # epoch e already branch from a model that has seen epoch e's data.
    wm_retrain_first: bool = True
    # LIFT folds the new env's observations into the running normalizer (its statistics rest on 4e7 pretraining
    # samples, ours on 1e4-2e5: on InvertedPendulum gear x0.4 the merge alone cost 454 -> 84 zero-shot; false keeps
    # the pretrained statistics). Every method does the same.
    update_normalizer: bool = True
    # LIFT refits the world model's scalers at each retraining; "refit" keeps the warm-started network's predictions
    # (WorldModel.refit_normalizers) so that the residual can grow; "refit_output" refits only the residual's (output)
    # scalers, keeping the input units of stage 2; "keep" freezes the stage-2 scalers.
    wm_scalers: str = "refit"
    baseline_updates_per_step: float = 1.0  # sac_finetune: SAC steps per real transition
    baseline_chunk_steps: int = 100  # sac_finetune: real transitions per request between update bursts
    wm_hidden: list[int] = field(default_factory=lambda: [200, 200, 200])  # LIFT 4 x 400
    wm_prior_mode: str = "frozen"  # "substep" for HalfCheetah
    wm_pretrain_steps: int = 1500
    wm_pretrain_rows: int = 50_000  # newest pretraining transitions used for stage 2
    # Stage 2 is fitted once per model kind with this seed and cached in the pretraining run (wm/), so every
    # finetuning seed starts from the same world model, as from the same pretrained policy.
    wm_pretrain_seed: int = 0
    wm_retrain_steps: int = 2000  # Adam steps at most per refit (LIFT: up to 1000 passes; its test loss stops it)
    wm_loss_horizon: int = 4  # LIFT finetuning: 4
    wm_eval_every: int = 100  # stage 2's hold-out check, in Adam steps (a refit checks after every pass, as LIFT)
    wm_patience: int = 6
    wm_min_improvement: float = 0.01
    blackbox_ensemble_size: int = 5
    eval_episodes: int = 5
    stop_at_recovery: bool = False  # end a method's finetuning at its first evaluation that recovers 80 % (tests)
    # The env of the pre-change return (the 100 % of recovery); None: the pretraining's own env (its change, e.g. its
    # command range). For an out-of-range command, the top of the pretraining range is the natural reference.
    reference_change: dict | None = None
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
        if self.wm_scalers not in ("refit", "refit_output", "keep"):
            raise ValueError(f"experiment.wm_scalers: 'refit', 'refit_output' or 'keep', got {self.wm_scalers!r}")
        if self.obs_noise < 0:
            raise ValueError(f"experiment.obs_noise: must be >= 0, got {self.obs_noise}")
        if self.wm_prior_mode not in ("frozen", "substep"):
            raise ValueError(f"experiment.wm_prior_mode: 'frozen' or 'substep', got {self.wm_prior_mode!r}")
        unknown = sorted(set(self.sac) - set(FINETUNE_SAC))
        if unknown:
            raise ValueError(f"experiment.sac.{unknown[0]}: unknown key (valid: {', '.join(sorted(FINETUNE_SAC))})")
        from algos.lift.sac import SACConfig
        try:  # the learner builds its SACConfig from these; a bad value fails here, not in a Train worker
            SACConfig(**self.finetune_sac())
        except ValueError as err:
            raise ValueError(f"experiment.sac: {err}") from None
        if not self.wm_hidden or min(self.wm_hidden) < 1:
            raise ValueError(f"experiment.wm_hidden: layer sizes >= 1, got {self.wm_hidden}")
        if self.wm_min_improvement < 0:
            raise ValueError(f"experiment.wm_min_improvement: must be >= 0, got {self.wm_min_improvement}")
        if self.device != "auto":
            import torch
            try:  # a learner resolves it on its worker; a typo fails here, at validation
                torch.device(self.device)
            except (RuntimeError, ValueError) as err:
                raise ValueError(f"experiment.device: 'auto' or a torch device, got {self.device!r} ({err})") from None
        for name in ("horizon_schedule", "hupt_schedule"):
            LinearSchedule.from_list(getattr(self, name), f"experiment.{name}")

    def method_list(self) -> list[str]:
        return self.methods or [self.method]

    def finetune_sac(self) -> dict:
        return {**FINETUNE_SAC, **{k: v for k, v in self.sac.items() if v is not None}}


def rank_share(exp: Config, world: int, rank: int) -> Config:
    """This rank's ``Config``. Sizes are the run's totals whatever ``train.num_workers`` is (as lift_pretrain's): the SAC
    batch is split evenly (DDP averages the ranks' gradients, so each update is one step at the global batch), the
    start states of each branch and the buffer capacities go to the ranks in near-equal shares; real steps per epoch
    and prefill are split where they are spent (``finetune_learner``). ``num_real_envs`` stays per rank: each rank's
    env shard needs whole episodes for the world model's hold-out."""
    import dataclasses

    from experiments.lift.pretrain_config import split
    return dataclasses.replace(
        exp, sac={**exp.sac, "batch_size": exp.finetune_sac()["batch_size"] // world},
        rollout_batch=split(exp.rollout_batch, world, rank),
        model_buffer_capacity=split(exp.model_buffer_capacity, world, rank),
        env_buffer_capacity=split(exp.env_buffer_capacity, world, rank))


def task_of(raw: dict) -> str:
    from experiments.lift.driver_common import env_task
    return env_task(raw, FINETUNE_TASKS, "lift_finetune needs a MuJoCo task with a physics prior and task reward")


def pretrain_change(pretrain_run: str | Path) -> dict | None:
    """The change the pretraining env had (``experiment.change`` of its config.yaml; None without one)."""
    import yaml
    path = Path(pretrain_run).expanduser() / "config.yaml"
    if not path.is_file():
        return None
    return (yaml.safe_load(path.read_text()).get("experiment") or {}).get("change")


def finetune_envs(exp: Config, task: str) -> tuple[dict, dict | None]:
    """The driver's two envs: the changed env every method finetunes in (``experiment.change``, else the task's
    ``DEFAULT_CHANGES``) and the reference env of the pre-change return (``experiment.reference_change``, else the
    pretraining run's own change)."""
    change = exp.change or DEFAULT_CHANGES[task]
    return change, exp.reference_change or pretrain_change(exp.pretrain_run)


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
    return {"run": run, "policy": run / "policy.pt", "agent": run / "agent.pt", "replay": replay}


def check(exp: Config, raw: dict) -> None:
    from envs.control.changes import parse_changes
    from experiments.config import ConfigError
    task = task_of(raw)
    world = int((raw.get("train") or {}).get("num_workers", 1))
    batch = exp.finetune_sac()["batch_size"]
    if batch % world:
        raise ConfigError(f"experiment.sac.batch_size: the global batch {batch} must split evenly over "
                          f"train.num_workers={world} (DDP averages equal shares)")
    if exp.rollout_batch < world:
        raise ConfigError(f"experiment.rollout_batch: {exp.rollout_batch} start states per branch cannot be shared by "
                          f"train.num_workers={world}")
    pretrain_files(exp.pretrain_run)
    change, reference = finetune_envs(exp, task)
    try:
        changes = parse_changes(change)
    except ValueError as err:
        raise ConfigError(f"experiment.change: {err}") from None
    import torch

    from envs.control.tasks import make_env
    # agent.pt was saved by a GPU learner; the head that checks the config may have no GPU
    agent = torch.load(pretrain_files(exp.pretrain_run)["agent"], weights_only=True, map_location="cpu")
    obs_dim = agent["arch"]["obs_dim"]
    for key, spec in (("change", change), ("reference_change", reference)):
        try:
            env = make_env(task, spec)
        except (ValueError, TypeError) as err:
            raise ConfigError(f"experiment.{key}: {err}") from None
        dim = env.observation_space.shape[0]
        env.close()
        if dim != obs_dim:
            raise ConfigError(f"experiment.{key}: the env observes {dim} numbers, the pretrained policy {obs_dim} (a "
                              f"velocity command must be in both the pretraining and the finetuning env: "
                              f"{{target_velocity: {{command_range: [v, v]}}, ...}})")
    if any(c.name == "target_velocity" for c in changes) and not pretrain_change(exp.pretrain_run):
        log.warning("experiment.change has a velocity command but the pretraining run records no change")
