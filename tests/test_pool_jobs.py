"""One pool, many jobs (issue 40): the pool is created at cluster start by ``experiments.pool_up`` (no user job owns
it), then three jobs (driver processes) use it one after another and two at once, each publishing weights and
consuming its results slower than they stream in (as a learner does between updates).

Before the fix every such job logged ``manager unavailable (ReferenceCountingAssertionError)`` and re-sent requests
(reproduced on this 2-core machine: 15-17 recoveries and 79-96 re-sent requests per job, manager alive with 0
restarts): the results ref nested in the manager's streamed item was freed by the manager before the client fetched
it (ray-project/ray#58080). Now the manager holds each result until the client acknowledges it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
import ray

from tests.helpers import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAPS, PER_MAP = 4, 8  # per job: results of ~160 KB each go through the object store (plasma), not inline

JOB = """
import json, logging, sys, time
import numpy as np, ray
logging.basicConfig(level=logging.WARNING)
ray.init(address=sys.argv[1], namespace='orrery', log_to_driver=False)
from experiments.registry import attach_pool
pool = attach_pool({'name': sys.argv[2], 'num_workers': 2, 'num_cpus': 0.25}, scope=sys.argv[3])  # as pool_up made it
key = 'policy-' + sys.argv[3]  # weights keys are cluster-wide: one per run
pool.publish(key, {'w': np.full(20000, 1.0)})
n = 0
for k in range(%(maps)d):
    got = []
    for i, r in pool.imap('echo', [{'i': i, 'pad': np.full(20000, i)} for i in range(%(per_map)d)], weights=key):
        time.sleep(0.05)  # a learner updating between results: the stream runs ahead of the consumer
        assert (r['request']['i'], r['request']['pad'][-1], r['weights_version']) == (i, i, 1), r['weights_version']
        got.append(i)
    assert sorted(got) == list(range(%(per_map)d)), got
    n += len(got)
pool.release()
print('RESULT', json.dumps({'n': n, **pool.stats()['client']}))
""" % {"maps": MAPS, "per_map": PER_MAP}


def _start_job(address: str, pool: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", JOB, address, pool, f"job-{uuid.uuid4().hex[:6]}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    for alarm in ("manager unavailable", "whose results had not arrived", "Plasma Store Usage", "already exists with"):
        assert alarm not in err, err[-3000:]
    result = json.loads(out.split("RESULT", 1)[1])
    assert result == {"n": MAPS * PER_MAP, "recoveries": 0, "resent": 0}, result
    return result


def test_jobs_one_after_another_and_at_once_share_the_pool_undisturbed(pool_name, ray_cluster):
    address = ray.get_runtime_context().gcs_address
    up = subprocess.run([sys.executable, "-m", "experiments.pool_up", "--address", address, f"pool.name={pool_name}",
                         "pool.num_workers=2", "pool.num_cpus=0.25"], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
    assert up.returncode == 0, up.stderr[-3000:]
    assert f"pool {pool_name!r} up" in up.stdout, up.stdout
    from cluster.pool import SharedPool
    pool = SharedPool.attach({"name": pool_name}, create=False)
    before = pool.stats()
    assert before["requests"] == 0 and before["restarts"] == 0

    for _ in range(3):  # one after another: each job exits before the next starts
        _finish(_start_job(address, pool_name))
    for proc in [_start_job(address, pool_name) for _ in range(2)]:  # two at once
        _finish(proc)

    after = pool.stats()
    assert after["incarnation"] == before["incarnation"] and after["pid"] == before["pid"], "the manager restarted"
    assert after["restarts"] == 0 and after["retries"] == 0, after
    assert after["requests"] == 5 * MAPS * PER_MAP, "every request ran exactly once (nothing re-sent)"
    # acknowledged by each client, or dropped when its driver exited (noticed within a second or so)
    wait_until(lambda: pool.stats()["held_results"] == 0, 30, "the manager to hold no results", every_s=0.5)
    assert after["weights_versions"] == {}, "each job released its weights"


def test_pool_up_takes_the_pool_section_of_the_composed_config():
    from experiments.pool_up import pool_config
    cfg = pool_config(["pool.name=up-test", "pool.num_workers=3"])
    assert (cfg["name"], cfg["num_workers"]) == ("up-test", 3)
    with pytest.raises(ValueError, match="num_workers"):
        pool_config(["pool.num_workers=0"])
