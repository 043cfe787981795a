"""Failures on real clusters, each mid-run: a pool worker process dies, the run's driver is SIGKILLed, a Tune trial's
process is SIGKILLed, a worker node leaves. Every run still ends with exactly the requested transitions, each shard
once, and the same step counter as an uninterrupted run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import ray

from cluster.journal import read_commit
from cluster.store import ParquetStore
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[1]
SHARDS, ENVS, STEPS = 8, 2, 150
N = SHARDS * ENVS * STEPS  # 2400 transitions, 8 shards of ~0.2-0.5 s each on a loaded CI core


def _collect_args(out: Path, run_name: str, pool: str, *extra: str) -> list[str]:
    return ["experiment=collect", f"experiment.num_transitions={N}",
            f"experiment.num_shards={SHARDS}", f"experiment.envs_per_shard={ENVS}", f"pool.name={pool}",
            f"output_dir={out}", f"run_name={run_name}", "seed=11", *extra]


def _committed_step(run_path: Path) -> int:
    commit = read_commit(run_path) if run_path.exists() else None
    return commit.step if commit else 0


def _tune_results_with_checkpoint(sweep_path: Path) -> int:
    """How many results with a checkpoint Tune's controller has processed (logged in its trials' result.json)."""
    rows = 0
    for result in (sweep_path / "tune").glob("*/result.json"):
        for line in result.read_text().splitlines():
            try:
                rows += json.loads(line).get("checkpoint_dir_name") is not None
            except json.JSONDecodeError:  # a line being written
                pass
    return rows


def _check_complete(run_path: Path) -> dict[str, np.ndarray]:
    """Exactly the requested transitions, every shard once and whole, metrics steps 1..SHARDS each once."""
    data = ParquetStore(run_path / "data" / "transitions").to_numpy()
    assert len(data["reward"]) == N
    shards, counts = np.unique(data["shard"], return_counts=True)
    assert shards.tolist() == list(range(SHARDS)) and set(counts.tolist()) == {ENVS * STEPS}
    assert np.all(np.diff(data["shard"]) >= 0), "shards must be in order"
    metric_steps = ParquetStore(run_path / "metrics").to_numpy(["step"])["step"]
    assert sorted(metric_steps.tolist()) == list(range(1, SHARDS + 1)), metric_steps
    assert read_commit(run_path).step == SHARDS
    return data


# -- (a) a pool worker process dies mid-run ------------------------------------------------------------------------

def test_pool_worker_killed_mid_run(ray_cluster, pool_factory, tmp_path):
    from experiments.run import main
    pool = pool_factory(num_workers=2, num_cpus=0.5)
    pids = [ray.get(w.ping.remote()) for w in pool.workers()]
    # Warm both workers up (imports, env construction), so the run's shards start on both at once.
    pool.map("env", [{"steps": 1, "reset_seed": 0}] * 2,
             config={"task": "humanoid", "num_envs": ENVS, "physics_state": True})
    run_path = tmp_path / "collect" / "a"

    def kill_worker():
        # kill while worker 0 runs a shard of this run (the pool's own count of its slots in use): waiting for the
        # first commit instead let a loaded machine finish every shard before the kill, and nothing was retried
        wait_until(lambda: run_path.exists() and pool.stats()["inflight"][0] > 0, 120, "worker 0 running a shard",
                   every_s=0.05)
        os.kill(pids[0], signal.SIGKILL)  # a crash, not a polite ray.kill

    killer = threading.Thread(target=kill_worker, daemon=True)
    killer.start()
    summary = main(_collect_args(tmp_path, "a", pool.name))
    killer.join()
    assert summary["transitions"] == N
    assert summary["pool"]["retries"] >= 1 and summary["pool"]["restarts"] >= 1, summary["pool"]
    _check_complete(run_path)


# -- (b) the driver is SIGKILLed; the same command with resume=true continues -------------------------------------

def test_driver_sigkill_then_resume(pool_name, tmp_path):
    from experiments.run import main
    pool = pool_name
    gcs = ray.get_runtime_context().gcs_address
    run_path = tmp_path / "collect" / "b"
    args = _collect_args(tmp_path, "b", pool)
    proc = subprocess.Popen([sys.executable, "-m", "experiments.run", *args, f"cluster.address={gcs}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        killed_at = wait_until(lambda: _committed_step(run_path) >= 2 and _committed_step(run_path), 180,
                               "two committed shards", proc)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert killed_at < SHARDS, "the run finished before it could be killed: make shards bigger"
    summary = main(args + ["resume=true"])  # the same command, resumed (here in-process, same cluster)
    assert summary["resumed_at_shard"] >= 2 and summary["transitions"] == N
    resumed = _check_complete(run_path)
    reference = main(_collect_args(tmp_path, "ref", pool))  # an uninterrupted run of the same config
    assert reference["transitions"] == N
    expected = ParquetStore(Path(reference["store"])).to_numpy()
    for key in ("obs", "action", "reward", "next_obs", "qpos", "shard"):
        np.testing.assert_array_equal(resumed[key], expected[key])


# -- (c) a Tune trial's process is SIGKILLed: the trial is retried from its checkpoint ----------------------------

def test_tune_trial_killed_is_retried_from_checkpoint(pool_name, tmp_path):
    from experiments.sweep import main
    pool = pool_name
    sweep_path = tmp_path / "collect" / "sw"
    trials = sweep_path / "trials" / "collect"

    def kill_trial():
        def started_and_committed():
            # Tune processes a trial's results in order: once it has logged the second, the first's checkpoint is
            # registered, so the retry restores from it (killed earlier, a retry could only resume from the disk)
            for attempts in trials.glob("*/attempts.jsonl"):
                if _committed_step(attempts.parent) >= 2 and _tune_results_with_checkpoint(sweep_path) >= 2:
                    return json.loads(attempts.read_text().splitlines()[0])["pid"]
            return None
        os.kill(wait_until(started_and_committed, 180, "a trial with two committed shards"), signal.SIGKILL)

    killer = threading.Thread(target=kill_trial, daemon=True)
    killer.start()
    summary = main(_collect_args(tmp_path, "sw", pool) + [
        "sweep=collect_throughput", "sweep.scheduler.name=fifo", "sweep.max_failures=1",
        f"sweep.space.experiment.envs_per_shard.grid=[{ENVS}]",
        f"sweep.space.experiment.num_shards.choice=[{SHARDS}]"])
    killer.join()
    assert summary["trials"] == 1 and summary["errors"] == 0, summary
    (run_path,) = list(trials.iterdir())
    attempts = [json.loads(line) for line in (run_path / "attempts.jsonl").read_text().splitlines()]
    assert len(attempts) == 2, attempts
    assert attempts[1]["resume"] and attempts[1]["restored_step"] >= 1, attempts
    assert attempts[1]["pid"] != attempts[0]["pid"]
    _check_complete(run_path)
    import pandas as pd
    table = pd.read_parquet(sweep_path / "results.parquet")
    assert table["training_iteration"].max() == SHARDS and table["step"].max() == SHARDS


# -- (d) a worker node leaves mid-run: the pool moves to the remaining node ---------------------------------------

def _pool_actor_nodes(head, pool: str) -> dict[str, str]:
    status, body = head.http("/api/v0/actors?limit=10000")
    if status != 200:
        return {}
    actors = json.loads(body)["data"]["result"]["result"]
    return {a["name"]: a["node_id"] for a in actors
            if a.get("name", "").startswith(f"{pool}-worker-") and a["state"] == "ALIVE"}


def _only_node_id(head) -> str:
    """The id of the (only) node alive now."""
    status, body = head.http("/api/v0/nodes?limit=100")
    (node,) = [n for n in json.loads(body)["data"]["result"]["result"] if n["state"] == "ALIVE"]
    return node["node_id"]


def _requests_running_on(head, node_id: str) -> int:
    status, body = head.http("/api/v0/tasks?limit=10000")
    if status != 200:
        return 0
    tasks = json.loads(body)["data"]["result"]["result"]
    return sum(1 for t in tasks if t.get("name") == "PoolWorker.run" and t.get("state") == "RUNNING"
               and t.get("node_id") == node_id)


def test_worker_node_leaves_mid_run(local_nodes, tmp_path):
    # Node death noticed after ~5 failed 1 s health checks (Ray's default period is 3 s); tighter settings mark
    # live nodes dead on a loaded 2-core machine.
    fast = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
            "RAY_health_check_failure_threshold": "5"}
    head = local_nodes.head(num_cpus=2, env=fast)
    head_node = _only_node_id(head)
    worker = local_nodes.worker(head, num_cpus=1)
    pool = "ft-node-pool"
    run_path = tmp_path / "collect" / "d"
    args = _collect_args(tmp_path, "d", pool, "pool.strategy=SPREAD", "pool.num_workers=2",
                         f"cluster.address={head.gcs_address}")
    proc = subprocess.Popen([sys.executable, "-m", "experiments.run", *args], cwd=ROOT, env=head.env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        placed = wait_until(lambda: len(p := _pool_actor_nodes(head, pool)) == 2 and p, 180, "the pool", proc,
                            every_s=0.5)
        assert len(set(placed.values())) == 2, f"pool not spread over both nodes: {placed}"
        (leaving,) = set(placed.values()) - {head_node}
        # Shards are committed in order, so progress says little about the other node: ask the state API
        # for a request running there, then take the node away in the middle of it.
        wait_until(lambda: _requests_running_on(head, leaving), 180, "a request on the worker node", proc,
                   every_s=0.25)
        worker.stop(graceful=False)  # the node vanishes: raylet, workers and all, without a goodbye
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    summary = json.loads((run_path / "summary.json").read_text())
    assert summary["transitions"] == N, summary
    assert summary["pool"]["retries"] >= 1 and summary["pool"]["restarts"] >= 1, summary["pool"]
    _check_complete(run_path)
    # the lost worker was restarted on the head (maybe after the run, which did not need to wait for it)
    after = wait_until(lambda: len(p := _pool_actor_nodes(head, pool)) == 2 and p, 60, "the restarted worker",
                       every_s=0.5)
    assert len(set(after.values())) == 1, f"both workers should now be on the head: {after}"
