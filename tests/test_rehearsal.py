"""The paper's structure, rehearsed on a real multi-node Ray cluster on this machine: a head and two worker nodes
started with `ray start` (token auth on), the worker nodes declaring logical GPUs. Every experiment runs on it with
`scale=rehearsal`: 2 Ray Train workers in DDP asking for GPUs, the pool SPREAD over the nodes with a fractional-GPU
worker group for the model samplers, at smoke sizes. One run goes through `ray job submit`.

Without CUDA every process computes on the CPU (cluster/devices.py); what is checked is the structure: placement,
per-rank checkpoints, identical DDP replicas, the sweep, and the README's `ray job submit` (token refusals, what is
uploaded, the job's interpreter not from the nodes' PATH), on nodes that are separate raylets.
"""
from __future__ import annotations

import json
import secrets
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from cluster.deploy.local import LocalNode, node_env, ray_executable
from cluster.rundir import RunDir
from cluster.store import ParquetStore

ROOT = Path(__file__).resolve().parents[1]
POOL = f"rehearsal-{uuid.uuid4().hex[:6]}"


class Cluster:
    def __init__(self, head: LocalNode, workers: list[LocalNode], out: Path) -> None:
        self.head, self.workers, self.out = head, workers, out
        self.env = {**head.env, "OMP_NUM_THREADS": "1"}

    def _cmd(self, args: tuple[str, ...], module: str) -> list[str]:
        return [sys.executable, "-m", module, *args, "scale=rehearsal", "cluster=remote",
                f"cluster.address={self.head.gcs_address}", f"pool.name={POOL}", f"output_dir={self.out}"]

    def run(self, *args: str, module: str = "experiments.run", timeout: float = 600) -> subprocess.CompletedProcess:
        cmd = self._cmd(args, module)
        proc = subprocess.run(cmd, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
        return proc

    def run_together(self, *runs: tuple[str, ...], timeout: float = 600) -> None:
        """Several drivers at once on the cluster (as several users would submit them); each must succeed."""
        cmds = [self._cmd(args, "experiments.run") for args in runs]
        procs = [subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for cmd in cmds]
        for cmd, proc in zip(cmds, procs):
            out, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, f"{' '.join(cmd)}\n{out[-3000:]}\n{err[-4000:]}"

    def summary(self, experiment: str, run: str) -> dict:
        return json.loads((self.out / experiment / run / "summary.json").read_text())

    def pool_stats(self) -> dict:
        script = ("import json, ray\n"
                  f"ray.init(address={self.head.gcs_address!r}, namespace='orrery', log_to_driver=False)\n"
                  "from cluster.pool import SharedPool\n"
                  f"print('STATS', json.dumps(SharedPool.attach({{'name': {POOL!r}}}, create=False).stats()))\n")
        proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.split("STATS", 1)[1])


@pytest.fixture(scope="module")
def cluster(local_nodes, tmp_path_factory):
    """One cluster for every rehearsal run of this module: a head (token auth on) and two worker nodes. The venv is
    deliberately NOT on the nodes' PATH: a job whose entrypoint is a bare `python` would not find ray there (P2)."""
    home_token = Path.home() / ".ray" / "auth_token"
    existed = home_token.exists()
    head = local_nodes.head(num_cpus=1, token=secrets.token_hex(32), env={"PATH": "/usr/bin:/bin"})
    workers = [local_nodes.worker(head, num_cpus=2, num_gpus=2) for _ in range(2)]
    yield Cluster(head, workers, tmp_path_factory.mktemp("rehearsal-runs"))
    assert existed or not home_token.exists(), "the rehearsal must not leave ~/.ray/auth_token behind"


def _cli(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([ray_executable(), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_collect_as_a_submitted_job_with_token_auth(cluster, tmp_path):
    """The README's `ray job submit`: a client without the token is refused (no header 401, a wrong token 403, the
    CLI fails); the documented submission (the checkout minus big folders, the venv's absolute interpreter) runs a
    collect job to SUCCEEDED with its logs and Parquet output, uploading the code and not .git, .venv or caches."""
    head = cluster.head
    url = head.dashboard_url
    assert head.http("/api/version", token=None)[0] == 401
    assert head.http("/api/version", token="0" * 64)[0] == 403
    refused = _cli(["job", "list", "--address", url], node_env(None, tmp_path), timeout=120)
    assert refused.returncode != 0
    assert "401" in refused.stdout + refused.stderr or "Unauthorized" in refused.stdout + refused.stderr

    job_id = f"orrery-rehearsal-{uuid.uuid4().hex[:6]}"
    entry = [sys.executable, "-m", "experiments.run", "experiment=collect", "scale=rehearsal", "cluster=remote",
             "experiment.num_transitions=120", "experiment.num_shards=2", "experiment.envs_per_shard=2",
             f"pool.name={POOL}", f"output_dir={cluster.out}", "run_name=job"]
    submit = _cli(["job", "submit", "--address", url, "--submission-id", job_id, "--working-dir", ".",
                   "--runtime-env", "configs/runtime_env.yaml", "--", *entry], cluster.env, timeout=600)
    assert submit.returncode == 0, submit.stdout[-3000:] + submit.stderr[-3000:]
    status, body = head.http(f"/api/jobs/{job_id}")
    assert status == 200 and json.loads(body)["status"] == "SUCCEEDED", body
    logs = json.loads(head.http(f"/api/jobs/{job_id}/logs")[1])["logs"]
    assert "collected 120 transitions of Humanoid-v5 in 2 shards" in logs, logs[-3000:]
    assert f"run directory: {cluster.out / 'collect' / 'job'}" in logs

    run = cluster.out / "collect" / "job"
    data = ParquetStore(run / "data" / "transitions").to_numpy(["shard", "reward"])
    assert len(data["reward"]) == 120 and sorted(set(data["shard"].tolist())) == [0, 1]
    summary = cluster.summary("collect", "job")
    # each shard ran once, or again only if the client lost the map's stream and re-sent it (at least once)
    served, resent = summary["pool"]["requests"], summary["pool"]["client"]["resent"]
    assert summary["transitions"] == 120 and 2 <= served <= 2 + resent, (summary["pool"], logs[-3000:])

    packages = [p for p in (head.temp_dir / "session_latest" / "runtime_resources" / "working_dir_files").glob("*")
                if p.is_dir()]
    assert len(packages) == 1, packages
    pkg = packages[0]
    assert (pkg / "experiments" / "run.py").exists() and (pkg / "configs" / "config.yaml").exists()
    for excluded in (".git", ".venv", "runs", ".pytest_cache", "benchmarks/out", "MUJOCO_LOG.TXT"):
        assert not (pkg / excluded).exists(), f"{excluded} was uploaded"
    assert not list(pkg.rglob("__pycache__"))


VIDD_TINY = ["experiment.methods=[vidd,best_of_n]", "experiment.n_train=200", "experiment.n_heldout=20",
             "experiment.seq_len=32", "experiment.d_model=32", "experiment.n_layers=1", "experiment.n_heads=2",
             "experiment.pretrain_steps=20", "experiment.num_sampling_steps=6", "experiment.query_budget=64",
             "experiment.batch_size=8", "experiment.timesteps_per_trajectory=2", "experiment.refresh_interval=2",
             "experiment.best_of_n_outputs=16", "experiment.eval_samples=16", "experiment.eval_every=0",
             "experiment.nll_time_samples=1", "experiment.refresh_check=off"]


def _tiny_tour() -> list[str]:
    """The tour's test budgets (tests/test_tour.py); LIFT pretraining also checkpoints mid-run, each rank its shard."""
    from tests.helpers import TINY
    return [*TINY, '+experiment.overrides.lift_pretrain=["experiment.checkpoint_every_updates=256"]']


def test_tour_with_ddp_learners_on_one_pool(cluster):
    """The main job's LIFT part at rehearsal structure (pretrain -> finetune) with a VIDD driver (the DNA task: its
    oracle and data on the worker nodes) submitted at the same time, each learner 2 DDP replicas asking for GPUs, on
    one pool spread over the nodes; the replicas end identical, each LIFT pretraining rank checkpoints its own shard
    and replay, and each LIFT finetuning rank keeps (and checkpoints) its own real env shard. The tour's own VIDD
    stage (molecules) is VIDD's driver on another task: test_vidd_cluster runs it on the session cluster, and
    test_vidd_config_keys runs the protein task's oracle and data. AttnRL's 2 DDP ranks (identical, killed and
    resumed) are test_attnrl_cluster's and E-CIT's tour is test_tour's, both on the session cluster: here they would
    add CPU time and no structure."""
    from cluster.metrics import read_metrics
    from tests.helpers import check_tour
    cluster.run_together(("experiment=tour", "experiment.methods=[lift]", "run_name=t", *_tiny_tour()),
                         ("experiment=vidd_dna", "run_name=vidd_dna", *VIDD_TINY), timeout=1500)
    tour = cluster.out / "tour" / "t"
    check_tour(tour, ["lift"])
    runs = tour / "runs"
    import torch

    # LIFT pretraining: 2 DDP learners asking for GPUs, one checkpoint shard and one Parquet replay per rank
    pre_run = runs / "lift_pretrain" / "lift_pretrain"
    pre = json.loads((pre_run / "summary.json").read_text())
    assert pre["train_workers"] == 2 and pre["param_max_abs_diff"] == 0.0, pre
    ckpts = RunDir(pre_run).learner_checkpoints()
    assert ckpts and {p.name for p in ckpts[-1].iterdir()} >= {"rank0.pt", "rank1.pt"}, "one shard per rank"
    # each rank's shard holds its own replay (Ray Train merged the files; nothing was gathered into rank 0)
    ranks = [torch.load(ckpts[-1] / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert all(r["buffer"]["size"] > 0 for r in ranks)
    assert not torch.equal(ranks[0]["buffer"]["storage"]["obs"][:8], ranks[1]["buffer"]["storage"]["obs"][:8])
    assert len(list((pre_run / "data").glob("replay-rank*"))) == 2
    assert len(ParquetStore(pre_run / "data" / "replay-rank0")) + len(ParquetStore(pre_run / "data" / "replay-rank1")) \
        == pre["env_steps"]
    # the pool is SPREAD over both worker nodes, its model samplers on fractional GPUs
    stats = cluster.pool_stats()
    nodes = {g: {w["node_id"] for w in stats["workers"] if w.get("group") == g} for g in ("default", "gpu")}
    assert len(nodes["default"]) == 2 and len(nodes["gpu"]) == 2, f"the pool is SPREAD over both nodes: {nodes}"
    gpu_workers = [w for w in stats["workers"] if w.get("group") == "gpu"]
    assert all(w["resources"].get("GPU") == 0.25 for w in gpu_workers), gpu_workers

    df = read_metrics(runs / "lift_finetune" / "lift_finetune").dropna(subset=["param_max_abs_diff"])
    assert len(df) >= 2 and (df["param_max_abs_diff"] == 0.0).all(), df  # lift and sac_finetune
    dna = cluster.summary("vidd_dna", "vidd_dna")
    assert set(dna["methods"]) == {"vidd", "best_of_n"} and 0 < dna["methods"]["vidd"]["queries"] <= 64, dna
    df = read_metrics(cluster.out / "vidd_dna" / "vidd_dna").dropna(subset=["param_max_abs_diff"])
    assert len(df) == 1 and df["param_max_abs_diff"].iloc[0] == 0.0, df
    # LIFT finetuning: each rank has its own real env shard, world model and replay, and checkpoints its own file
    for method in ("lift", "sac_finetune"):
        ckpt = RunDir(runs / "lift_finetune" / "lift_finetune").learner_checkpoints(f"learner-{method}")[-1]
        ranks = [torch.load(ckpt / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
        assert all(r["real_buffer"]["size"] == 300 for r in ranks), "each rank keeps its own shard's 300 steps"
        assert not torch.equal(ranks[0]["real_buffer"]["storage"]["obs"], ranks[1]["real_buffer"]["storage"]["obs"])


def test_a_sweep_of_ddp_learners(cluster):
    """Two lift_pretrain trials at once, each a Ray Train learner of 2 DDP workers asking for GPUs. What is checked is
    the placement (trials x workers on the nodes); DDP's identical replicas after updates are the tour's check, so the
    trials stop at the preset's first update (min_replay_size 1024 is above 512 steps)."""
    cluster.run("experiment=lift_pretrain", "env=pendulum", "sweep=lift_pretrain_lr", "run_name=sw",
                "sweep.scheduler.name=fifo", "sweep.num_samples=2", "sweep.max_concurrent=2", "experiment.total_env_steps=512",
                "experiment.eval_every_steps=512", "experiment.eval_episodes=1", module="experiments.sweep")
    trials = sorted((cluster.out / "lift_pretrain" / "sw" / "trials" / "lift_pretrain").iterdir())
    assert len(trials) == 2, trials
    for trial in trials:
        summary = json.loads((trial / "summary.json").read_text())
        assert summary["train_workers"] == 2 and summary["param_max_abs_diff"] == 0.0, (trial, summary)


MULTI_NODE_DRIVER = """
import json, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
from cluster import storage
token = storage.write_marker(sys.argv[2])
nodes = storage.alive_nodes()
out = {"nodes": len(nodes), "missing": storage.nodes_not_seeing(sys.argv[2], token),
       "wrong": storage.nodes_not_seeing(sys.argv[2], "not the token"),
       "inputs_differ": storage.nodes_reading_otherwise(sys.argv[2]),
       "inputs_wrong": storage.nodes_reading_otherwise(sys.argv[2], expected="another copy")}
storage.require_shared(sys.argv[2])  # every node of this one machine sees the directory: passes
storage.require_same_inputs([sys.argv[2]])  # and reads the same files there: passes
print("RESULT", json.dumps(out), flush=True)
"""


def test_every_node_is_asked_whether_it_sees_the_output_dir(cluster, tmp_path):
    """cluster/storage.py on separate raylets: the check places one task on each of the three nodes and hears from
    each; a token no node wrote is reported by every node, and a directory all nodes read alike passes both checks."""
    proc = subprocess.run([sys.executable, "-c", MULTI_NODE_DRIVER, cluster.head.gcs_address, str(tmp_path / "runs")],
                          cwd=ROOT, env=cluster.env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1].split(" ", 1)[1])
    assert out["nodes"] == 3 and out["missing"] == [] and len(out["wrong"]) == 3 and len(set(out["wrong"])) == 3
    assert out["inputs_differ"] == [] and sorted(out["inputs_wrong"]) == sorted(out["wrong"])
