"""``python -m experiments.pool_up``: create the shared pool when the cluster starts, before any user job.

The pool (manager + workers, all detached, in the ``orrery`` namespace) is credited to whoever creates it. Created by
the first job that attaches, it shows in ``ray list actors`` under that job, and its manager runs in a worker process
of that job (its runtime env, its logs). Created here, by a process that does nothing else with it (it registers the
method samplers, publishes nothing, sends no requests) and exits, nothing the pool holds belongs to a user job. Jobs
then attach to it by name (``SharedPool.attach`` finds it; a config that differs is logged and the running pool used).

Usage (the cluster's start runs it once; running it again is a no-op that prints the same line)::

    .venv/bin/python -m experiments.pool_up --address HOST:PORT [scale=rehearsal] [pool.num_workers=4 ...]
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

log = logging.getLogger(__name__)


def pool_config(overrides: list[str]) -> dict[str, Any]:
    """The ``pool`` section of the composed config (``configs/config.yaml`` and the scale file), validated."""
    from cluster.pool_config import PoolConfig
    from experiments.config import compose
    from dataclasses import asdict
    return asdict(PoolConfig(**compose(overrides)["pool"]))


def pool_up(cfg: dict[str, Any]) -> dict[str, Any]:
    """Create the named pool (if it is not up yet), register every method's samplers and wait until its workers
    answer; returns the manager's stats. Needs a connected Ray (``ray.init``)."""
    from experiments.registry import attach_pool
    pool = attach_pool(cfg)
    return pool.stats()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.pool_up", description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default="auto", help="the cluster's GCS address (default: the running one)")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. scale=rehearsal pool.num_workers=4")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import ray
    from cluster.connect import NAMESPACE, REPO_ROOT
    cfg = pool_config(args.overrides)
    # the pool's processes import orrery's packages from the repo (as an embedded cluster's do: cluster.connect)
    ray.init(address=args.address, namespace=NAMESPACE, logging_level=logging.WARNING, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO_ROOT)}})
    try:
        stats = pool_up(cfg)
    finally:
        ray.shutdown()
    groups = ", ".join(f"{name}: {len(g['alive'])} workers" for name, g in stats["groups"].items())
    print(f"pool {stats['name']!r} up ({groups}; samplers: {', '.join(sorted(stats['samplers']))}); jobs attach "
          f"to it by name (pool.name={stats['name']})")


if __name__ == "__main__":
    main()
