"""`ray job submit` against a real head node with token authentication on: the documented command runs a smoke
collect job to SUCCEEDED, its logs and Parquet output are there, the upload leaves the big folders behind, the job's
interpreter does not come from the head's PATH, and a client without the token is refused.

The head is a separate `ray start --head` process (own temp dir and ports, a private HOME so no ~/.ray/auth_token is
read or left behind); this process's own test cluster (RAY_AUTH_MODE=disabled) is not touched.
"""
from __future__ import annotations

import json
import secrets
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from cluster.deploy.local import node_env, ray_executable
from cluster.store import ParquetStore

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def token_head(local_nodes):
    home_token = Path.home() / ".ray" / "auth_token"
    existed = home_token.exists()
    # The venv is deliberately NOT on the head's PATH: a bare `python` entrypoint would not find ray there (P2).
    head = local_nodes.head(num_cpus=2, token=secrets.token_hex(32), env={"PATH": "/usr/bin:/bin"})
    yield head
    head.stop()
    assert existed or not home_token.exists(), "the test must not leave ~/.ray/auth_token behind"


def _cli(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([ray_executable(), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_job_submit_with_token_auth(token_head, tmp_path):
    head = token_head
    url = head.dashboard_url

    # -- without the token the cluster refuses: no header -> 401, a wrong token -> 403, the CLI fails
    assert head.http("/api/version", token=None)[0] == 401
    assert head.http("/api/version", token="0" * 64)[0] == 403
    refused = _cli(["job", "list", "--address", url], node_env(None, tmp_path), timeout=120)
    assert refused.returncode != 0
    assert "401" in refused.stdout + refused.stderr or "Unauthorized" in refused.stdout + refused.stderr

    # -- the documented submission: upload the checkout minus big folders, the venv's absolute interpreter
    job_id = f"orrery-smoke-{uuid.uuid4().hex[:6]}"
    out_dir = tmp_path / "runs"
    entry = [sys.executable, "-m", "experiments.run", "experiment=collect", "cluster=remote",
             "experiment.num_transitions=300", "experiment.num_shards=3", "experiment.envs_per_shard=2",
             f"pool.name=job-pool-{job_id[-6:]}", f"output_dir={out_dir}", "run_name=job"]
    submit = _cli(["job", "submit", "--address", url, "--submission-id", job_id, "--working-dir", ".",
                   "--runtime-env", "configs/runtime_env.yaml", "--", *entry], head.env)
    assert submit.returncode == 0, submit.stdout[-3000:] + submit.stderr[-3000:]

    status, body = head.http(f"/api/jobs/{job_id}")
    assert status == 200 and json.loads(body)["status"] == "SUCCEEDED", body
    status, body = head.http(f"/api/jobs/{job_id}/logs")
    logs = json.loads(body)["logs"]
    assert "collected 300 transitions of Humanoid-v5 in 3 shards" in logs, logs[-3000:]
    assert f"run directory: {out_dir / 'collect' / 'job'}" in logs

    # -- outputs: 300 transitions of 3 shards in Parquet, one commit per shard
    data = ParquetStore(out_dir / "collect" / "job" / "data" / "transitions").to_numpy(["shard", "reward"])
    assert len(data["reward"]) == 300
    assert sorted(set(data["shard"].tolist())) == [0, 1, 2]
    summary = json.loads((out_dir / "collect" / "job" / "summary.json").read_text())
    assert summary["transitions"] == 300 and summary["pool"]["requests"] == 3

    # -- what was uploaded: the code, not .git / .venv / caches
    packages = [p for p in (head.temp_dir / "session_latest" / "runtime_resources" / "working_dir_files").glob("*")
                if p.is_dir()]
    assert len(packages) == 1, packages
    pkg = packages[0]
    assert (pkg / "experiments" / "run.py").exists() and (pkg / "configs" / "config.yaml").exists()
    for excluded in (".git", ".venv", "runs", ".pytest_cache", "benchmarks/out", "MUJOCO_LOG.TXT"):
        assert not (pkg / excluded).exists(), f"{excluded} was uploaded"
    assert not list(pkg.rglob("__pycache__"))
