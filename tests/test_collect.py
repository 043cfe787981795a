"""The first experiment end to end through the pool: Parquet out, reproducible for the same seed and any
number of pool workers."""
from __future__ import annotations

import numpy as np

from cluster.store import ParquetStore
from experiments.run import main


def _collect(tmp_path, name, workers):
    summary = main(["experiment=collect", "experiment.num_transitions=600", "experiment.num_shards=3",
                    "experiment.envs_per_shard=2", f"pool.num_workers={workers}", f"pool.name=collect-{name}",
                    f"output_dir={tmp_path}", f"run_name={name}", "seed=4"])
    return summary, ParquetStore(summary["store"]).to_numpy()


def test_collect_humanoid_is_reproducible_across_worker_counts(tmp_path, ray_cluster):
    from cluster.pool import SharedPool
    try:
        s1, a = _collect(tmp_path, "one", 1)
        s2, b = _collect(tmp_path, "two", 2)
    finally:
        for name in ("collect-one", "collect-two"):
            try:
                SharedPool.attach({"name": name}, create=False).shutdown()
            except ValueError:
                pass
    assert s1["transitions"] == s2["transitions"] == 600
    assert a["obs"].shape == (600, 348) and a["qpos"].shape == (600, 24)
    for key in ("obs", "action", "reward", "next_obs", "terminated", "qpos", "next_qvel", "shard"):
        np.testing.assert_array_equal(a[key], b[key])
    assert (tmp_path / "collect" / "one" / "config.yaml").exists()
