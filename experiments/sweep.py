"""Hyper-parameter sweeps with Ray Tune: ``python -m experiments.sweep experiment=<name> sweep=<space> [overrides]``.

A sweep file ``configs/sweep/<space>.yaml`` (selected by ``sweep=<space>``, any key overridable as ``sweep.<key>=``)::

    metric: transitions_per_s      # a metric the experiment reports every iteration (required)
    mode: max                      # max | min
    num_samples: 1                 # samples of the random part of the space, per grid point
    max_concurrent: 2              # trials at once
    trial_cpus: 0.05               # CPU of a trial's driver; pool requests and Ray Train learners bring their own
    max_failures: 1                # retries of a crashed trial, from its last checkpoint
    scheduler:                     # fifo | asha | pbt
      name: asha
      max_t: 8                     #   asha: most iterations a trial runs; grace_period, reduction_factor
      grace_period: 2
      # pbt: perturbation_interval, quantile_fraction, resample_probability (mutates the non-grid parameters)
    space:                         # nested like the config; a leaf is one of
      experiment:
        envs_per_shard: {grid: [1, 2, 4]}        # every value, crossed with the other grid parameters
        num_shards: {choice: [4, 8]}             # one value at random per sample
        # lr: {loguniform: [1.0e-4, 1.0e-2]}     # log-uniform between the bounds
        # tau: {uniform: [0.001, 0.01]}          # uniform between the bounds

Each trial is exactly a single run (``experiments.run.prepare`` + the experiment's ``run(cfg, ctx)``) with the
sampled values as extra overrides, in its own run directory, and ``ctx.tune_report`` set: experiments report every
iteration (``ctx.log`` or ``cluster.journal.Journal.commit``, whose commit records become the trial's checkpoints),
and so does every Ray Train learner inside the trial (its checkpoints too): ``cluster.tune_trial``.
A trial retried after a crash resumes its run directory at its last checkpoint; a PBT recipient restarts from the
donor's: the donor's committed data and its learners' checkpoints (weights, optimiser, normalizer, replay). ``pool.*``/``cluster.*`` cannot be swept: all trials share the cluster's one pool.

Layout: ``<output_dir>/<experiment>/<run_name = sweep-<time>>/`` with ``tune/`` (Tune's storage: experiment state,
per-trial results and checkpoints), ``trials/<experiment>/<trial_id>/`` (each trial's run directory, including
``attempts.jsonl``: one line per start of the trial), ``results.parquet``/``results.csv`` (every iteration of every
trial), ``best.json``, ``plots/<metric>.png``. ``resume=true`` (with ``run_name=``, else the latest sweep) restores an
interrupted sweep: finished trials are kept, unfinished ones continue from their last checkpoint.
"""
from __future__ import annotations

import json
import logging
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any

from cluster.tune import SweepConfig, override, representative
from experiments.config import ConfigError, from_dict, load

log = logging.getLogger("orrery.sweep")

TUNE_DIR = "tune"
_RUN_KEYS = ("sweep", "resume", "run_name", "output_dir")  # overrides the sweep owns; trials get their own


def trial_overrides(argv: list[str]) -> list[str]:
    """The command line minus what belongs to the sweep itself."""
    def key(arg: str) -> str:
        return arg.lstrip("+~").split("=", 1)[0].split(".", 1)[0]
    return [a for a in argv if key(a) not in _RUN_KEYS]


def _select_sweep(argv: list[str]) -> list[str]:
    """``sweep=<name>`` picks configs/sweep/<name>.yaml; hydra wants ``+sweep=`` unless the defaults list has it."""
    from experiments.config import CONFIG_DIR
    in_defaults = re.search(r"^\s*-\s*(optional\s+)?sweep\s*:", (CONFIG_DIR / "config.yaml").read_text(), re.M)
    return [f"+{a}" if a.startswith("sweep=") and not in_defaults else a for a in argv]


def run_trial(params: dict[str, Any], base: list[str], sweep_path: str, experiment: str) -> None:
    """Tune function trainable: one run of ``experiment`` with ``params`` as overrides (see the module doc)."""
    from cluster import tune_trial
    from experiments.run import prepare

    trial_id = tune_trial.trial_id()
    run_path = Path(sweep_path) / "trials" / experiment / trial_id
    record = tune_trial.trial_checkpoint()
    restored_step = None
    if record is not None:  # a retry from its own checkpoint, or a PBT recipient from its donor's
        restored_step = tune_trial.start_from(record, run_path, run_path / "checkpoints")
    # A retry resumes its run directory as it is: driver commits are cut back above, learners resume from their own
    # Ray Train checkpoints.
    resume = record is not None or (run_path / "config.yaml").exists() or (run_path / "run_id").exists()
    run_path.mkdir(parents=True, exist_ok=True)
    with open(run_path / "attempts.jsonl", "a") as fh:
        fh.write(json.dumps({"time": time.time(), "pid": os.getpid(), "host": socket.gethostname(),
                             "resume": resume, "restored_step": restored_step,
                             "from_trial": Path(record["run_path"]).name if record else None}) + "\n")
    overrides = base + [override(k, v) for k, v in params.items()] + [
        override("output_dir", str(Path(sweep_path) / "trials")), override("run_name", trial_id),
        override("resume", resume)]
    cfg, ctx = prepare(overrides)
    ctx.tune_report = tune_trial.report_commit

    def run() -> dict:
        try:
            return cfg["_module"].run(cfg, ctx)
        finally:
            ctx.close()
    summary = tune_trial.run_in_trial(run, run_path=run_path)
    ctx.run_dir.write_json("summary.json", summary)


def sweep_dir(cfg: dict[str, Any]) -> Path:
    base = Path(cfg["output_dir"]).resolve() / cfg["experiment"]["name"]
    name = cfg["run_name"]
    if cfg["resume"] and name is None:
        sweeps = sorted((p for p in base.glob("sweep-*") if (p / TUNE_DIR).is_dir()), key=lambda p: p.stat().st_mtime)
        if not sweeps:
            raise FileNotFoundError(f"resume=true but there is no earlier sweep under {base}")
        return sweeps[-1]
    if name is None and not cfg["resume"]:  # two sweeps started in the same second get two folders (and Tune names)
        from cluster.rundir import claim_new_dir, default_run_name
        return claim_new_dir(base, lambda: f"sweep-{default_run_name()}")
    path = base / name
    if cfg["resume"] and not path.exists():
        raise FileNotFoundError(f"resume=true but sweep directory {path} does not exist")
    if not cfg["resume"] and (path / TUNE_DIR).is_dir():
        # Tune would start a new sweep over the old one's state, and trials/ would hold both sweeps' trials
        raise FileExistsError(f"sweep directory {path} already holds a sweep: add resume=true to continue it, or "
                              f"give another run_name")
    return path


def check(cfg: dict[str, Any]) -> SweepConfig:
    """Validate the sweep section; every swept key must exist in the composed config (typos fail before Ray)."""
    if not cfg.get("sweep"):
        raise ConfigError("sweep: missing; pick a search space with sweep=<name> (configs/sweep/<name>.yaml)")
    sweep = from_dict(SweepConfig, cfg["sweep"], "sweep")
    for key in sweep.params:
        node: Any = cfg
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise ConfigError(f"sweep.space.{key}: no such config key")
            node = node[part]
    return sweep


def main(argv: list[str] | None = None) -> Any:
    argv = sys.argv[1:] if argv is None else argv
    from experiments.run import public_config, setup_process
    try:
        cfg = load(_select_sweep(argv))
        sweep = check(cfg)
        base = trial_overrides(argv)
        load(base + [override(k, v) for k, v in representative(sweep.params).items()])
        path = sweep_dir(cfg)
    except (ConfigError, FileNotFoundError, FileExistsError) as err:
        print(f"config error: {err}", file=sys.stderr)
        raise SystemExit(2)
    setup_process(cfg["torch_threads"], cfg["log_level"])
    path.mkdir(parents=True, exist_ok=True)
    import yaml
    (path / "config.yaml").write_text(yaml.safe_dump(public_config(cfg), sort_keys=False))

    from cluster import tune as sweep_tune
    from cluster.connect import connect
    info = connect(cfg["_typed"]["cluster"])
    if info.get("dashboard_url"):
        print(f"Ray dashboard: {info['dashboard_url']}", file=sys.stderr, flush=True)
    from cluster.storage import StorageNotShared, input_paths, require_same_inputs, require_shared
    try:
        require_shared(path)  # every node writes trials there
        require_same_inputs(input_paths(cfg["experiment"]))  # and every trial's learners read the same model
    except StorageNotShared as err:
        print(f"storage error: {err}", file=sys.stderr)
        raise SystemExit(2)
    try:
        results = sweep_tune.run_sweep(run_trial, sweep, path / TUNE_DIR, resume=cfg["resume"], base=base,
                                       sweep_path=str(path), experiment=cfg["experiment"]["name"])
    except sweep_tune.SweepStateError as err:
        print(f"sweep error: {err}", file=sys.stderr)
        raise SystemExit(2)
    return report(results, sweep, path)


def report(results, sweep: SweepConfig, path: Path) -> dict[str, Any]:
    """Best config to stdout; results table (Parquet, CSV), ``best.json`` and the per-trial plot to the sweep dir."""
    from cluster import tune as sweep_tune
    params = list(sweep.params)
    table = sweep_tune.results_table(results, params)
    table.to_parquet(path / "results.parquet", index=False)
    table.to_csv(path / "results.csv", index=False)
    plot = sweep_tune.plot_trials(table, sweep.metric, path / "plots" / f"{sweep.metric}.png", params,
                         f"{sweep.metric} per trial ({sweep.scheduler.name})")
    errors = sum(r.error is not None for r in results)
    try:
        best = results.get_best_result(sweep.metric, sweep.mode, scope=sweep.best_scope)
    except RuntimeError as err:  # no trial reported the metric
        best = None
        print(f"no trial reported {sweep.metric}: {err}", file=sys.stderr)
    if best is None or sweep.metric not in best.metrics:
        first_error = next((r.error for r in results if r.error is not None), None)
        print(f"sweep failed: no result for {sweep.metric} ({errors} of {len(results)} trials errored; first: "
              f"{first_error!r}); see {path / TUNE_DIR}", file=sys.stderr)
        raise SystemExit(1)
    best_config = {k: best.config[k] for k in params}
    summary = {"metric": sweep.metric, "mode": sweep.mode, "best_value": best.metrics.get(sweep.metric),
               "best_config": best_config, "best_trial": best.metrics.get("trial_id"),
               "trials": len(results), "errors": errors, "rows": len(table),
               "overrides": [override(k, v) for k, v in best_config.items()]}
    (path / "best.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"best {sweep.metric} = {summary['best_value']} ({sweep.mode}) with: {' '.join(summary['overrides'])}")
    print(f"{len(results)} trials ({errors} errored), {len(table)} rows -> {path / 'results.parquet'}; plot {plot}")
    print(f"sweep directory: {path}", flush=True)
    return summary


if __name__ == "__main__":
    main()
