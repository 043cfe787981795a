"""Metrics: per-iteration rows to Parquet and TensorBoard, a progress line for people, Ray metrics for Prometheus."""
from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from cluster.store import ParquetStore

log = logging.getLogger(__name__)

LEARNER_PREFIX = "orrery_learner"  # a learner's gauges: ray_orrery_learner_<metric>{run, method} on the metrics endpoint


class MetricsLogger:
    """``log(step, metrics)`` buffers a row; every ``flush_every`` rows (and on ``close``) they go to Parquet.

    Only numbers are kept (Parquet wants a schema; TensorBoard wants scalars). With ``gauges`` (tags, e.g.
    ``{"run": run_id, "method": "vidd"}``) every row is also exported as Ray gauges ``orrery_learner_<key>`` with those
    tags, so Prometheus/Grafana and the Ray dashboard follow the learner while it runs (``RayGauges``).

    TensorBoard events go to ``<run>/tb/`` (``tb/<method>/`` for a logger with a ``method`` tag: one TensorBoard run
    per learner, so two methods of a run never share a chart line). A resumed learner cuts them back to its
    checkpoint (:meth:`truncate_tensorboard`, called by ``cluster.journal``), so no step is shown twice.
    """

    def __init__(self, run_path: str | Path, flush_every: int = 10, tensorboard: bool = True,
                 gauges: Mapping[str, str] | None = None) -> None:
        self.store = ParquetStore(Path(run_path) / "metrics")
        self.rows: list[dict[str, float]] = []
        self.flush_every = flush_every
        self.gauges = RayGauges(LEARNER_PREFIX, tags=gauges) if gauges else None
        method = (gauges or {}).get("method")
        self.tb_dir: Path | None = (Path(run_path) / "tb" / (_metric_name(method) if method else "")
                                    if tensorboard else None)
        self.writer = None  # opened on the first row, after a resume has cut the old events back
        self.last_step: float | None = None  # the step of the last row logged (saved with checkpoints by the journal)

    def _tensorboard(self) -> "ScalarEventFile | None":
        if self.writer is None and self.tb_dir is not None:
            try:
                self.writer = ScalarEventFile(self.tb_dir)
            except ImportError:  # pragma: no cover - tensorboardX comes with ray[tune]
                log.warning("tensorboardX missing: no TensorBoard logs")
                self.tb_dir = None
        return self.writer

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        row = {"step": float(step), "time": time.time()}
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) or hasattr(value, "item"):
                row[key] = float(value)
        self.rows.append(row)
        self.last_step = row["step"]
        if self.gauges is not None:
            self.gauges.set({k: v for k, v in row.items() if k != "time"})
        if (writer := self._tensorboard()) is not None:
            for key, value in row.items():
                if key not in ("step", "time") and math.isfinite(value):
                    writer.add_scalar(key, value, step)
        if len(self.rows) >= self.flush_every:
            self.flush()
        return row

    def truncate_tensorboard(self, last_step: float) -> int:
        """Drop this logger's TensorBoard events after ``last_step`` (those of an attempt that a resume abandons), so
        the steps that follow are shown once. Returns the number of events dropped."""
        if self.writer is not None:  # reopened on the next row, in a new file
            self.writer.close()
            self.writer = None
        self.last_step = last_step
        if self.tb_dir is None or not self.tb_dir.is_dir():
            return 0
        dropped = sum(_truncate_event_file(f, last_step) for f in sorted(self.tb_dir.glob("events.out.tfevents.*")))
        if dropped:
            log.warning("resume: dropped %d TensorBoard event(s) after step %g in %s", dropped, last_step, self.tb_dir)
        return dropped

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
            self.writer = None


class ScalarEventFile:
    """A TensorBoard event file of scalars, written in the caller's thread. tensorboardX's SummaryWriter hands events
    to a thread through a queue, and its ``flush()`` does not wait for that queue: the events of a checkpoint could
    still be in memory when a learner died after it, and a resume (which never logs those steps again) lost them."""

    def __init__(self, tb_dir: Path) -> None:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary
        self._event, self._summary = Event, Summary  # imported once, not on every scalar
        tb_dir.mkdir(parents=True, exist_ok=True)
        # tensorboardX names a file by the second it opens it: a writer of the same second (a resume, a second
        # logger) would overwrite it. Nanoseconds keep the names unique and in the order TensorBoard reads them.
        self._events = EventsWriter(str(tb_dir / "events"), f".{time.time_ns()}")

    def add_scalar(self, tag: str, value: float, step: float) -> None:
        value_pb = self._summary.Value(tag=tag, simple_value=float(value))
        self._events.write_event(self._event(wall_time=time.time(), step=int(step),
                                             summary=self._summary(value=[value_pb])))

    def flush(self) -> None:
        self._events.flush()  # to the disk (fsync): what a checkpoint saw is what a resume finds

    def close(self) -> None:
        self._events.close()


def _truncate_event_file(path: Path, last_step: float) -> int:
    """Rewrite a TensorBoard event file (TFRecord: length, crc, event, crc) without the events after ``last_step``;
    a record that a kill cut short is dropped too. Returns the number of events dropped."""
    import struct

    from tensorboardX.proto.event_pb2 import Event
    data = path.read_bytes()
    kept, dropped, pos = [], 0, 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        end = pos + 12 + length + 4
        if end > len(data):
            break
        event = Event.FromString(data[pos + 12:pos + 12 + length])
        if event.step > last_step:
            dropped += 1
        else:
            kept.append(data[pos:end])
        pos = end
    if dropped or pos != len(data):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(b"".join(kept))
        os.replace(tmp, path)
    return dropped


def learner_tags(run_id: str, method: str) -> dict[str, str]:
    """The tags of a learner's gauges: the run's unique id (``<experiment>/<run name>/<uid>``), its experiment and the
    method the learner trains (the Grafana dashboard's rows and filters)."""
    return {"run": run_id, "experiment": run_id.split("/", 1)[0], "method": method}


class Progress:
    """One line per update to stderr: ``[name] 12/100 (12%) 340 steps/s ETA 0:42 | key=value ...``.

    The rate and ETA count from ``done`` at the start (a resumed run: :meth:`resumed_at`), so a resume shows the
    rate of this attempt, not its work over its first seconds."""

    def __init__(self, name: str, total: float, unit: str = "steps", every_s: float = 5.0, done: float = 0.0) -> None:
        self.name, self.total, self.unit, self.every_s = name, total, unit, every_s
        self.start = time.perf_counter()
        self.start_done = float(done)
        self.last = 0.0

    def resumed_at(self, done: float) -> None:
        """The run resumed with ``done`` already behind it: the rate and ETA count from here and now."""
        self.start, self.start_done = time.perf_counter(), float(done)

    def update(self, done: float, force: bool = False, **info: Any) -> None:
        now = time.perf_counter()
        if not force and now - self.last < self.every_s and done < self.total:
            return
        self.last = now
        elapsed = now - self.start
        rate = (done - self.start_done) / elapsed if elapsed > 0 else 0.0
        sys.stderr.write(self.line(done, rate, **info) + "\n")
        sys.stderr.flush()

    def line(self, done: float, rate: float, **info: Any) -> str:
        """The progress line. Written to stderr directly, not printed: Ray Train's workers patch ``print`` to log
        every line as well as print it, so a printed line showed twice in a job's log. A value not known yet (nan:
        no evaluation since a resume) is left out rather than shown as nan."""
        left = max(self.total - done, 0.0)
        eta = 0.0 if left == 0 else left / rate if rate > 0 else float("inf")  # done: 0:00, whatever the rate
        eta_s = "?" if not math.isfinite(eta) else f"{int(eta // 60)}:{int(eta % 60):02d}"
        shown = {k: v for k, v in info.items() if not (isinstance(v, float) and not math.isfinite(v))}
        extra = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items())
        pct = 100.0 * done / self.total if self.total else 100.0
        return (f"[{self.name}] {done:.0f}/{self.total:.0f} {self.unit} ({pct:.0f}%) {rate:.1f} {self.unit}/s "
                f"ETA {eta_s}" + (f" | {extra}" if extra else ""))


def read_metrics(run_path: str | Path):
    """The run's metrics as a pandas DataFrame sorted by step."""
    table = ParquetStore(Path(run_path) / "metrics").read()
    return table.to_pandas().sort_values("step").reset_index(drop=True)


class RayGauges:
    """Export a metrics dict as Ray gauges, so Prometheus/Grafana see it on every node's metrics endpoint.

    One line per report, from a driver, an actor or a Ray Train worker (rank 0)::

        gauges = RayGauges("orrery_learner", tags={"run": run_id})
        gauges.set({"updates_per_s": 812.0, "episode_reward": 103.2})   # -> ray_orrery_learner_updates_per_s{run=...}

    Gauges are made on first sight of a key (names sanitised to ``[a-zA-Z0-9_]``); non-numbers are skipped. Ray's
    metrics agent forgets a gauge that is not set again within two export intervals, so the last values are
    re-set by a daemon thread until the process ends (``keep_alive=False``: only when ``set`` is called). Outside
    Ray (``ray.is_initialized()`` false) ``set`` does nothing, so learners can call it unconditionally.
    """

    def __init__(self, prefix: str, tags: Mapping[str, str] | None = None, description: str = "",
                 keep_alive: bool = True) -> None:
        self.prefix = _metric_name(prefix)
        self.tags = {k: str(v) for k, v in (tags or {}).items()}
        self.description = description
        self.keep_alive = keep_alive
        self.gauges: dict[str, Any] = {}
        self.last: dict[str, float] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def set(self, metrics: Mapping[str, Any]) -> None:
        import ray
        if not ray.is_initialized():
            return
        from ray.util.metrics import Gauge
        with self._lock:
            for key, value in metrics.items():
                if isinstance(value, bool) or not (isinstance(value, (int, float)) or hasattr(value, "item")):
                    continue
                value = float(value)
                if not math.isfinite(value):
                    continue
                name = f"{self.prefix}_{_metric_name(key)}"
                if name not in self.gauges:
                    self.gauges[name] = Gauge(name, self.description or key, tag_keys=tuple(self.tags))
                self.gauges[name].set(value, tags=self.tags)
                self.last[name] = value
        if self.keep_alive and self._thread is None:
            period = max(0.5, ray._config.metrics_report_interval_ms() / 2000)
            self._thread = threading.Thread(target=self._refresh, args=(period,), daemon=True,
                                            name=f"{self.prefix}-gauges")
            self._thread.start()

    def _refresh(self, period: float) -> None:
        while True:
            time.sleep(period)
            with self._lock:
                for name, value in self.last.items():
                    self.gauges[name].set(value, tags=self.tags)


def _metric_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in name).strip("_")
    return cleaned if cleaned and not cleaned[0].isdigit() else f"m_{cleaned}"
