"""Ray Tune for sweeps: the sweep config and its search space, the scheduler, running (or restoring) the Tuner, a
trial's reports and checkpoints, the results table and plot.

Experiment-agnostic: ``experiments.sweep`` wires it to ``experiments.run`` (see the format there). Parameters are
flat dotted config keys (``experiment.envs_per_shard``) so a sampled point is a list of hydra overrides.
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

log = logging.getLogger(__name__)

KINDS = ("choice", "grid", "uniform", "loguniform")
# Keys a trial must not vary: the shared pool and the cluster are one per cluster, run bookkeeping is the sweep's.
FIXED_PREFIXES = ("pool.", "cluster.", "sweep.", "output_dir", "run_name", "resume")


@dataclass
class SchedulerConfig:
    """``fifo`` runs every trial to the end; ``asha`` stops poor trials at rungs ``grace_period * rf^k``;
    ``pbt`` periodically replaces the worst ``quantile_fraction`` by mutated copies of the best (needs checkpoints)."""

    name: Literal["fifo", "asha", "pbt"] = "asha"
    max_t: int = 100  # iterations (reports) a trial may run at most (ASHA)
    grace_period: int = 1
    reduction_factor: float = 2.0
    perturbation_interval: int = 2  # PBT: iterations between exploit/explore steps
    quantile_fraction: float = 0.25
    resample_probability: float = 0.25

    def __post_init__(self) -> None:
        if self.max_t < 1 or self.grace_period < 1 or self.grace_period > self.max_t:
            raise ValueError(f"sweep.scheduler: need 1 <= grace_period <= max_t, got {self.grace_period}/{self.max_t}")
        if self.reduction_factor <= 1:
            raise ValueError(f"sweep.scheduler.reduction_factor: must be > 1, got {self.reduction_factor}")
        if self.perturbation_interval < 1:
            raise ValueError(f"sweep.scheduler.perturbation_interval: must be >= 1, got {self.perturbation_interval}")
        if not 0 < self.quantile_fraction <= 0.5:
            raise ValueError(f"sweep.scheduler.quantile_fraction: must be in (0, 0.5], got {self.quantile_fraction}")


@dataclass
class SweepConfig:
    space: dict[str, Any]
    metric: str
    mode: Literal["min", "max"] = "max"
    num_samples: int = 1  # samples of the random part of the space, per grid point
    max_concurrent: int = 2
    trial_cpus: float = 0.05  # the trial's driver only: its pool requests and learners ask for their own resources
    max_failures: int = 1  # a crashed trial is retried this often, from its last checkpoint
    keep_checkpoints: int = 4
    best_scope: Literal["last", "avg", "all", "last-5-avg", "last-10-avg"] = "last"
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    description: str = ""
    params: dict[str, tuple[str, list]] = field(init=False, repr=False)  # the space, flattened to dotted keys

    def __post_init__(self) -> None:
        if self.num_samples < 1:
            raise ValueError(f"sweep.num_samples: must be >= 1, got {self.num_samples}")
        if self.max_concurrent < 1:
            raise ValueError(f"sweep.max_concurrent: must be >= 1, got {self.max_concurrent}")
        if self.trial_cpus <= 0:
            raise ValueError(f"sweep.trial_cpus: must be > 0 (Ray rejects 0; use a fraction), got {self.trial_cpus}")
        if self.max_failures < 0:
            raise ValueError(f"sweep.max_failures: must be >= 0, got {self.max_failures}")
        self.params = flatten_space(self.space)  # validates every leaf
        if self.scheduler.name == "pbt" and all(kind == "grid" for kind, _ in self.params.values()):
            raise ValueError("sweep.scheduler.name: pbt needs at least one choice/uniform/loguniform parameter")


def flatten_space(space: dict[str, Any], prefix: str = "") -> dict[str, tuple[str, list]]:
    """``{experiment: {lr: {loguniform: [1e-4, 1e-2]}}}`` -> ``{"experiment.lr": ("loguniform", [1e-4, 1e-2])}``."""
    if not isinstance(space, dict) or not space:
        raise ValueError(f"sweep.space{'.' + prefix.rstrip('.') if prefix else ''}: expected a non-empty mapping")
    out: dict[str, tuple[str, list]] = {}
    for key, value in space.items():
        path = f"{prefix}{key}"
        where = f"sweep.space.{path}"
        if path.startswith(FIXED_PREFIXES):
            raise ValueError(f"{where}: cannot be swept (one shared pool/cluster per sweep; the sweep names runs)")
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            out.update(flatten_space(value, f"{path}."))  # a section of the config, e.g. experiment:
        elif isinstance(value, dict) and len(value) == 1 and next(iter(value)) in KINDS:
            kind, args = next(iter(value.items()))
            out[path] = (kind, _check_leaf(kind, args, where))
        else:
            raise ValueError(f"{where}: expected {{kind: [...]}} with kind one of {', '.join(KINDS)}, "
                             f"or a nested mapping; got {value!r}")
    return out


def _check_leaf(kind: str, args: Any, where: str) -> list:
    if not isinstance(args, (list, tuple)) or not args:
        raise ValueError(f"{where}.{kind}: expected a non-empty list, got {args!r}")
    args = list(args)
    if kind in ("uniform", "loguniform"):
        if len(args) != 2 or not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args):
            raise ValueError(f"{where}.{kind}: expected [low, high] numbers, got {args!r}")
        low, high = args
        if not low < high:
            raise ValueError(f"{where}.{kind}: low must be < high, got {args!r}")
        if kind == "loguniform" and low <= 0:
            raise ValueError(f"{where}.loguniform: bounds must be > 0, got {args!r}")
    return args


def tune_space(params: dict[str, tuple[str, list]]) -> dict[str, Any]:
    """The Tune ``param_space`` for flattened parameters."""
    from ray import tune
    make = {"choice": tune.choice, "grid": tune.grid_search,
            "uniform": lambda a: tune.uniform(*a), "loguniform": lambda a: tune.loguniform(*a)}
    return {key: make[kind](args) for key, (kind, args) in params.items()}


def representative(params: dict[str, tuple[str, list]]) -> dict[str, Any]:
    """One point of the space (first choices, geometric/arithmetic mid-points): validated before anything runs."""
    out = {}
    for key, (kind, args) in params.items():
        if kind in ("choice", "grid"):
            out[key] = args[0]
        elif kind == "uniform":
            out[key] = (args[0] + args[1]) / 2
        else:
            out[key] = (args[0] * args[1]) ** 0.5
    return out


def scheduler(cfg: SweepConfig):
    """The Tune trial scheduler named by ``cfg.scheduler.name`` (metric/mode come from the TuneConfig)."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining
    s = cfg.scheduler
    if s.name == "fifo":
        return FIFOScheduler()
    if s.name == "asha":
        return ASHAScheduler(time_attr="training_iteration", max_t=s.max_t, grace_period=s.grace_period,
                             reduction_factor=s.reduction_factor)
    from ray import tune
    mutations = {}
    for key, (kind, args) in cfg.params.items():
        if kind in ("choice", "grid"):
            mutations[key] = list(args)
        else:
            mutations[key] = tune.uniform(*args) if kind == "uniform" else tune.loguniform(*args)
    return PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=s.perturbation_interval,
                                   hyperparam_mutations=mutations, quantile_fraction=s.quantile_fraction,
                                   resample_probability=s.resample_probability)


# Left unquoted only if hydra cannot read it as anything but a string (``0123_45`` would be an int, ``1e5`` a float).
_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_./:-]*$")


def override(key: str, value: Any) -> str:
    """``key=value`` in hydra's override grammar (strings quoted when needed)."""
    return f"{key}={_format(value)}"


def _format(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if _PLAIN.match(value) and value.lower() not in ("null", "true", "false", "nan", "inf"):
            return value
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_format(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_format(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"cannot express {value!r} as a hydra override")


def results_table(result_grid, params: list[str]):
    """Every reported iteration of every trial: ``trial_id``, ``training_iteration``, metrics, the parameters."""
    import pandas as pd
    frames = []
    for result in result_grid:
        df = result.metrics_dataframe
        if df is None or df.empty:
            continue
        df = df.copy()
        config = result.config or {}
        for key in params:
            df[f"config/{key}"] = config.get(key)
        df["trial_id"] = df["trial_id"] if "trial_id" in df else Path(result.path).name
        df["error"] = result.error is not None
        frames.append(df)
    if not frames:
        return pd.DataFrame()
    table = pd.concat(frames, ignore_index=True)
    keep = [c for c in table.columns if table[c].map(lambda v: v is None or isinstance(v, (int, float, str, bool))).all()]
    return table[keep].sort_values(["trial_id", "training_iteration"]).reset_index(drop=True)


def plot_trials(table, metric: str, path: str | Path, params: list[str], title: str = "") -> Path:
    """One line per trial: ``metric`` over training iterations, labelled with the trial's parameters."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for trial_id, df in (table.groupby("trial_id") if "trial_id" in table else []):
        if metric not in df:
            continue
        label = " ".join(f"{k.rsplit('.', 1)[-1]}={_short(df[f'config/{k}'].iloc[0])}" for k in params)
        ax.plot(df["training_iteration"], df[metric], marker="o", ms=3, label=f"{trial_id[-5:]} {label}")
    ax.set_xlabel("iteration")
    ax.set_ylabel(metric)
    ax.set_title(title or f"{metric} per trial")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


# ------------------------------------------------------------------------------------------------ running a sweep

_SESSION_TIME = re.compile(r"-\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}(?=\.\w+$)")


class SweepStateError(RuntimeError):
    """Tune's saved state of a sweep cannot be read back, so a resume cannot know which trials remain."""


def check_resumable(storage: Path) -> None:
    """Refuse, in one line, to resume from a Tune state file that a kill cut short.

    Tune writes its state in the driver's staging folder and copies it into ``storage`` file by file. Sweeps write
    through ``cluster.whole_files``, so a kill during that copy leaves the previous whole file; a sweep folder written
    without it (or edited by hand) can still hold a truncated one. Tune would then log the failed restore and silently
    start the sweep over, with a trial that has none of the sweep's parameters (seen once before whole files)."""
    import json

    import ray.cloudpickle as cloudpickle
    newest: dict[str, Path] = {}  # Tune reads only the newest file of each kind (names end in the session's time)
    for path in sorted([*storage.glob("*.json"), *storage.glob("*.pkl")]):
        if not path.name.startswith("."):  # Tune's own temporary files
            newest[_SESSION_TIME.sub("", path.name)] = path
    for path in newest.values():
        try:
            if path.name.startswith("experiment_state"):
                json.loads(path.read_text())
            else:  # the search algorithm's and the callbacks' state: pickles, whatever the suffix
                with path.open("rb") as f:
                    cloudpickle.load(f)
        except Exception as err:  # noqa: BLE001 - any failure to read it back is the same refusal
            raise SweepStateError(
                f"cannot resume sweep {storage}: Tune's state file {path.name} is incomplete ({type(err).__name__}); "
                f"the sweep was killed while Tune copied it. Start it again under a new run_name (finished trials' "
                f"records stay in this run's trials/ folder)") from None


def run_sweep(trainable: Callable[..., None], sweep: SweepConfig, storage: Path, *, resume: bool,
              **trainable_kwargs: Any):
    """Run (or, with ``resume``, restore and finish) the sweep: ``trainable(params, **trainable_kwargs)`` per trial,
    Tune's state under ``storage``. Returns Tune's ``ResultGrid``."""
    from ray import tune

    from cluster.whole_files import whole_files_filesystem
    wrapped = tune.with_resources(tune.with_parameters(trainable, **trainable_kwargs), {"cpu": sweep.trial_cpus})
    # Learners report evaluation metrics only every few iterations; ASHA and PBT skip results without the metric.
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    # With num_to_keep set, Tune snapshots its state whenever a trial has made that many checkpoints, and warns
    # ("may become a bottleneck") when two snapshots fall within 5 s: every few seconds on smoke sweeps, whose trials
    # report (and checkpoint) each second or so. Our snapshots are a few small files written whole in ~20 ms
    # (cluster/whole_files.py), so that warning is noise here; a user's own threshold still wins.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    pbt = sweep.scheduler.name == "pbt"
    storage = storage.resolve()  # the filesystem below takes paths as they are, in every trial's working directory
    filesystem = whole_files_filesystem()  # a kill while Tune copies its state leaves the last whole copy
    if resume and tune.Tuner.can_restore(str(storage)):
        check_resumable(storage)
        log.info("restoring sweep %s", storage)
        tuner = tune.Tuner.restore(str(storage), trainable=wrapped, resume_unfinished=True, resume_errored=True,
                                   storage_filesystem=filesystem)
    else:
        tuner = tune.Tuner(
            wrapped, param_space=tune_space(sweep.params),
            tune_config=tune.TuneConfig(metric=sweep.metric, mode=sweep.mode, num_samples=sweep.num_samples,
                                        scheduler=scheduler(sweep), max_concurrent_trials=sweep.max_concurrent,
                                        # a trial process serves the next trial (no re-imports), except under PBT,
                                        # whose exploit restarts a trial from another's checkpoint in a fresh process
                                        reuse_actors=not pbt),
            run_config=tune.RunConfig(name=storage.name, storage_path=str(storage.parent), verbose=1,
                                      storage_filesystem=filesystem,
                                      failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
                                      # PBT clones the donor's latest checkpoint after a delay: keep them all (they
                                      # are small records; the state they point at is pinned by cluster.tune_trial)
                                      checkpoint_config=tune.CheckpointConfig(
                                          num_to_keep=None if pbt else sweep.keep_checkpoints)))
    before = _placement_groups_of_this_job()
    try:
        return tuner.fit()
    finally:
        _remove_leftover_placement_groups(before)


def _placement_groups_of_this_job() -> set[str]:
    """Ids of the live placement groups created by this driver's job (a placement group id ends with its job's id)."""
    import ray
    job = ray.get_runtime_context().get_job_id()
    return {pg_id for pg_id, info in ray.util.placement_group_table().items()
            if pg_id.endswith(job) and info["state"] != "REMOVED"}


def _remove_leftover_placement_groups(before: set[str]) -> None:
    """Remove the placement groups this sweep's trials left behind. A trial that Tune stops (a PBT exploit, an ASHA
    stop) kills its actor mid-fit; Ray Train's own cleaner frees that learner's placement group only where the State
    API answers (a cluster with its dashboard): elsewhere the group, and the CPUs it holds, would stay reserved for as
    long as the cluster lives. All trials are over here, so any group they made is garbage."""
    import ray
    from ray.util.placement_group import PlacementGroup
    leftover = _placement_groups_of_this_job() - before
    for pg_id in leftover:
        ray.util.remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
    if leftover:
        log.info("removed %d placement group(s) left behind by stopped trials", len(leftover))
