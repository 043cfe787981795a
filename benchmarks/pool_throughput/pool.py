"""The pool's rows: a fresh Ray, a warm pool of N workers, env steps/s and CPU per request through it, and the
manager's routing rate (no-op requests from one or more driver processes)."""
from __future__ import annotations

import math
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.pool_throughput.common import CpuClock, Measurement, ROOT, TASK, _cpu_seconds_of


# -- the pool ------------------------------------------------------------------------------------------------------
def start_ray(num_cpus: int) -> Path:
    import ray
    temp = Path("/tmp") / f"orrery-bench-{uuid.uuid4().hex[:6]}"  # short: Ray's socket paths must fit 107 chars
    try:
        from cluster.deploy.local import free_port
        # with the dashboard, as orrery's own clusters run (cluster.connect): its processes are charged to the pool rows
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=True, dashboard_port=free_port(),
                 object_store_memory=512 * 1024 ** 2,
                 _temp_dir=str(temp), namespace="orrery", log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": os.environ["RAY_AUTH_MODE"],
                                           "OMP_NUM_THREADS": "1"}})
    except Exception:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return temp


def sampler_config(num_envs: int, physics_state: bool) -> dict:
    return {"task": TASK, "num_envs": num_envs, "physics_state": physics_state}


def warm_pool(pool: Any, num_workers: int, num_envs: int, physics_state: bool, seed: int) -> None:
    """Build each worker's envs for this config (differently seeded) outside the timed part."""
    pool.map("env", [{"reset_seed": seed + w, "steps": 2} for w in range(num_workers)],
             config=sampler_config(num_envs, physics_state), affinity=list(range(num_workers)))


def measure_pool(pool: Any, worker_pids: list[int], manager: int, workers: int, num_envs: int,
                 steps_per_request: int, num_requests: int, physics_state: bool) -> Measurement:
    """One map of ``num_requests`` (rounded up to whole rounds of ``workers``: no lone tail request).
    ``workers`` == 1 pins every request to worker 0; otherwise the pool balances the load itself. Also the manager's
    CPU per request and the size of a result (what a manager that relays results has to deserialise and re-send)."""
    import pickle
    n = math.ceil(num_requests / workers) * workers
    requests = [{"steps": steps_per_request}] * n
    affinity = [0] * n if workers == 1 else None
    samples, lengths, result_bytes = 0, [], 0
    calls = pool.stats()["calls"]
    worker_cpu = _cpu_seconds_of(worker_pids[:workers])
    manager_cpu = _cpu_seconds_of([manager])
    start, cpu = time.perf_counter(), CpuClock()  # driver + Ray's processes + manager + workers (idle ones too)
    for i, result in pool.imap("env", requests, config=sampler_config(num_envs, physics_state), affinity=affinity):
        samples += result["num_samples"]
        lengths.extend(result["episode_lengths"].tolist())
        if i == 0:
            result_bytes = len(pickle.dumps(result, protocol=5))
    wall, cpu_s = time.perf_counter() - start, cpu.seconds()
    worker_cpu = _cpu_seconds_of(worker_pids[:workers]) - worker_cpu
    manager_cpu = _cpu_seconds_of([manager]) - manager_cpu
    calls = pool.stats()["calls"] - calls
    return Measurement(samples / wall, samples / cpu_s, float(np.mean(lengths)) if lengths else float("nan"),
                       samples / worker_cpu, 1000 * manager_cpu / n, 1000 * (cpu_s - worker_cpu - manager_cpu) / n,
                       n / calls, result_bytes / 1e6)


_ROUTING_DRIVER = """
import json, os, sys, time, ray
ray.init(address=sys.argv[1], namespace="orrery", log_to_driver=False)
from experiments.registry import attach_pool
pool = attach_pool({"name": sys.argv[2]})
n, go = int(sys.argv[3]), sys.argv[4]
pool.map("echo", [{}] * 8)  # connected and warm
open(go + ".ready." + str(os.getpid()), "w").close()
while not os.path.exists(go):
    time.sleep(0.005)
start = time.time()
pool.map("echo", [{}] * n)
print(json.dumps({"start": start, "end": time.time()}))
"""


def measure_routing(pool: Any, drivers: int, requests: int) -> float:
    """Requests per second the manager schedules with no-op samplers (echo, no sleep): ``drivers`` separate driver
    processes each map ``requests // drivers`` requests at once; the rate is all requests over first start to last
    end. Bounds how many samplers (and how small their requests) one manager can keep busy."""
    import json
    import subprocess
    import ray
    address = ray.get_runtime_context().gcs_address
    go = Path("/tmp") / f"orrery-routing-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", _ROUTING_DRIVER, address, pool.name, str(requests // drivers),
                               str(go)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for _ in range(drivers)]
    deadline = time.monotonic() + 300
    while len(list(go.parent.glob(go.name + ".ready.*"))) < drivers:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError("routing drivers did not start: " + "".join(p.stderr.read() for p in procs
                                                                             if p.poll() is not None))
        time.sleep(0.05)
    go.touch()
    spans = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
    for f in go.parent.glob(go.name + "*"):
        f.unlink()
    return (requests // drivers) * drivers / (max(s["end"] for s in spans) - min(s["start"] for s in spans))


def ray_idle_cores(seconds: float = 3.0) -> float:
    """Cores that this driver and Ray's processes use while the pool is idle (charged to every pool row)."""
    cpu = CpuClock()
    time.sleep(seconds)
    return cpu.seconds() / seconds
