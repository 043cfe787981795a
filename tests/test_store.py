"""Parquet store: shapes round-trip, appends are atomic, a crash mid-write never corrupts earlier chunks."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from cluster.store import ParquetStore


def test_round_trip_keeps_shapes_and_dtypes(tmp_path):
    store = ParquetStore(tmp_path / "s")
    a = {"obs": np.random.rand(5, 3, 2).astype(np.float32), "r": np.arange(5, dtype=np.float64),
         "done": np.array([0, 1, 0, 0, 1], dtype=np.int64)}
    b = {k: v[:2] * 2 for k, v in a.items()}
    store.append(a)
    store.append(b)
    out = store.to_numpy()
    assert len(store) == 7 and store.num_parts == 2
    np.testing.assert_array_equal(out["obs"], np.concatenate([a["obs"], b["obs"]]))
    assert out["obs"].dtype == np.float32 and out["obs"].shape == (7, 3, 2)
    t = store.to_torch(["r"])
    assert torch.equal(t["r"], torch.as_tensor(np.concatenate([a["r"], b["r"]])))


def test_ragged_columns_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="rows"):
        ParquetStore(tmp_path).append({"a": np.zeros(3), "b": np.zeros(4)})


def test_crash_mid_append_leaves_earlier_chunks_readable(tmp_path):
    store = ParquetStore(tmp_path / "s")
    store.append({"x": np.arange(10)})
    # a writer killed while writing its chunk: SIGKILL in the middle of a large append
    code = (
        "import numpy as np, os, signal, threading, time\n"
        "from cluster.store import ParquetStore\n"
        "threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()\n"
        f"s = ParquetStore({str(tmp_path / 's')!r})\n"
        "while True: s.append({'x': np.arange(3_000_000)})\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, timeout=60)
    assert proc.returncode == -9
    (tmp_path / "s" / ".part-000099.parquet.tmp").write_bytes(b"half a parquet file")
    data = store.to_numpy()["x"]
    np.testing.assert_array_equal(data[:10], np.arange(10))
    assert len(data) == 10 + 3_000_000 * (store.num_parts - 1)
    store.append({"x": np.arange(3)})  # appending after the crash continues cleanly
    assert store.to_numpy()["x"][-3:].tolist() == [0, 1, 2]


def test_rollback_drops_chunks_after_a_checkpoint(tmp_path):
    store = ParquetStore(tmp_path)
    for i in range(4):
        store.append({"x": np.full(2, i)})
    assert store.rollback(2) == 2
    assert store.to_numpy()["x"].tolist() == [0, 0, 1, 1]


def test_learner_journal_rolls_back_its_own_stores_and_metrics_only(tmp_path):
    """A learner rank saves journal.parts() in its checkpoint; resuming cuts its replay and metrics back to them and
    leaves another rank's store alone, so no row (metrics included) is written twice."""
    from cluster.journal import Journal
    from cluster.metrics import MetricsLogger
    mine, other = ParquetStore(tmp_path / "data" / "replay-rank0"), ParquetStore(tmp_path / "data" / "replay-rank1")
    metrics = MetricsLogger(tmp_path, tensorboard=False)
    journal = Journal(tmp_path, [mine], metrics=metrics)
    for step in range(3):
        mine.append({"x": np.arange(2)})
        other.append({"x": np.arange(2)})
        metrics.log(step, {"loss": float(step)})
    saved = journal.parts()  # the checkpoint
    assert saved == {"data/replay-rank0": 3, "metrics": 1}
    mine.append({"x": np.arange(2)})  # work after the checkpoint, then a crash
    other.append({"x": np.arange(2)})
    metrics.log(3, {"loss": 3.0})
    metrics.flush()
    metrics.log(4, {"loss": 4.0})  # buffered, never flushed
    assert journal.rollback(saved) == 2
    assert mine.num_parts == 3 and other.num_parts == 4
    metrics.log(3, {"loss": 30.0})
    metrics.flush()
    steps = ParquetStore(tmp_path / "metrics").to_numpy(["step"])["step"]
    assert sorted(steps.tolist()) == [0.0, 1.0, 2.0, 3.0]
