"""Metrics: per-iteration rows to Parquet and TensorBoard, a progress line for people, Ray metrics for Prometheus."""
from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from cluster.store import ParquetStore

log = logging.getLogger(__name__)


class MetricsLogger:
    """``log(step, metrics)`` buffers a row; every ``flush_every`` rows (and on ``close``) they go to Parquet.

    Only numbers are kept (Parquet wants a schema; TensorBoard wants scalars).
    """

    def __init__(self, run_path: str | Path, flush_every: int = 10, tensorboard: bool = True) -> None:
        self.store = ParquetStore(Path(run_path) / "metrics")
        self.rows: list[dict[str, float]] = []
        self.flush_every = flush_every
        self.writer = None
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter
                self.writer = SummaryWriter(str(Path(run_path) / "tb"))
            except ImportError:  # pragma: no cover - tensorboardX comes with ray[tune]
                log.warning("tensorboardX missing: no TensorBoard logs")

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        row = {"step": float(step), "time": time.time()}
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) or hasattr(value, "item"):
                row[key] = float(value)
        self.rows.append(row)
        if self.writer is not None:
            for key, value in row.items():
                if key not in ("step", "time") and math.isfinite(value):
                    self.writer.add_scalar(key, value, step)
        if len(self.rows) >= self.flush_every:
            self.flush()
        return row

    def flush(self) -> None:
        if not self.rows:
            return
        keys = sorted({k for r in self.rows for k in r})
        self.store.append({k: [r.get(k, float("nan")) for r in self.rows] for k in keys})
        self.rows = []
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        self.flush()
        if self.writer is not None:
            self.writer.close()


class Progress:
    """One line per update to stderr: ``[name] 12/100 (12%) 340 steps/s ETA 0:42 | key=value ...``."""

    def __init__(self, name: str, total: float, unit: str = "steps", every_s: float = 5.0) -> None:
        self.name, self.total, self.unit, self.every_s = name, total, unit, every_s
        self.start = time.perf_counter()
        self.last = 0.0

    def update(self, done: float, force: bool = False, **info: Any) -> None:
        now = time.perf_counter()
        if not force and now - self.last < self.every_s and done < self.total:
            return
        self.last = now
        elapsed = now - self.start
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - done) / rate if rate > 0 else float("inf")
        eta_s = "?" if not math.isfinite(eta) else f"{int(eta // 60)}:{int(eta % 60):02d}"
        extra = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in info.items())
        pct = 100.0 * done / self.total if self.total else 100.0
        print(f"[{self.name}] {done:.0f}/{self.total:.0f} {self.unit} ({pct:.0f}%) {rate:.1f} {self.unit}/s "
              f"ETA {eta_s} | {extra}", file=sys.stderr, flush=True)


def read_metrics(run_path: str | Path):
    """The run's metrics as a pandas DataFrame sorted by step."""
    table = ParquetStore(Path(run_path) / "metrics").read()
    return table.to_pandas().sort_values("step").reset_index(drop=True)
