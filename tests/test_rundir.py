"""Runs never share a directory: two drivers started in the same second get two run directories and two run ids, a
used run_name is refused in one line, a bare resume=true refuses to guess between runs; a resume leaves TensorBoard
and the progress line as one clean run."""
from __future__ import annotations

import math
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cluster.journal import Journal
from cluster.metrics import MetricsLogger, Progress
from cluster.rundir import RunDir, RunNameTaken
from cluster.store import ParquetStore


def test_drivers_claiming_at_once_get_distinct_runs(tmp_path):
    """Eight drivers claim a default-named run directory at the same instant: eight directories, eight run ids."""
    barrier, made, errors = threading.Barrier(8), [], []

    def claim():
        barrier.wait()
        try:
            made.append(RunDir.create(tmp_path, "vidd_molecule"))
        except Exception as err:  # noqa: BLE001 - any failure to claim is the bug
            errors.append(err)

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len({r.path for r in made}) == 8 and len({r.run_id for r in made}) == 8
    assert all(r.run_id.startswith(f"vidd_molecule/{r.name}/") for r in made)


def test_two_sweeps_of_one_second_get_two_folders(tmp_path):
    """A sweep's folder names its Tune experiment: two sweeps started together must not share one."""
    from experiments.sweep import sweep_dir
    cfg = {"output_dir": str(tmp_path), "experiment": {"name": "collect"}, "run_name": None, "resume": False}
    first, second = sweep_dir(cfg), sweep_dir(cfg)
    assert first != second and first.name.startswith("sweep-") and first.is_dir() and second.is_dir()


def test_a_used_run_name_is_refused_in_one_line_unless_resumed(tmp_path, capsys):
    first = RunDir.create(tmp_path, "collect", "x")
    with pytest.raises(RunNameTaken) as err:
        RunDir.create(tmp_path, "collect", "x")
    message = str(err.value)
    assert "\n" not in message and "another run_name" in message and "resume=true" in message
    resumed = RunDir.create(tmp_path, "collect", "x", resume=True)
    assert resumed.path == first.path and resumed.run_id == first.run_id  # a resume keeps the run's id

    from experiments.run import main  # refused before Ray starts: config error, exit code 2, one line
    with pytest.raises(SystemExit) as exit_info:
        main(["experiment=collect", f"output_dir={tmp_path}", "run_name=x"])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: run directory") and "resume=true" in lines[0]


def test_a_bare_resume_names_the_runs_it_could_mean(tmp_path):
    with pytest.raises(FileNotFoundError, match="no unfinished run"):
        RunDir.create(tmp_path, "collect", resume=True)
    a, b = RunDir.create(tmp_path, "collect"), RunDir.create(tmp_path, "collect")
    with pytest.raises(FileNotFoundError) as err:
        RunDir.create(tmp_path, "collect", resume=True)
    assert a.name in str(err.value) and b.name in str(err.value) and "run_name=" in str(err.value)
    a.write_json("summary.json", {})  # a finished run is not what a bare resume continues
    assert RunDir.create(tmp_path, "collect", resume=True).path == b.path


def _scalars(tb_dir: Path, tag: str) -> list[tuple[int, float]]:
    """Every event TensorBoard reads for ``tag``, duplicates included (no purging of its own)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tb_dir), purge_orphaned_data=False)
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_a_resumed_learner_shows_each_step_once_in_tensorboard(tmp_path):
    """A learner checkpoints at step 3, logs 4 and 5, dies; the resumed learner logs 4..6 again. TensorBoard (and
    Parquet) show 1..6 once, with the resumed values."""
    tags = {"run": "r/x/1", "method": "vidd"}
    metrics = MetricsLogger(tmp_path, flush_every=100, gauges=tags)
    journal = Journal(tmp_path, [], metrics=metrics)
    for step in (1, 2, 3):
        metrics.log(step, {"loss": float(step)})
    saved = journal.parts()  # the checkpoint
    for step in (4, 5):
        metrics.log(step, {"loss": float(step)})
    metrics.flush()
    metrics.writer.flush()  # what a killed learner had written
    resumed = MetricsLogger(tmp_path, flush_every=100, gauges=tags)
    Journal(tmp_path, [], metrics=resumed).rollback(saved)
    for step in (4, 5, 6):
        resumed.log(step, {"loss": 10.0 * step})
    resumed.close()
    assert _scalars(tmp_path / "tb" / "vidd", "loss") == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0),
                                                         (6, 60.0)]
    steps = ParquetStore(tmp_path / "metrics").to_numpy(["step"])["step"]
    assert sorted(steps.tolist()) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_tensorboard_events_are_on_disk_when_flush_returns(tmp_path, monkeypatch):
    """A checkpoint flushes the metrics; a learner killed right after it must have its events in the file, since the
    resume never logs those steps again. (tensorboardX's SummaryWriter queued them for a thread that flush() did not
    wait for, so on a loaded machine a checkpoint's last events were still in memory. A slow disk write stands for
    the load here: whoever writes the events is slow.)"""
    from tensorboardX.event_file_writer import EventsWriter
    write = EventsWriter._write_serialized_event

    def slow_write(self, event_str):
        time.sleep(0.05)
        write(self, event_str)
    monkeypatch.setattr(EventsWriter, "_write_serialized_event", slow_write)
    metrics = MetricsLogger(tmp_path, flush_every=10_000, gauges={"run": "r/x/1", "method": "vidd"})
    for step in range(1, 21):
        metrics.log(step, {"loss": float(step), "reward": -float(step)})
    metrics.flush()  # no close: the process dies here
    (events,) = (tmp_path / "tb" / "vidd").glob("events.out.tfevents.*")
    data, records, pos = events.read_bytes(), 0, 0  # read at once: a writer thread would still be catching up
    while pos + 12 <= len(data):
        pos += 12 + int.from_bytes(data[pos:pos + 8], "little") + 4
        records += 1
    assert records == 1 + 40, "the file-version record and every scalar"
    assert _scalars(tmp_path / "tb" / "vidd", "loss") == [(s, float(s)) for s in range(1, 21)]
    assert len(_scalars(tmp_path / "tb" / "vidd", "reward")) == 20


def test_a_resumed_driver_shows_each_commit_once_in_tensorboard(tmp_path):
    metrics = MetricsLogger(tmp_path, flush_every=100)
    journal = Journal(tmp_path, [], metrics=metrics)
    journal.start()
    for step in (1, 2):
        journal.commit(step, {"transitions": 10.0 * step})
    metrics.log(3, {"transitions": 30.0})  # logged, never committed: the driver was killed
    metrics.writer.flush()
    resumed = MetricsLogger(tmp_path, flush_every=100)
    journal = Journal(tmp_path, [], metrics=resumed)
    assert journal.resume().step == 2
    journal.commit(3, {"transitions": 31.0})
    resumed.close()
    assert _scalars(tmp_path / "tb", "transitions") == [(1, 10.0), (2, 20.0), (3, 31.0)]


def test_the_progress_line_after_a_resume_counts_from_the_resume(capsys):
    progress = Progress("lift_pretrain rank0", 32_000, "env steps", done=16_000)  # resumed at half the budget
    line = progress.line(17_000, rate=100.0, eval_return=float("nan"), updates=12)
    assert "nan" not in line and "updates=12" in line and "ETA 2:30" in line
    progress.start -= 10.0  # ten seconds since the resume, 1,000 env steps in them
    progress.update(17_000, force=True)
    rate = float(re.search(r"\) ([\d.]+) env steps/s", capsys.readouterr().err).group(1))
    assert math.isclose(rate, 100.0, rel_tol=0.05)  # not 1,700/s (all 17,000 steps over ten seconds)
    assert "ETA 0:00" in progress.line(32_000, rate=0.0) and "ETA ?" in progress.line(17_000, rate=0.0)


# -- on the session cluster: two jobs of one experiment in the same second ----------------------------------------

COLLECT = ["experiment=collect", "experiment.num_transitions=240", "experiment.num_shards=2",
           "experiment.envs_per_shard=2", "seed=5"]


def test_two_drivers_in_the_same_second_keep_two_whole_runs(ray_cluster, pool_name, tmp_path):
    """Two drivers of the same experiment (no run_name) start at the same instant on one cluster and pool: two run
    directories, two run ids, two summaries, and each run's data equal to a solo run's."""
    from experiments.config import load
    from experiments.run import execute, main, start
    args = [*COLLECT, f"pool.name={pool_name}", f"output_dir={tmp_path}"]
    solo = main(args)  # also makes the pool the two attach to
    expected = ParquetStore(Path(solo["store"])).to_numpy()
    configs = [load(args), load(args)]  # composed one after the other (hydra's state is global)
    barrier, results, errors = threading.Barrier(2), {}, []

    def driver(i: int) -> None:
        barrier.wait()
        try:
            cfg, ctx = start(configs[i])
            results[i] = (ctx.run_dir.path, ctx.run_id, execute(cfg, ctx))
        except Exception as err:  # noqa: BLE001 - reported below with the other driver's outcome
            errors.append(repr(err))

    threads = [threading.Thread(target=driver, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and len(results) == 2, errors
    (path_a, id_a, sum_a), (path_b, id_b, sum_b) = results[0], results[1]
    assert path_a != path_b and id_a != id_b
    runs = sorted(p for p in (tmp_path / "collect").iterdir() if (p / "summary.json").exists())
    assert len(runs) == 3  # the solo run and both twins, each with its result
    for summary in (sum_a, sum_b):
        assert summary["transitions"] == 240
        data = ParquetStore(Path(summary["store"])).to_numpy()
        for key in ("obs", "action", "reward", "shard"):
            np.testing.assert_array_equal(data[key], expected[key])
        steps = ParquetStore(Path(summary["store"]).parents[1] / "metrics").to_numpy(["step"])["step"]
        assert sorted(steps.tolist()) == [1.0, 2.0]  # each shard committed once, in its own run
