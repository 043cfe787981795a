"""LIFT stage 1 on the real cluster: Pendulum-v1 learns with the LIFT recipe (1 and 2 Train workers), and a
killed run resumes from its checkpoint with the same counters and replay data, nothing duplicated."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from cluster.metrics import read_metrics
from cluster.store import ParquetStore
from tests.helpers import one_rank_pendulum, registered_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def _kill_cluster(temp_dir: str, proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # the embedded cluster's own processes (gcs, raylet, workers) are found by their temp dir
    out = subprocess.run(["pgrep", "-f", temp_dir], capture_output=True, text=True).stdout.split()
    for pid in out:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _replay_rows(run: Path) -> int:
    return sum(len(ParquetStore(d)) for d in sorted((run / "data").glob("replay-rank*")))


@pytest.mark.slow
def test_pendulum_learns_and_a_killed_run_resumes(tmp_path):
    """Run 1 is SIGKILLed after its first checkpoint; `resume=true` continues it to >= -400 within 16k steps. Each
    run is a driver with its own embedded cluster (as `python -m experiments.run` starts it), so this test runs beside
    the session cluster's tests rather than in their lane."""
    run_name = "resume"
    temp_dir = f"/tmp/orrery-kill-{uuid.uuid4().hex[:6]}"
    common = ["experiment=lift_pretrain", "env=pendulum", f"output_dir={tmp_path}", f"run_name={run_name}",
              "experiment.checkpoint_every_updates=800", "experiment.stop_return=-400", "seed=1",
              # a quarter of the preset's 1024 per update: -400 at ~11k env steps (1024: ~9k), inside the 16k budget
              "experiment.sac.batch_size=256"]
    proc = subprocess.Popen([sys.executable, "-m", "experiments.run", *common, "cluster.include_dashboard=false",
                             f"cluster.temp_dir={temp_dir}"], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt_root = tmp_path / "lift_pretrain" / run_name / "checkpoints" / "learner"
    try:
        deadline = time.time() + 600  # ~60 s on a quiet core; a loaded CI machine may take many times that
        while time.time() < deadline and registered_checkpoint(ckpt_root) is None:
            assert proc.poll() is None, "the first run ended before writing a checkpoint"
            time.sleep(0.5)
        assert registered_checkpoint(ckpt_root), "no checkpoint within 600 s"
    finally:
        _kill_cluster(temp_dir, proc)
    import torch
    # the checkpoint the resume restarts from (a newer directory may be half written, or written and not registered)
    latest = registered_checkpoint(ckpt_root)
    saved = torch.load(ckpt_root / latest["checkpoint_dir_name"] / "rank0.pt", weights_only=True)
    steps_at_ckpt, buffer_at_ckpt = saved["counters"]["env_steps"], saved["buffer"]["size"]

    resume = subprocess.run([sys.executable, "-m", "experiments.run", *common, "resume=true",
                             "cluster.include_dashboard=false", f"cluster.temp_dir={temp_dir}-2"], cwd=ROOT,
                            capture_output=True, text=True, timeout=900)
    assert resume.returncode == 0, resume.stdout[-3000:] + resume.stderr[-3000:]
    run = tmp_path / "lift_pretrain" / run_name
    summary = json.loads((run / "summary.json").read_text())
    df = read_metrics(run)
    resumed = df[df["resumed_from"] >= 0]
    assert len(resumed) and int(resumed["resumed_from"].iloc[0]) == steps_at_ckpt
    first = resumed.iloc[0]
    assert first["buffer"] == buffer_at_ckpt + 8 * 8, "resume continues with the checkpoint's buffer"
    assert _replay_rows(run) == summary["env_steps"], "Parquet replay holds every transition exactly once"
    assert not df["step"].duplicated().any(), "metric rows written after the checkpoint were dropped on resume"
    assert summary["best_eval_return"] >= -400 and summary["env_steps"] <= 16_000, summary
    assert (run / "plots" / "learning_curve.png").stat().st_size > 10_000
    assert (run / "policy.pt").exists()


def test_one_rank_pauses_at_a_deadline_and_resumes_the_learner_users_run(tmp_path):
    """``run_one_rank`` (a study's pretraining stage) runs the same learner as the cluster job: paused by its stop
    predicate after five rounds, it checkpoints; the next call resumes there and finishes with every transition in
    the Parquet replay exactly once and the files stage 2-3 read."""
    import torch

    from experiments.lift.pretrain_learner import run_one_rank
    run = tmp_path / "run"
    config = one_rank_pendulum(run, "one-rank", total_env_steps=320, eval_every_steps=160)
    asked = iter(range(1000))
    assert run_one_rank(config, should_stop=lambda: next(asked) >= 5) is False
    saved = torch.load(run / "checkpoints" / "latest" / "rank0.pt", weights_only=True)
    assert saved["counters"]["env_steps"] == 5 * 32 and not (run / "agent.pt").exists()
    assert run_one_rank(config) is True
    df = read_metrics(run)
    assert int(df["env_steps"].iloc[-1]) == 320 and int(df["resumed_from"].max()) == 160
    assert not df["step"].duplicated().any()
    assert _replay_rows(run) == 320, "Parquet replay holds every transition exactly once"
    assert (run / "agent.pt").exists() and (run / "policy.pt").exists()


def test_a_run_starts_from_an_agent_file_and_refuses_one_that_does_not_fit(tmp_path):
    """``experiment.init_agent``: a fresh run takes a finished run's agent (weights, temperature, obs statistics, update
    count) and this run's own learning rates, with an empty replay; a file for another architecture, or none, is
    refused naming the key."""
    import torch

    from experiments.lift.pretrain_learner import run_one_rank
    first = tmp_path / "first"
    config = one_rank_pendulum(first, "first", total_env_steps=128, eval_every_steps=128)
    exp = config["experiment"]
    assert run_one_rank(config) is True
    given = torch.load(first / "agent.pt", weights_only=True)
    assert given["num_updates"] > 0

    second = tmp_path / "second"
    asked = iter(range(1000))
    assert run_one_rank(one_rank_pendulum(second, "second", 128, 128, seed=3, init_agent=str(first / "agent.pt"),
                                          sac={**exp["sac"], "actor_lr": 1e-5}),
                        should_stop=lambda: next(asked) >= 1) is False  # paused after one round: no update yet
    saved = torch.load(second / "checkpoints" / "latest" / "rank0.pt", weights_only=True)
    agent = saved["agent"]
    assert agent["num_updates"] == given["num_updates"]
    for key in ("actor", "critic", "target_critic", "log_alpha"):
        assert all(torch.equal(agent[key][k], given[key][k]) for k in given[key]), key
    assert [g["lr"] for g in agent["actor_opt"]["param_groups"]] == [1e-5], "this run's learning rate applies"
    assert saved["counters"]["env_steps"] == 4 * 8 and saved["buffer"]["size"] == 4 * 8, "the replay starts empty"

    with pytest.raises(ValueError, match="experiment.init_agent: .* does not fit"):
        run_one_rank(one_rank_pendulum(tmp_path / "third", "third", 128, 128, init_agent=str(first / "agent.pt"),
                                       sac={**exp["sac"], "actor_hidden": [16, 16]}))
    with pytest.raises(ValueError, match="experiment.init_agent: no agent file"):
        run_one_rank(one_rank_pendulum(tmp_path / "fourth", "fourth", 128, 128, init_agent=str(tmp_path / "none.pt")))
