"""Sweeps: the YAML search space and schedulers, commit records as trial checkpoints (restore, PBT clone), and a real
sweep SIGKILLed mid-way that resumes without re-running finished trials and ends with a table, a plot and a best
config."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import ray

from cluster import journal
from cluster.metrics import MetricsLogger
from cluster.store import ParquetStore
from experiments.config import ConfigError, load
from experiments.sweep import _select_sweep, check, trial_overrides
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[1]


def _sweep_cfg(*overrides: str):
    return check(load(_select_sweep(["experiment=collect", "sweep=collect_throughput", *overrides])))


def test_space_scheduler_and_errors_from_yaml():
    from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining
    from ray.tune.search.sample import Categorical, Float, LogUniform

    from cluster.tune import override, scheduler, tune_space
    sweep = _sweep_cfg("+sweep.space.experiment.num_transitions={loguniform:[100,1000]}")
    space = tune_space(sweep.params)
    assert space["experiment.envs_per_shard"] == {"grid_search": [1, 2, 4]}
    assert isinstance(space["experiment.num_shards"], Categorical) and space["experiment.num_shards"].categories == [4, 8]
    lr = space["experiment.num_transitions"]
    assert isinstance(lr, Float) and isinstance(lr.get_sampler(), LogUniform) and (lr.lower, lr.upper) == (100, 1000)
    asha = scheduler(sweep)
    assert isinstance(asha, ASHAScheduler) and asha._max_t == 16
    assert sorted(r for r, _ in asha._brackets[0]._rungs) == [2, 4, 8, 16]  # grace_period 2, reduction factor 2
    pbt = scheduler(_sweep_cfg("sweep.scheduler.name=pbt", "sweep.scheduler.perturbation_interval=3"))
    assert isinstance(pbt, PopulationBasedTraining) and pbt._perturbation_interval == 3
    assert set(pbt._hyperparam_mutations) == {"experiment.envs_per_shard", "experiment.num_shards"}

    for bad, message in [
        ("+sweep.space.pool.num_workers={grid:[1,2]}", "sweep.space.pool.num_workers: cannot be swept"),
        ("+sweep.space.experiment.nope={grid:[1]}", "sweep.space.experiment.nope: no such config key"),
        ("+sweep.space.seed={loguniform:[0,1]}", "sweep.space.seed.loguniform: bounds must be > 0"),
        ("+sweep.space.seed={between:[0,1]}", "sweep.space.seed: expected {kind: [...]} with kind one of"),
        ("sweep.trial_cpus=0", "sweep.trial_cpus: must be > 0"),
        ("sweep.scheduler.name=hyperband", "sweep.scheduler.name: must be one of"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            _sweep_cfg(bad)
    with pytest.raises(ConfigError, match="sweep: missing"):
        check(load(["experiment=collect"]))

    assert override("experiment.task", "humanoid") == "experiment.task=humanoid"
    assert override("a", "it's x") == "a='it\\'s x'" and override("a", None) == "a=null"
    assert override("a", [1, 0.5, True]) == "a=[1,0.5,true]"
    assert override("run_name", "45591_00000") == "run_name='45591_00000'"  # a trial id hydra would read as an int
    assert trial_overrides(["experiment=collect", "sweep=s", "sweep.num_samples=3", "resume=true", "run_name=x",
                            "output_dir=/o", "seed=3"]) == ["experiment=collect", "seed=3"]


def test_a_second_sweep_under_a_used_run_name_is_refused_without_resume(tmp_path):
    """The README's job sweep has a fixed run_name: run twice, Tune would start over on top of the first sweep's state
    and trials/ would mix both sweeps' trials. It is refused in one line; resume=true continues it."""
    from experiments.sweep import sweep_dir
    cfg = {"output_dir": str(tmp_path), "experiment": {"name": "collect"}, "run_name": "sweep-1", "resume": False}
    path = tmp_path / "collect" / "sweep-1"
    assert sweep_dir(cfg) == path  # a new name, or a folder a killed start left before Tune wrote anything
    (path / "tune").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="already holds a sweep: add resume=true to continue it"):
        sweep_dir(cfg)
    assert sweep_dir({**cfg, "resume": True}) == path


def _run_with_commits(run_path: Path, steps: range, *, start=None) -> journal.Journal:
    store = ParquetStore(run_path / "data" / "x")
    metrics = MetricsLogger(run_path, tensorboard=False)
    reports = []
    j = journal.Journal(run_path, [store], metrics=metrics, report=lambda m, checkpoint: reports.append(checkpoint))
    first = j.resume().step if start == "resume" else j.start().step
    assert first == steps.start
    for step in steps:
        store.append({"v": np.full(3, step)})
        j.commit(step + 1, {"loss": float(step)}, state={"seen": step + 1})
    j.reports = reports
    return j


def test_commit_records_restore_and_clone(tmp_path):
    a = tmp_path / "a"
    j = _run_with_commits(a, range(0, 4))
    at_two = j.reports[1]  # the checkpoint Tune got at step 2
    assert at_two["step"] == 2 and at_two["parts"] == {"data/x": 2, "metrics": 2}
    with pytest.raises(FileExistsError, match="resume=true"):
        _run_with_commits(a, range(0, 1))
    # a crash mid-step leaves a part the commit does not know about: resume drops it
    ParquetStore(a / "data" / "x").append({"v": np.full(3, 99)})
    _run_with_commits(a, range(4, 6), start="resume")
    assert ParquetStore(a / "data" / "x").to_numpy()["v"].tolist() == [s for s in range(6) for _ in range(3)]
    # PBT: another trial continues from a's checkpoint at step 2, though a has moved on since
    b = tmp_path / "b"
    commit = journal.clone(at_two, b)
    assert commit.step == 2 and journal.read_commit(b).state == {"seen": 2}
    assert ParquetStore(b / "data" / "x").to_numpy()["v"].tolist() == [0, 0, 0, 1, 1, 1]
    _run_with_commits(b, range(2, 3), start="resume")
    # Tune restores a to its own earlier checkpoint: a is cut back to step 2
    journal.restore(a, at_two)
    assert journal.read_commit(a).step == 2 and len(ParquetStore(a / "metrics").to_numpy()["step"]) == 2
    assert len(ParquetStore(a / "data" / "x")) == 6


def test_sweep_killed_then_resumed(pool_name, tmp_path):
    pool = pool_name
    sweep_path = tmp_path / "collect" / "sw"
    trials = sweep_path / "trials" / "collect"
    argv = [sys.executable, "-m", "experiments.sweep", "experiment=collect", "sweep=collect_throughput",
            "sweep.scheduler.name=fifo", "sweep.max_concurrent=1", "sweep.space.experiment.num_shards.choice=[4]",
            "sweep.space.experiment.envs_per_shard.grid=[2,4]", "experiment.num_transitions=240", f"pool.name={pool}", f"output_dir={tmp_path}", "run_name=sw",
            f"cluster.address={ray.get_runtime_context().gcs_address}"]

    def finished() -> list[Path]:
        return sorted(p.parent for p in trials.glob("*/summary.json"))

    def terminated() -> set[str]:
        """Trials Tune itself has recorded as finished (what a restore will not re-run)."""
        done = set()
        for state in (sweep_path / "tune").glob("experiment_state-*.json"):
            try:
                entries = json.loads(state.read_text())["trial_data"]
            except (OSError, ValueError, KeyError):
                continue  # being written
            done |= {t["trial_id"] for t in map(lambda e: json.loads(e[0]), entries) if t["status"] == "TERMINATED"}
        return done

    # Tune saves its experiment state at most every 10 s by default; save it at every step so that "finished
    # before the kill" is exact (a trial finished but not yet recorded would be resumed at its last commit: a
    # no-op, but not what this test counts).
    env = {**os.environ, "TUNE_GLOBAL_CHECKPOINT_S": "0"}
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        # kill as soon as a trial is recorded finished, whatever Tune is copying then: every state file it would
        # read back must be whole (cluster.whole_files), or the resume below would be refused
        while not terminated() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        out = proc.communicate()[0]
    finally:
        proc.kill()
    assert _state_readable(sweep_path / "tune"), "a state file was left cut short by the kill"
    done_before = terminated()
    assert len(done_before) == 1, f"kill the sweep after 1 of 2 trials; finished {done_before}\n{out[-3000:]}"

    resumed = subprocess.run(argv + ["resume=true"], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]

    runs = sorted(p for p in trials.iterdir() if p.is_dir())
    assert len(runs) == 2 and finished() == runs
    for run in runs:
        attempts = [json.loads(line) for line in (run / "attempts.jsonl").read_text().splitlines()]
        if run.name in done_before:
            assert len(attempts) == 1, f"finished trial {run.name} was re-run"
        # an interrupted trial with a checkpoint continues its run directory from there
        assert all(a["resume"] for a in attempts if a["restored_step"] is not None), attempts
        metric_steps = ParquetStore(run / "metrics").to_numpy(["step"])["step"]
        assert sorted(metric_steps.tolist()) == [1, 2, 3, 4], f"{run.name}: steps repeated or lost"
        assert len(ParquetStore(run / "data" / "transitions")) == 240
    best = json.loads((sweep_path / "best.json").read_text())
    assert best["trials"] == 2 and best["errors"] == 0
    assert f"best transitions_per_s = {best['best_value']}" in resumed.stdout
    table = pd.read_parquet(sweep_path / "results.parquet")
    assert sorted(table["config/experiment.envs_per_shard"].unique().tolist()) == [2, 4]
    assert table.groupby("trial_id")["training_iteration"].max().tolist() == [4, 4]
    assert len(pd.read_csv(sweep_path / "results.csv")) == len(table)
    png = (sweep_path / "plots" / "transitions_per_s.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


# -- PBT over a Ray Train learner: the recipient continues from the donor's learner state -------------------------

PBT_INTERVAL = 2


def _state_readable(tune_dir: Path) -> bool:
    from cluster.tune import SweepStateError, check_resumable
    try:
        check_resumable(tune_dir)
        return True
    except SweepStateError:
        return False


def _jsonl(path: Path) -> list[dict]:
    rows = []
    for line in (path.read_text().splitlines() if path.exists() else []):
        try:
            rows.append(json.loads(line))
        except ValueError:  # a line being written
            pass
    return rows


def _pbt_has_scored(tune_dir: Path, other_than: str, iteration: int) -> bool:
    """Whether PBT has taken another trial's result of ``iteration``: Tune's controller hands a result to the
    scheduler first and then to the logger that appends it to the trial's result.json."""
    return any(max((r.get("training_iteration", 0) for r in _jsonl(path)), default=0) >= iteration
               for path in tune_dir.glob("*/result.json") if other_than not in path.parent.name)


def _pace(config: dict, step: int) -> None:
    """The order PBT needs, made explicit (left to chance, this test failed on loaded machines). PBT scores a trial
    only at that trial's own perturbation steps, so: the better trial reports step 2 only once PBT has scored the
    worse one (it is then the upper quantile and checkpoints); the worse trial reports step 4 only once PBT has
    scored the better one (it is then the lower quantile and exploits that checkpoint); and the better trial's last
    step waits for the exploit, since a finished trial cannot be cloned."""
    root, tune_dir, trial = Path(config["root"]), Path(config["tune_dir"]), config["trial"]
    interval = config["perturbation_interval"]
    if step == (interval if config["better"] else 2 * interval):
        wait_until(lambda: _pbt_has_scored(tune_dir, trial, interval), 120,
                   f"PBT to score the other trial's step {interval}", every_s=0.1)
    if config["better"] and step == config["steps"]:
        wait_until(lambda: any(s["donor"] for s in _jsonl(root / "starts.jsonl")), 120, "the exploit", every_s=0.1)


def _counting_learner(config: dict) -> None:
    """A learner whose whole state is (step, value): value grows by lr per step; a checkpoint after every step. It logs
    every state it checkpoints and the state it starts from (``states.jsonl``/``starts.jsonl`` under the root)."""
    from cluster import ddp
    root, trial = Path(config["root"]), config["trial"]
    state, start = {"step": 0, "value": 0.0}, "fresh"
    with ddp.latest_checkpoint() as ckpt:
        if ckpt is not None:
            state, start = json.loads((ckpt / "rank0.json").read_text()), str(ckpt)
    with open(root / "starts.jsonl", "a") as fh:
        fh.write(json.dumps({"trial": trial, "donor": "learner.init" in start, **state}) + "\n")
    # one step after an exploit: its iteration stays short of the next perturbation step, so PBT exploits once (a
    # second exploit added a Train fit and ~15 s and checked nothing new)
    for _ in range(config["steps"] if start == "fresh" else 1):
        state["step"] += 1
        state["value"] += config["lr"]
        if start == "fresh":
            _pace(config, state["step"])
        with ddp.checkpoint_dir() as d:
            (d / "rank0.json").write_text(json.dumps(state))
            with open(root / "states.jsonl", "a") as fh:
                fh.write(json.dumps({"trial": trial, **state}) + "\n")
            ddp.report({"step": state["step"], "value": state["value"], "lr": config["lr"],
                        "from_donor": float("learner.init" in start)}, checkpoint_dir=d)
        time.sleep(0.2)


def _pbt_trial(params: dict, root: str, tune_dir: str) -> None:
    from cluster import tune_trial
    from cluster.train import TrainConfig, fit
    run = Path(root) / tune_trial.trial_id()
    record = tune_trial.trial_checkpoint()
    if record is not None:
        tune_trial.start_from(record, run, run / "checkpoints")
    loop = {"lr": params["lr"], "better": params["lr"] == 1.0, "steps": 4, "perturbation_interval": PBT_INTERVAL,
            "root": root, "tune_dir": tune_dir, "trial": run.name}
    tune_trial.run_in_trial(lambda: fit(_counting_learner, loop,
                                        name="learner", storage_path=run / "checkpoints",
                                        train=TrainConfig(num_workers=1, cpus_per_worker=0.25)), run_path=run)


def test_pbt_exploit_moves_the_learner_state(ray_cluster, tmp_path):
    """Two trials learn at lr 0.01 and 1.0; PBT makes the worse one exploit the better one: the recipient restarts
    from the donor's Ray Train checkpoint, so its next step and value continue the donor's, not its own."""
    from cluster.tune import SchedulerConfig, SweepConfig, run_sweep
    sweep = SweepConfig(space={"lr": {"choice": [0.01, 1.0]}}, metric="value", mode="max", num_samples=1,
                        max_concurrent=2, trial_cpus=0.05, max_failures=0,
                        scheduler=SchedulerConfig(name="pbt", perturbation_interval=PBT_INTERVAL, quantile_fraction=0.5,
                                                  resample_probability=0.0))
    sweep.params = {"lr": ("grid", [0.01, 1.0])}  # both values, one trial each
    import ray
    free_before = ray.available_resources().get("CPU", 0.0)
    results = run_sweep(_pbt_trial, sweep, tmp_path / "tune", resume=False, root=str(tmp_path / "runs"),
                        tune_dir=str(tmp_path / "tune"))
    # stopped trials' learners hand their CPUs back (a leaked placement group starves the next learner forever)
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0.0) < free_before - 1e-6 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray.available_resources().get("CPU", 0.0) >= free_before - 1e-6, (free_before, ray.available_resources())
    assert not any(r.error for r in results), [r.error for r in results]
    def lines(name: str) -> list[dict]:
        return [json.loads(line) for line in (tmp_path / "runs" / name).read_text().splitlines()]
    states, starts = lines("states.jsonl"), [s for s in lines("starts.jsonl") if s["donor"]]
    assert starts, "PBT never exploited: " + str(states)
    for start in starts:
        # the recipient's learner started from a state (weights, optimiser, ... here: step and value) that the
        # donor's learner had checkpointed, not from its own
        written_by = {s["trial"] for s in states if (s["step"], s["value"]) == (start["step"], start["value"])}
        assert written_by - {start["trial"]}, (start, states)
    assert len(starts) == 1, starts
    for name, df in ((r.metrics_dataframe["trial_id"].iloc[0], r.metrics_dataframe) for r in results):
        # the donor ran its 4 steps; the recipient one step past the donor's checkpoint, from its state
        last = df.iloc[-1]
        expected = (starts[0]["step"] + 1, 1.0) if last["from_donor"] else (4, 0.0)
        assert (last["step"], last["from_donor"]) == expected, (name, df[["step", "value"]].values.tolist())


def test_a_tune_state_file_cut_short_by_a_kill_refuses_the_resume(tmp_path):
    """Tune copies its state into the sweep folder file by file; a kill during the copy left an empty search-algorithm
    state, and Tune then silently started the sweep over with a trial that had none of its parameters. Only the
    newest file of each kind counts (Tune reads no other)."""
    import ray.cloudpickle as cloudpickle
    from cluster.tune import SweepStateError, check_resumable
    (tmp_path / "experiment_state-2026-12-04_20-27-42.json").write_text(json.dumps({"trial_data": []}))
    (tmp_path / "tuner.pkl").write_bytes(cloudpickle.dumps({"a": 1}))
    (tmp_path / "basic-variant-state-2026-12-04_20-27-42.json").write_bytes(b"")
    with pytest.raises(SweepStateError, match="basic-variant-state-2026-12-04_20-27-42.json is incomplete"):
        check_resumable(tmp_path)
    (tmp_path / "basic-variant-state-2026-12-04_20-30-00.json").write_bytes(cloudpickle.dumps({"remaining": 1}))
    check_resumable(tmp_path)  # a later session wrote a whole one: that is the one Tune reads
    (tmp_path / "experiment_state-2026-12-04_20-30-00.json").write_text('{"trial_data": [')
    with pytest.raises(SweepStateError, match="experiment_state-2026-12-04_20-30-00.json"):
        check_resumable(tmp_path)
