"""The shared pool on a real local Ray cluster: exactly-once under worker death, weights by version, shared by
name across drivers, resources honoured, errors surfaced."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
import ray

from cluster.pool import SamplerError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _kill_busy_worker_soon(pool, delay_s: float, no_restart: bool) -> threading.Thread:
    def kill():
        time.sleep(delay_s)
        ray.kill(pool.workers()[0], no_restart=no_restart)
    t = threading.Thread(target=kill, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("no_restart", [False, True], ids=["restarted-by-ray", "killed-for-good"])
def test_exactly_once_when_a_worker_dies_mid_request(pool_factory, no_restart):
    pool = pool_factory(num_workers=2, num_cpus=0.5)
    requests = [{"i": i, "sleep_s": 0.4} for i in range(10)]
    killer = _kill_busy_worker_soon(pool, 0.6, no_restart)
    seen = [i for i, result in pool.imap("echo", requests)]
    killer.join()
    assert sorted(seen) == list(range(10)), "every request must come back exactly once"
    stats = pool.stats()
    assert stats["retries"] >= 1, stats
    assert stats["restarts"] >= 1, stats
    assert stats["requests"] == 10
    # the pool is whole again: both workers serve
    pids = {r["pid"] for r in pool.map("echo", [{"sleep_s": 0.2}] * 6)}
    assert len(pids) == 2


def test_results_stream_as_they_finish_and_map_keeps_order(pool_factory):
    pool = pool_factory(num_workers=2)
    requests = [{"i": 0, "sleep_s": 1.5}] + [{"i": i, "sleep_s": 0.01} for i in range(1, 6)]
    order = [i for i, _ in pool.imap("echo", requests)]
    assert order[-1] == 0, f"the slow request should finish last, got completion order {order}"
    assert [r["request"]["i"] for r in pool.map("echo", requests)] == list(range(6))


def test_weights_are_fetched_once_per_version_per_worker(pool_factory):
    pool = pool_factory(num_workers=2)
    v1 = pool.publish("policy", {"w": list(range(1000))})
    out = pool.map("echo", [{"echo_weights": True}] * 8, weights="policy")
    assert v1 == 1 and all(r["weights_version"] == 1 and r["weights"]["w"][-1] == 999 for r in out)
    fetches = [w["weight_fetches"] for w in pool.stats()["workers"]]
    assert sum(fetches) <= 2 and max(fetches) <= 1, fetches
    v2 = pool.publish("policy", {"w": [7]})
    out = pool.map("echo", [{"echo_weights": True}] * 8, weights="policy")
    assert v2 == 2 and all(r["weights_version"] == 2 and r["weights"]["w"] == [7] for r in out)
    assert sum(w["weight_fetches"] for w in pool.stats()["workers"]) <= 4
    assert pool.stats()["weights_versions"]["policy"] == 2


def test_two_drivers_share_one_named_pool(pool_factory, ray_cluster):
    pool = pool_factory(num_workers=2)
    pids_here = {r["pid"] for r in pool.map("echo", [{"sleep_s": 0.1}] * 4)}
    address = ray.get_runtime_context().gcs_address
    script = (
        "import json, ray\n"
        f"ray.init(address={address!r}, namespace='orrery')\n"
        "from experiments.registry import attach_pool\n"
        f"pool = attach_pool({{'name': {pool.name!r}}})\n"
        "out = pool.map('echo', [{'sleep_s': 0.1}] * 4)\n"
        "print('PIDS', json.dumps(sorted({r['pid'] for r in out})))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    pids_there = set(json.loads(proc.stdout.split("PIDS", 1)[1]))
    assert pids_there and pids_there <= pids_here, "the second driver must be served by the same workers"
    assert pool.stats()["requests"] == 8


def test_worker_resources_are_honoured(pool_factory):
    pool = pool_factory(num_workers=2, num_cpus=0.25, num_gpus=0.5)
    resources = [w["resources"] for w in pool.stats()["workers"]]
    assert all(r.get("CPU") == 0.25 and r.get("GPU") == 0.5 for r in resources), resources
    assert ray.available_resources().get("GPU", 0) == pytest.approx(0.0)


def test_sampler_errors_surface_and_are_not_retried(pool_factory):
    pool = pool_factory(num_workers=1)
    with pytest.raises(SamplerError, match="no_such_key"):
        pool.map("env", [{"steps": 1}], config={"no_such_key": 1})
    assert pool.stats()["retries"] == 0
    with pytest.raises(KeyError, match="unknown sampler"):
        pool.map("nope", [{}])


def _map_within(pool, requests: list[dict], timeout_s: float) -> list:
    """``pool.map`` in a thread: a hung pool fails the test instead of stalling the suite."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(pool.map("echo", requests)), daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), f"the pool did not serve {len(requests)} requests within {timeout_s} s"
    return out[0]


def test_a_failing_request_gives_back_every_slot(pool_factory):
    """One request raises while one is running and two wait for a worker: the map fails, and the next map is served
    at once by both workers (the running request's slot comes back when it ends, the waiters' right away)."""
    pool = pool_factory(num_workers=2)
    with pytest.raises(SamplerError, match="boom"):
        pool.map("echo", [{"fail": "boom"}] + [{"sleep_s": 1.5}] * 3)
    start = time.monotonic()
    out = _map_within(pool, [{"sleep_s": 1.0}] * 4, timeout_s=30)
    assert len({r["pid"] for r in out}) == 2, "both workers must serve again"
    assert time.monotonic() - start < 20
    assert pool.stats()["inflight"] == [0, 0]
