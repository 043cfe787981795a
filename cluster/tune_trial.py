"""Inside one Tune trial: report every result of the run (its driver's journal commits and its learners' checkpoints)
to Tune with a checkpoint that points at the run's state, and start a trial from such a checkpoint.

A trial's run reports from two places: the driver (``cluster.journal.Journal.commit``: Parquet parts, counters) and
Ray Train learners (each report's checkpoint: weights, optimiser, normalizer, replay). Ray Train runs in other actors,
so its reports come back through a queue (:class:`LearnerReports`, a Train callback) and the trial's own thread
reports them to Tune: one Tune result per report, and a Tune checkpoint ``{run_path, commit, learners}`` whenever the
driver commits or a learner checkpoints.

Starting from a checkpoint (:func:`start_from`): a retried trial cuts its own run directory back to the commit (its
learners resume from their own Ray Train storage); a PBT recipient copies the donor's committed Parquet parts and the
donor learners' checkpoints, from which its learners start (``cluster.train.fit`` finds them), so it continues where
the donor was: weights, optimiser state, normalizer and replay.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ray.train.v2.api.callback import UserCallback

from cluster import journal

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "commit.json"
_RELAY: Any = None  # the running trial's queue of results (a ray.util.queue.Queue), None outside a trial


def relay():
    return _RELAY


class LearnerReports(UserCallback):
    """Train callback: every report of a learner (rank 0's metrics and the merged checkpoint's path) goes to the trial."""

    def __init__(self, results: Any, learner: str) -> None:
        self.results, self.learner = results, learner

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        self.results.put({"metrics": dict(metrics[0]), "learner": self.learner,
                          "checkpoint": checkpoint.path if checkpoint is not None else None})


def report_commit(metrics: dict[str, Any], checkpoint: dict[str, Any] | None = None) -> None:
    """``ctx.tune_report`` of a run inside a trial: the driver's results join the learners' in the trial's queue."""
    _RELAY.put({"metrics": metrics, "commit": checkpoint})


def run_in_trial(fn: Callable[[], Any], *, run_path: Path) -> Any:
    """Run ``fn`` (the experiment) in a thread while this thread reports its results to Tune, in order."""
    global _RELAY
    from ray import tune
    from ray.util.queue import Empty, Queue

    _RELAY = Queue(actor_options={"num_cpus": 0})
    state: dict[str, Any] = {"run_path": str(run_path), "commit": None, "learners": {}}
    staging = run_path / ".tune-checkpoint"
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - re-raised in the trial's thread
            outcome["error"] = err

    worker = threading.Thread(target=target, name="trial-run", daemon=True)
    worker.start()
    try:
        while worker.is_alive() or not _RELAY.empty():
            try:
                item = _RELAY.get(timeout=0.2)
            except (Empty, queue.Empty):
                continue
            checkpointed = False
            if item.get("learner") is not None and item.get("checkpoint"):
                state["learners"][item["learner"]] = str(_pin(Path(item["checkpoint"]), run_path, item["learner"]))
                checkpointed = True
            elif item.get("commit") is not None:
                state["commit"] = item["commit"]
                checkpointed = True
            metrics = {k: v for k, v in item["metrics"].items() if isinstance(v, (int, float))}
            if checkpointed:
                staging.mkdir(parents=True, exist_ok=True)
                (staging / CHECKPOINT_FILE).write_text(json.dumps(state, default=float))
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(str(staging)))
            else:
                tune.report(metrics)
    finally:
        worker.join()
        _RELAY.shutdown()
        _RELAY = None
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


PINS_KEPT = 10


def _pin(checkpoint: Path, run_path: Path, learner: str) -> Path:
    """Hard-link a learner checkpoint into the trial's pins: Ray Train rotates its checkpoints out (num_to_keep), but
    a Tune checkpoint may still point at this one when PBT clones it. Links cost no space or time (a copy only across
    filesystems); the oldest pins go once ``PINS_KEPT`` newer ones exist."""
    pins = run_path / "checkpoints" / f"{learner}.pins"
    pins.mkdir(parents=True, exist_ok=True)
    existing = sorted(p for p in pins.iterdir() if p.name.isdigit())
    target = pins / f"{int(existing[-1].name) + 1 if existing else 0:06d}"
    shutil.copytree(checkpoint, target, copy_function=_link_or_copy)
    for old in existing[:max(0, len(existing) + 1 - PINS_KEPT)]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def trial_id() -> str:
    from ray import tune
    return tune.get_context().get_trial_id()


def trial_checkpoint() -> dict[str, Any] | None:
    """The state this trial restarts from (its own last checkpoint, or a PBT donor's), or None."""
    from ray import tune
    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as d:
        return json.loads((Path(d) / CHECKPOINT_FILE).read_text())


def init_checkpoint_dir(storage_path: str | Path, learner: str) -> Path:
    """Where a learner named ``learner`` finds the checkpoint it starts from when its own storage has none."""
    return Path(storage_path) / f"{learner}.init"


def start_from(record: dict[str, Any], run_path: Path, checkpoints: Path) -> int | None:
    """Prepare ``run_path`` to continue from ``record`` (see the module doc); returns the driver's committed step."""
    run_path.mkdir(parents=True, exist_ok=True)
    same_run = Path(record["run_path"]).resolve() == run_path.resolve()
    step = None
    if record.get("commit") is not None:
        commit = journal.restore(run_path, record["commit"]) if same_run else journal.clone(record["commit"], run_path)
        step = commit.step
    if not same_run:
        for learner, source in record.get("learners", {}).items():
            init = init_checkpoint_dir(checkpoints, learner)
            shutil.rmtree(checkpoints / learner, ignore_errors=True)  # the recipient's own learner state is replaced
            shutil.rmtree(init, ignore_errors=True)
            _copy_checkpoint(Path(source), init)
            log.info("learner %s starts from the donor's checkpoint %s", learner, source)
    return step


def _copy_checkpoint(source: Path, target: Path, attempts: int = 5) -> None:
    """Copy a donor's checkpoint, which the donor may be rotating out right now: retry, then fail loudly."""
    for attempt in range(attempts):
        try:
            shutil.copytree(source, target)
            return
        except (FileNotFoundError, shutil.Error) as err:
            shutil.rmtree(target, ignore_errors=True)
            if attempt == attempts - 1:
                raise RuntimeError(f"could not copy the donor's learner checkpoint {source}: {err}") from None
            time.sleep(0.5)
