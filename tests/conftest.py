"""Test fixtures and the helpers tests share: one real embedded Ray cluster per test session (2 CPUs, like CI), pools
with unique names, `ray start` nodes, and the `slow` marker.

Tiers: CI (.ci/run) runs everything. `pytest -m "not slow"` is the fast tier for iteration: every test that needs a
Ray cluster (any of CLUSTER_FIXTURES, directly or through another fixture) is marked `cluster` and `slow` here, tests
that train a model first (TRAINING_FIXTURES) `slow`, and learning tests carry `@pytest.mark.slow` in their files.
Tests that start their own `ray start` nodes are also marked `nodes`: CI runs the suite as three pytest processes side
by side (tests/__main__.py): the tests on the session cluster, all others, and THIRD_LANE_MODULES.

Token auth is switched off consistently here (every client in this process and its children agrees); the job
submission test starts its own head with token auth on and checks that a client without the token is refused.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ.setdefault("MPLBACKEND", "Agg")
# Pretrained tiny models (the AttnRL SFT model) are cached here between runs: git-ignored, so a CI that keeps
# `.cache/` of its checkout skips the SFT training; a fresh clone trains it once per session.
os.environ.setdefault("ORRERY_CACHE_DIR", str(ROOT / ".cache" / "orrery"))

import pytest

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

try:
    import torch
    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass

# A test that uses one of these starts or needs a Ray cluster: it is `cluster` and `slow` (not in the fast tier).
CLUSTER_FIXTURES = frozenset({"ray_cluster", "pool_factory", "pool_name", "module_pool_name", "local_nodes"})
# A test that uses one of these trains a model first (unless cached): `slow`.
TRAINING_FIXTURES = frozenset({"sft_policy"})
# Modules of the third pytest process of ``python -m tests`` (``third_lane``; its own session cluster where a test needs
# one): two processes left a third of both cores idle while tests waited on Ray, and these were the largest modules.
# The LIFT learning modules balance the lanes: by themselves the third took 517 s while the others took ~880 s
# (benchmarks/RESULTS.md, the suite's table).
THIRD_LANE_MODULES = frozenset({"test_rehearsal", "test_sweep", "test_lift_pretrain", "test_lift_finetune"})


def pytest_configure(config):
    # registered here, not in pyproject.toml: pyproject's bytes are part of the venv's stamp (experiments/venv.py)
    config.addinivalue_line("markers", "third_lane: runs in the third process of `python -m tests`")


def pytest_collection_modifyitems(config, items):
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if CLUSTER_FIXTURES & fixtures:
            item.add_marker(pytest.mark.cluster)
        if "local_nodes" in fixtures:
            item.add_marker(pytest.mark.nodes)
        if (CLUSTER_FIXTURES | TRAINING_FIXTURES) & fixtures:
            item.add_marker(pytest.mark.slow)
        if item.module.__name__.rsplit(".", 1)[-1] in THIRD_LANE_MODULES:
            item.add_marker(pytest.mark.third_lane)


# -- the embedded cluster ------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A real local Ray cluster: 2 CPUs and one declared GPU (to check fractional-GPU placement)."""
    import ray
    from cluster.deploy.local import free_port, retry_startup
    if ray.is_initialized():
        ray.shutdown()
    temp = Path("/tmp") / f"orrery-ray-{uuid.uuid4().hex[:6]}"  # short: Ray's socket paths must fit 107 chars
    # With the dashboard, as every real cluster has it: Ray Train's placement-group cleaner asks the State API
    # (served by the dashboard) whether a learner's controller died; without it a learner killed mid-fit (a PBT
    # exploit, a killed trial) keeps its workers' CPUs reserved for the rest of the session.
    # again if it misses Ray's 30 s registration window, as a loaded machine sometimes does
    ctx = retry_startup(lambda: ray.init(
        address="local", num_cpus=2, num_gpus=1, include_dashboard=True, dashboard_port=free_port(),
        object_store_memory=256 * 1024 * 1024, _temp_dir=str(temp), namespace="orrery",
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}}, log_to_driver=False),
        cleanup=ray.shutdown)
    yield ctx
    ray.shutdown()


@pytest.fixture
def pool_name(ray_cluster):
    """A unique pool name for a run the test starts (in-process or as a driver on the session cluster); the pool is
    shut down after the test."""
    name = f"test-pool-{uuid.uuid4().hex[:6]}"
    yield name
    from cluster.pool import shutdown_pool
    shutdown_pool(name)


@pytest.fixture(scope="module")
def module_pool_name(ray_cluster):
    """A pool name for all the runs of one module's tests that do not kill the pool's processes: they attach to one
    pool by name, as runs share a cluster's pool. A pool costs a manager and its workers, which import their
    samplers' code on their first request: seconds of CPU each on CI's 2 shared cores, per pool."""
    name = f"test-pool-{uuid.uuid4().hex[:6]}"
    yield name
    from cluster.pool import shutdown_pool
    shutdown_pool(name)


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


# -- `ray start` nodes ---------------------------------------------------------------------------------------------

class LocalNodes:
    """Starts `ray start` nodes (cluster.deploy.local.LocalNode), each in its own short temp dir; the fixture stops
    them all, workers first."""

    def __init__(self, temp: Path) -> None:
        self.temp, self.nodes = temp, []

    def head(self, **kwargs):
        from cluster.deploy.local import LocalNode
        return self._add(LocalNode.head(self.temp / f"n{len(self.nodes)}", **kwargs))

    def worker(self, head, **kwargs):
        from cluster.deploy.local import LocalNode
        return self._add(LocalNode.worker(head, self.temp / f"n{len(self.nodes)}", **kwargs))

    def _add(self, node):
        self.nodes.append(node)
        return node

    def stop_all(self) -> None:
        for node in reversed(self.nodes):
            node.stop()


@pytest.fixture(scope="module")
def local_nodes():
    """`ray start` nodes for this module's tests (a module-scoped fixture of the module can build one cluster that
    all its tests share); all are stopped when the module ends."""
    temp = Path(tempfile.mkdtemp(prefix="orr-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    nodes = LocalNodes(temp)
    try:
        yield nodes
    finally:
        nodes.stop_all()
        shutil.rmtree(temp, ignore_errors=True)


# -- pretrained models ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sft_policy():
    """The default (laptop-scale) AttnRL task, tiny GPT and SFT run: (policy, task, info). Trained once and kept in
    ORRERY_CACHE_DIR (algos.attnrl.sft.default_cache_dir), so later modules and runs load it."""
    from algos.attnrl.gpt import GPTConfig
    from algos.attnrl.sft import SFTConfig, default_cache_dir, pretrained_policy
    from envs.reasoning.task import ReasoningTask
    task = ReasoningTask()
    policy, info = pretrained_policy(task, GPTConfig(vocab_size=task.tokenizer.vocab_size), SFTConfig(),
                                     cache_dir=default_cache_dir())
    return policy, task, info
