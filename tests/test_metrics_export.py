"""The pool's and a learner's Ray metrics, read the way Prometheus reads them: targets from the head's service
discovery file, Prometheus text from each node's metrics export endpoint. Nothing is read from internal state."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.deploy.local import LocalNode

ROOT = Path(__file__).resolve().parents[1]

DRIVER = """
import sys, ray
ray.init(address=sys.argv[1], namespace="orrery")
from experiments.registry import attach_pool
from cluster.metrics import RayGauges
pool = attach_pool({"name": sys.argv[2], "num_workers": 2, "num_cpus": 0.5})
pool.publish("policy", [1.0])
pool.publish("policy", [2.0])
pool.map("echo", [{"num_samples": 5, "sleep_s": 0.05}] * 6, weights="policy")
pool.map("echo", [{"num_samples": 1}] * 200)   # tiny requests: the pool batches them, each still counts as one
stats = pool.stats()
print("CALLS", stats["calls"], "REQUESTS", stats["requests"], flush=True)
RayGauges("orrery_learner", tags={"run": sys.argv[2]}).set({"updates_per_s": 123.5, "episode_reward": -7.25})
print("READY", flush=True)
sys.stdin.readline()   # keep the gauges' process alive until the test has scraped them
"""


@pytest.fixture
def metrics_head(local_nodes):
    # Export every second (Ray's default is every 10 s).
    return local_nodes.head(num_cpus=2, env={"RAY_metrics_report_interval_ms": "1000"})


def _targets(head: LocalNode) -> list[str]:
    """What Prometheus scrapes: the head writes every node's metrics address to this file (file_sd_configs)."""
    path = head.temp_dir / "prom_metrics_service_discovery.json"
    groups = json.loads(path.read_text()) if path.exists() else []
    return [t for group in groups for t in group["targets"]]


def _scrape(head: LocalNode) -> dict[tuple[str, frozenset], float]:
    """All samples of all scrape targets."""
    samples: dict[tuple[str, frozenset], float] = {}
    for target in _targets(head):
        try:
            with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            continue
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def _value(samples, name: str, **labels: str) -> float | None:
    """The sum over every series of ``name`` with these labels, as ``sum(name{labels})`` in PromQL reads it."""
    found = [v for (n, lab), v in samples.items() if n == name and all((k, v2) in lab for k, v2 in labels.items())]
    return sum(found) if found else None


def test_pool_and_learner_metrics_reach_the_prometheus_endpoint(metrics_head):
    head = metrics_head
    name = f"metrics-pool-{uuid.uuid4().hex[:6]}"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, head.gcs_address, name], cwd=ROOT, env=head.env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in driver.stdout:
            lines.append(line)
            if line.startswith("READY"):
                break
        assert lines and lines[-1].startswith("READY"), "".join(lines)[-3000:]
        calls = int(next(line for line in lines if line.startswith("CALLS")).split()[1])
        assert calls < 206, "the tiny requests were not batched, so this test does not check batch counting"
        wanted = {
            ("ray_orrery_pool_requests_total", "pool"): 206.0,
            ("ray_orrery_pool_samples_total", "pool"): 230.0,
            ("ray_orrery_pool_weights_version", "pool"): 2.0,
            ("ray_orrery_pool_request_seconds_count", "pool"): 206.0,
            ("ray_orrery_learner_updates_per_s", "run"): 123.5,
            ("ray_orrery_learner_episode_reward", "run"): -7.25,
        }
        deadline = time.monotonic() + 120  # Ray exports every second; a loaded CI machine lags
        while True:
            samples = _scrape(head)
            got = {key: _value(samples, key[0], **{key[1]: name}) for key in wanted}
            if got == wanted or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert any(t.endswith(f":{head.ports['metrics_export']}") for t in _targets(head)), "node not a target"
        mine = sorted((n, sorted(lab), v) for (n, lab), v in samples.items() if name in dict(lab).values())
        assert got == wanted, ({k: v for k, v in got.items() if v != wanted[k]}, mine)
        assert _value(samples, "ray_orrery_pool_queue_depth", pool=name) == 0.0
    finally:
        driver.stdin.close()
        driver.wait(timeout=60)
