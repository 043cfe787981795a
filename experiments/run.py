"""The single entry point: ``python -m experiments.run experiment=<name> scale=smoke|paper cluster=local|remote``.

Composes and validates the config (one clear line on a mistake, before Ray starts), connects to the cluster,
attaches the shared pool, makes the run directory and hands over to the experiment's ``run(cfg, ctx)``.
"""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from experiments.config import ConfigError, load

log = logging.getLogger("orrery")


@dataclass
class RunContext:
    """What an experiment gets: its typed config sections, the run directory, the cluster and the pool."""

    cfg: dict[str, Any]
    run_dir: Any
    cluster: dict[str, Any]
    _pool: Any = field(default=None, repr=False)
    _metrics: Any = field(default=None, repr=False)
    tune_report: Any = field(default=None, repr=False)  # set by experiments.sweep inside a trial

    @property
    def typed(self) -> dict[str, Any]:
        return self.cfg["_typed"]

    @property
    def metrics(self):
        """Per-iteration metrics of this run (Parquet + TensorBoard under the run directory)."""
        if self._metrics is None:
            from cluster.metrics import MetricsLogger
            self._metrics = MetricsLogger(self.run_dir.path)
        return self._metrics

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Record driver-side metrics; inside a Tune trial they are also reported to Tune."""
        self.metrics.log(step, metrics)
        if self.tune_report is not None:
            self.tune_report({k: v for k, v in metrics.items() if isinstance(v, (int, float))})

    @property
    def run_id(self) -> str:
        """Unique id of the run on the cluster: prefix of its pool weight keys, scope of its pool entries."""
        return self.run_dir.run_id

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
        if self._pool is not None:  # the run is over: its samplers and weights leave the workers
            try:
                self._pool.release()
            except Exception as err:  # noqa: BLE001 - a pool that is gone has nothing to release
                log.warning("could not release the run's pool entries: %r", err)

    @property
    def pool(self):
        if self._pool is None:
            from experiments.registry import attach_pool
            self._pool = attach_pool(self.typed["pool"], scope=self.run_id)
        return self._pool


def setup_process(torch_threads: int = 1, level: str = "INFO") -> None:
    """Thread caps and logging for a driver (Ray only sets OMP_NUM_THREADS inside its workers)."""
    os.environ.setdefault("OMP_NUM_THREADS", str(torch_threads))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    try:
        import torch
        torch.set_num_threads(torch_threads)
    except ImportError:
        pass


def public_config(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if not k.startswith("_")}


def prepare(overrides: list[str]) -> tuple[dict[str, Any], RunContext]:
    return start(load(overrides))


def start(cfg: dict[str, Any]) -> tuple[dict[str, Any], RunContext]:
    """Claim the run directory (a used run_name is refused here, before Ray starts), connect, check the storage."""
    from cluster.connect import connect
    from cluster.rundir import RunDir

    setup_process(cfg["torch_threads"], cfg["log_level"])
    name = cfg["experiment"]["name"]
    run_dir = RunDir.create(cfg["output_dir"], name, cfg["run_name"], cfg["resume"])
    run_dir.save_config(public_config(cfg))
    info = connect(cfg["_typed"]["cluster"])
    if info.get("dashboard_url"):
        print(f"Ray dashboard: {info['dashboard_url']}", file=sys.stderr, flush=True)
    from cluster.storage import input_paths, require_same_inputs, require_shared
    require_shared(run_dir.path)  # a multi-node cluster: every node must see the run directory
    require_same_inputs(input_paths(cfg["experiment"]))  # ... and read the same model where each loads its own
    return cfg, RunContext(cfg=cfg, run_dir=run_dir, cluster=info)


def execute(cfg: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
    """The experiment's ``run(cfg, ctx)``; its summary is kept in the run directory."""
    try:
        summary = cfg["_module"].run(cfg, ctx)
    finally:
        ctx.close()
    ctx.run_dir.write_json("summary.json", summary)
    print(f"run directory: {ctx.run_dir.path}", flush=True)
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    from cluster.storage import StorageNotShared
    try:
        cfg, ctx = prepare(argv)
    except (ConfigError, FileNotFoundError, FileExistsError) as err:  # a used run_name: FileExistsError
        print(f"config error: {err}", file=sys.stderr)
        raise SystemExit(2)
    except StorageNotShared as err:
        print(f"storage error: {err}", file=sys.stderr)
        raise SystemExit(2)
    return execute(cfg, ctx)


if __name__ == "__main__":
    main()
