"""Test fixtures: one real embedded Ray cluster per test session (2 CPUs, like CI), pools with unique names.

Token auth is switched off consistently here (every client in this process and its children agrees); the job
submission test starts its own head with token auth on and checks that a client without the token is refused.
"""
from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

try:
    import torch
    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A real local Ray cluster: 2 CPUs and one declared GPU (to check fractional-GPU placement)."""
    import ray
    from cluster.deploy.local import free_port
    if ray.is_initialized():
        ray.shutdown()
    temp = Path("/tmp") / f"orrery-ray-{uuid.uuid4().hex[:6]}"  # short: Ray's socket paths must fit 107 chars
    # With the dashboard, as every real cluster has it: Ray Train's placement-group cleaner asks the State API
    # (served by the dashboard) whether a learner's controller died; without it a learner killed mid-fit (a PBT
    # exploit, a killed trial) keeps its workers' CPUs reserved for the rest of the session.
    ctx = ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=True, dashboard_port=free_port(),
                   object_store_memory=256 * 1024 * 1024, _temp_dir=str(temp), namespace="orrery",
                   runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}},
                   log_to_driver=False)
    yield ctx
    ray.shutdown()


@pytest.fixture
def pool_factory(ray_cluster):
    """Make pools with unique names; all are shut down after the test."""
    from experiments.registry import attach_pool
    made = []

    def make(**kwargs):
        kwargs.setdefault("name", f"test-pool-{uuid.uuid4().hex[:6]}")
        pool = attach_pool(kwargs)
        made.append(pool)
        return pool

    yield make
    for pool in made:
        try:
            pool.shutdown()
        except Exception:  # noqa: BLE001 - best effort cleanup
            pass
