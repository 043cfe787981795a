"""Commit points of a run, so that a killed run resumes exactly at its last commit: same step, no duplicated data.

A run appends to Parquet stores (numbered parts that are never rewritten) and counts steps. After each finished
step it commits: buffered metrics are flushed, then ``{step, parts per store, state}`` is written atomically to
``<run>/progress.json``. Resuming cuts every store back to its committed number of parts (dropping what a killed
step had half-written), drops the TensorBoard events logged after the commit (so TensorBoard shows no step twice)
and hands back the step and the small JSON ``state``.

The commit record is also what a Tune trial checkpoints (``report(metrics, checkpoint=record)``): a trial restored
by Tune is its run directory cut at that commit (:func:`restore`), and a PBT trial that exploits another one starts
from a copy of the other run's committed parts (:func:`clone`). Parts are immutable, so the first ``n`` parts of a
store are still exactly what they were when the commit was made.

    journal = Journal(ctx.run_dir.path, [store], metrics=ctx.metrics, report=ctx.tune_report)
    commit = journal.resume() if cfg["resume"] else journal.start()
    for step in range(commit.step, total):
        store.append(...)
        journal.commit(step + 1, {"loss": ...}, state={...})

A Ray Train learner keeps the commit in its checkpoint instead of ``progress.json``: each rank holds a journal over its
own stores, saves ``journal.parts()`` with its checkpoint and calls ``journal.rollback(saved_parts)`` when it resumes.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from cluster.store import ParquetStore

log = logging.getLogger(__name__)

PROGRESS_FILE = "progress.json"
# In a learner's parts: the step of the last metrics row logged before the checkpoint (TensorBoard events after it
# belong to an abandoned attempt). Not a store path, so it never names a store to cut.
TENSORBOARD_STEP = "@tensorboard_step"


@dataclass
class Commit:
    step: int = 0
    parts: dict[str, int] = field(default_factory=dict)  # store path relative to the run dir -> committed parts
    state: dict[str, Any] = field(default_factory=dict)
    run_path: str = ""
    time: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Commit":
        return cls(**{k: data[k] for k in ("step", "parts", "state", "run_path", "time") if k in data})


def read_commit(run_path: str | Path) -> Commit | None:
    path = Path(run_path) / PROGRESS_FILE
    if not path.exists():
        return None
    return Commit.from_dict(json.loads(path.read_text()))


def _write_commit(run_path: Path, commit: Commit) -> None:
    tmp = run_path / f".{PROGRESS_FILE}.tmp"
    tmp.write_text(json.dumps(commit.to_dict(), default=float))
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, run_path / PROGRESS_FILE)


def _rollback(run_path: Path, parts: dict[str, int], known: Iterable[str]) -> int:
    """Cut each store to its committed parts; stores the commit does not know were written after it: emptied."""
    removed = 0
    for rel in set(known) | set(parts):
        store_path = run_path / rel
        if store_path.exists():
            removed += ParquetStore(store_path).rollback(parts.get(rel, 0))
    return removed


class Journal:
    """Commits of one run directory over a fixed set of stores (the metrics store is added when ``metrics`` is)."""

    def __init__(self, run_path: str | Path, stores: Iterable[ParquetStore], *, metrics: Any = None,
                 report: Callable[..., None] | None = None) -> None:
        self.run_path = Path(run_path).resolve()
        self.stores = list(stores)
        self.metrics = metrics  # a cluster.metrics.MetricsLogger (buffers rows: flushed at each commit)
        if metrics is not None:
            self.stores.append(metrics.store)
        self.report = report
        self.last: Commit | None = None

    @property
    def _tensorboard(self) -> bool:
        """Whether the journal's metrics logger writes TensorBoard events (which a resume cuts back too)."""
        return getattr(self.metrics, "tb_dir", None) is not None

    def _rel(self, store: ParquetStore) -> str:
        return str(store.path.resolve().relative_to(self.run_path))

    def start(self) -> Commit:
        """A fresh run: its stores must be empty (a second run into the same directory would mix data)."""
        used = [self._rel(s) for s in self.stores if s.num_parts]
        if used:
            raise FileExistsError(f"run directory {self.run_path} already has data in {', '.join(used)}: "
                                  f"pass resume=true to continue it, or another run_name")
        self.last = Commit(run_path=str(self.run_path))
        return self.last

    def resume(self) -> Commit:
        """Cut the stores (and TensorBoard) back to the last commit and return it (step 0 if the run never
        committed)."""
        commit = read_commit(self.run_path) or Commit()
        removed = _rollback(self.run_path, commit.parts, [self._rel(s) for s in self.stores])
        if self._tensorboard:  # metrics are logged at their commit's step: later ones were not committed
            self.metrics.truncate_tensorboard(commit.step)
        commit.run_path = str(self.run_path)
        if removed:
            log.warning("resume: dropped %d Parquet part(s) written after the commit of step %d", removed,
                        commit.step)
        log.info("resuming %s at step %d", self.run_path, commit.step)
        self.last = commit
        return commit

    def commit(self, step: int, metrics: dict[str, Any] | None = None,
               state: dict[str, Any] | None = None) -> Commit:
        """Log ``metrics`` for ``step``, make everything written so far durable, report it (with the commit as a
        checkpoint inside a Tune trial)."""
        if self.metrics is not None:
            if metrics:
                self.metrics.log(step, metrics)
            self.metrics.flush()
        commit = Commit(step=int(step), parts={self._rel(s): s.num_parts for s in self.stores},
                        state=dict(state or {}), run_path=str(self.run_path), time=time.time())
        _write_commit(self.run_path, commit)
        self.last = commit
        if self.report is not None and metrics is not None:
            numbers = {k: float(v) for k, v in metrics.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
            self.report({"step": commit.step, **numbers}, checkpoint=commit.to_dict())
        return commit


    # -- learners: the commit lives in the Ray Train checkpoint, one journal per rank over that rank's stores ----------

    def parts(self) -> dict[str, int]:
        """Flush buffered metrics and return the parts of this journal's stores: saved with a learner's checkpoint,
        they are what :meth:`rollback` cuts back to when the learner resumes from that checkpoint."""
        if self.metrics is not None:
            self.metrics.flush()
        parts: dict[str, Any] = {self._rel(s): s.num_parts for s in self.stores}
        if self._tensorboard:
            last = self.metrics.last_step
            parts[TENSORBOARD_STEP] = -1.0 if last is None else float(last)  # not a store: rollback cuts TB there
        return parts

    def rollback(self, parts: dict[str, int]) -> int:
        """Cut this journal's stores back to ``parts`` (from :meth:`parts`, saved in the checkpoint being resumed):
        rows written after that checkpoint (replay, samples, metrics) are dropped, so nothing is duplicated. Stores of
        other journals (other ranks) are left alone; a store of this journal missing from ``parts`` is emptied."""
        mine = [self._rel(s) for s in self.stores]
        if self.metrics is not None:
            self.metrics.rows = []  # rows buffered before the resume belong to the abandoned attempt
            if self._tensorboard and TENSORBOARD_STEP in parts:  # (older checkpoints have none: TB left as it is)
                self.metrics.truncate_tensorboard(parts[TENSORBOARD_STEP])
        removed = _rollback(self.run_path, {k: v for k, v in parts.items() if k in mine}, mine)
        if removed:
            log.warning("resume: dropped %d Parquet part(s) written after the checkpoint", removed)
        return removed


def _stores_under(run_path: Path) -> set[str]:
    return {str(p.parent.relative_to(run_path)) for p in run_path.rglob("part-*.parquet")}


def restore(run_path: str | Path, record: dict[str, Any]) -> Commit:
    """Cut ``run_path`` back to the commit ``record`` (a checkpoint of this same run) and make it the latest."""
    run_path = Path(run_path).resolve()
    commit = Commit.from_dict(record)
    commit.run_path = str(run_path)
    _rollback(run_path, commit.parts, _stores_under(run_path))
    _write_commit(run_path, commit)
    return commit


def clone(record: dict[str, Any], run_path: str | Path) -> Commit:
    """Make ``run_path`` a copy of another run cut at its commit ``record`` (PBT: exploit a better trial)."""
    source = Path(record["run_path"]).resolve()
    run_path = Path(run_path).resolve()
    commit = Commit.from_dict(record)
    if run_path.exists():
        _rollback(run_path, {}, _stores_under(run_path))  # whatever this run had is replaced
    for rel, n in commit.parts.items():
        dst = ParquetStore(run_path / rel)
        for part in ParquetStore(source / rel).parts()[:n]:
            shutil.copy2(part, dst.path / part.name)
    commit.run_path = str(run_path)
    _write_commit(run_path, commit)
    log.info("cloned %s at step %d into %s", source, commit.step, run_path)
    return commit
