"""Humanoid-v5 env steps/s through the shared pool, beside the same env stepped without Ray and bare MuJoCo.

Rows, all measured in one run and interleaved per repeat (background load then hits every row alike); the table
gives the median over repeats:

    (c) physics  bare ``mujoco.mj_step(model, data, nstep=frame_skip)`` on the Humanoid-v5 model, one process per
                 core used: the physical limit. One env step = frame_skip mj_steps (5 for Humanoid-v5). Random
                 controls and gymnasium's own episode rule (torso z outside (1, 2) or 1000 steps -> reset with
                 1e-2 noise), so it simulates the same kind of states (contacts set the cost of a step; the
                 mean episode length column checks that every row sees the same episodes).
    (a) gym      a plain single-process gymnasium loop (``env.step``/``env.reset``, random actions).
    (e) lean     the same loop over ``envs.control.tasks.make_env("humanoid")``: the lean Humanoid-v5 of
                 ``envs.control.fast_mujoco`` (same observations and rewards) in RescaleAction, the env that (d) and the
                 pool step.
    (b) async    gymnasium's AsyncVectorEnv, one env process per core, same-step autoreset.
    (d) rollout  ``envs.control.tasks.VectorRollout.collect``, as a pool sampler calls it, without Ray.
    pool         the shared pool (``experiments.registry.attach_pool``, 1 CPU per worker, so N workers = N cores);
                 "1 worker" pins every request to worker 0. Large requests (envs x steps each) amortise Ray's
                 per-request cost; small ones show it.

Env construction is excluded everywhere (every row warms up first); the pool's timed requests carry no
``reset_seed``, so the samplers keep their envs and continue running episodes, as a training loop's would.
Rows other than the pool's run in fresh Ray-free processes. Besides wall-clock rates, every row reports env steps
per CPU-second of all the processes involved (from /proc): on a machine shared with other jobs that is the
figure that compares, since wall-clock rates then mostly measure how much of a core the scheduler gave us.

    OMP_NUM_THREADS=1 python -m benchmarks.pool_throughput [--steps 20000] [--envs-per-worker 16]
        [--steps-per-request 100] [--repeats 3] [--quick] [--record benchmarks/RESULTS.md]"""
from __future__ import annotations

import argparse
import logging
import math
import os
import shutil
import statistics
import uuid
from functools import partial
from pathlib import Path
from typing import Any, Callable

from benchmarks.pool_throughput.baselines import (in_fresh_process, measure_async_vector, measure_gym_loop,
                                                  measure_physics, measure_rollout)
from benchmarks.pool_throughput.common import Measurement, RESULTS_HEADER, Row, SECTION, frame_skip, log, machine
from benchmarks.pool_throughput.pool import measure_pool, measure_routing, ray_idle_cores, start_ray, warm_pool
from benchmarks.pool_throughput.report import report


def run(args: argparse.Namespace) -> tuple[list[Row], dict[str, Any]]:
    from cluster.pool_config import PoolConfig
    from experiments.registry import attach_pool
    import ray

    cores_list = sorted(set(args.workers))
    big = (args.envs_per_worker, args.steps_per_request)
    shapes = [big] + [s for s in ((1, 1), (4, 10)) if s != big]  # (envs, steps) per request
    rows: list[Row] = []
    jobs: list[tuple[Row, Callable[[], Measurement]]] = []

    def add(row: Row, job: Callable[[], Measurement]) -> None:
        rows.append(row)
        jobs.append((row, job))

    info: dict[str, Any] = {"load_before": os.getloadavg(), "frame_skip": frame_skip(), "shapes": shapes,
                            "big": big, "cores": cores_list}
    temp = start_ray(max(cores_list))
    pool = attach_pool({"name": f"bench-pool-{uuid.uuid4().hex[:6]}", "num_workers": max(cores_list),
                        "num_cpus": 1.0})
    try:
        for n in cores_list:
            add(Row(f"c{n}", f"(c) bare mj_step x{info['frame_skip']}, {n} process(es)", n),
                partial(measure_physics, n, args.steps, args.seed))
        add(Row("a", "(a) gymnasium loop, 1 env", 1),
            partial(in_fresh_process, measure_gym_loop, args.steps, args.seed))
        add(Row("e", "(e) lean env loop (envs.control.fast_mujoco), 1 env", 1),
            partial(in_fresh_process, measure_gym_loop, args.steps, args.seed, 200, True))
        for n in cores_list:
            add(Row(f"b{n}", f"(b) AsyncVectorEnv, {n} env process(es)", n),
                partial(in_fresh_process, measure_async_vector, n, args.steps, args.seed))
        add(Row("d", "(d) VectorRollout.collect, no Ray", 1, f"{big[0]}x{big[1]}"),
            partial(in_fresh_process, measure_rollout, *big, args.steps, args.seed, args.physics_state))
        worker_pids = [w["pid"] for w in pool.stats()["workers"]]
        manager = pool.stats()["pid"]
        for envs, steps in shapes:
            warm_pool(pool, max(cores_list), envs, args.physics_state, args.seed)
            requests = math.ceil(args.steps / (envs * steps)) if (envs, steps) == big else args.small_requests
            for n in cores_list:
                add(Row(f"pool{n}-{envs}x{steps}", f"pool, {n} worker(s)", n, f"{envs}x{steps}"),
                    partial(measure_pool, pool, worker_pids, manager, n, envs, steps, requests, args.physics_state))
        idle = []
        for rep in range(args.repeats):
            idle.append(ray_idle_cores())
            for row, job in jobs:
                m = job()
                row.runs.append(m)
                log.info("repeat %d  %-40s %-6s %6.0f env steps/s, %6.0f per CPU-s (mean episode %.1f steps)",
                         rep + 1, row.label, row.request, m.steps_per_s, m.steps_per_cpu_s, m.episode_length)
        pool_stats = {k: v for k, v in pool.stats().items()
                      if k in ("requests", "calls", "samples", "retries", "restarts")}
        pool.shutdown()
        pool = None
        # the manager's routing rate, with the pool's batching of small requests (the default) and without it
        info["routing"] = {}
        for batched in (True, False):
            routing_pool = attach_pool({"name": f"bench-routing-{uuid.uuid4().hex[:6]}",
                                        "num_workers": max(cores_list), "num_cpus": 1.0,
                                        "batch_target_s": PoolConfig.batch_target_s if batched else 0.0})
            try:
                for d in args.routing_drivers:
                    rates = info["routing"][(d, batched)] = []
                    for rep in range(args.repeats):
                        rates.append(measure_routing(routing_pool, d, args.routing_requests))
                        log.info("repeat %d  routing with %d driver(s), batching %s: %.0f requests/s", rep + 1, d,
                                 "on" if batched else "off", rates[-1])
            finally:
                routing_pool.shutdown()
    finally:
        try:
            if pool is not None:
                pool.shutdown()
        finally:
            ray.shutdown()
            shutil.rmtree(temp, ignore_errors=True)
    info.update(machine(), load_after=os.getloadavg(), pool=pool_stats, ray_idle_cores=statistics.median(idle))
    return rows, info


def record(path: Path, section: str) -> None:
    """Write this benchmark's section into RESULTS.md, replacing its previous one and keeping the others."""
    from benchmarks.results_md import replace_section
    replace_section(path, SECTION, section, RESULTS_HEADER)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20_000, help="env steps per configuration and repeat")
    p.add_argument("--envs-per-worker", type=int, default=16, help="envs per pool request (and in row (d))")
    p.add_argument("--steps-per-request", type=int, default=100, help="vector steps per pool request")
    p.add_argument("--small-requests", type=int, default=400, help="requests per small-request configuration")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="pool worker counts (= cores) to test")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats; the table gives medians")
    p.add_argument("--physics-state", action="store_true", help="pool/rollout also record qpos/qvel/ctrl")
    p.add_argument("--routing-drivers", type=int, nargs="+", default=[1, 4],
                   help="driver processes for the manager's routing-rate rows (no-op requests)")
    p.add_argument("--routing-requests", type=int, default=2000, help="no-op requests per routing measurement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="smoke run: 2000 steps, 100 small requests, 1 repeat")
    p.add_argument("--record", type=Path, default=None, help="write the section into this RESULTS.md")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.repeats, args.small_requests = min(args.steps, 2000), 1, min(args.small_requests, 100)
    for key in ("steps", "envs_per_worker", "steps_per_request", "repeats", "small_requests"):
        if getattr(args, key) < 1:
            raise ValueError(f"--{key.replace('_', '-')}: must be >= 1, got {getattr(args, key)}")
    if min(args.workers) < 1:
        raise ValueError(f"--workers: must be >= 1, got {args.workers}")
    if 1 not in args.workers:
        raise ValueError("--workers: must include 1 (the per-core baseline rows are 1-core)")
    return args


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        pass
    args = parse_args(argv)
    rows, info = run(args)
    section = report(rows, info, args)
    print("\n" + section)
    if args.record:
        record(args.record, section)
        print(f"recorded in {args.record}")


if __name__ == "__main__":
    main()
