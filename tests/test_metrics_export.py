"""Ray metrics read the way Prometheus reads them, on a `ray start` head: targets from the head's service discovery
file, Prometheus text from each node's metrics export endpoint, nothing from internal state. The pool's counters
(a batched call counts each request) and a learner's gauges; a real lift_pretrain run exports
``ray_orrery_learner_*`` gauges tagged by run, experiment and method while it runs (and Prometheus, where installed,
returns them), every gauge the Grafana dashboard charts exists, and the run's log carries each progress line once,
with no negative ETA."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.deploy.local import LocalNode
from cluster.metrics import Progress

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "cluster" / "deploy" / "grafana-orrery.json"

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


def readme_metric_names(prefix: str) -> set[str]:
    """Every full metric name starting with ``prefix`` that the README names (it spells each one out)."""
    return set(re.findall(rf"\b{prefix}[a-z0-9_]*[a-z0-9]", (ROOT / "README.md").read_text()))


def test_readme_names_metrics_as_prometheus_shows_them():
    text = (ROOT / "README.md").read_text()
    assert not re.search(r"(?<!ray_)\borrery_(pool|learner)_", text), "Prometheus names carry Ray's ray_ prefix"
    named = readme_metric_names("ray_orrery_pool_")
    assert {"ray_orrery_pool_retries_total", "ray_orrery_pool_restarts_total"} <= named, named


def dashboard_learner_metrics(experiment: str) -> set[str]:
    """The learner gauges the Grafana dashboard charts for ``experiment`` (by name or by a pattern matching it)."""
    import json
    found = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            for metric, selector in re.findall(r"ray_orrery_learner_(\w+)\{([^}]*)\}", target["expr"]):
                m = re.search(r'experiment(=~?)"([^"]+)"', selector)
                if m and (m.group(2) == experiment if m.group(1) == "=" else re.fullmatch(m.group(2), experiment)):
                    found.add(metric)
    return found


def test_dashboard_has_a_row_per_method_and_the_pool():
    import json
    dash = json.loads(DASHBOARD.read_text())
    rows = [p["title"].split(" ")[0] for p in dash["panels"] if p["type"] == "row"]
    assert rows == ["Pool", "LIFT", "VIDD", "AttnRL"]
    for experiment in ("lift_pretrain", "lift_finetune", "vidd_molecule", "vidd_dna", "attnrl"):
        assert dashboard_learner_metrics(experiment), experiment


@pytest.fixture(scope="module")
def metrics_head(local_nodes):
    """One `ray start` head for this module's runs, exporting metrics every second (Ray's default is every 10 s)."""
    return local_nodes.head(num_cpus=2, env={"RAY_metrics_report_interval_ms": "1000"})


@pytest.fixture
def prometheus(metrics_head):
    """Prometheus scraping the head's nodes every second (cluster/deploy/prometheus.py), or None without the binary
    (Debian: apt-get install prometheus): then the endpoint is read directly, as Prometheus would."""
    from cluster.deploy.local import free_port
    from cluster.deploy.prometheus import prometheus_binary, start_prometheus
    if prometheus_binary() is None:
        yield None
        return
    port = free_port()
    proc = start_prometheus(metrics_head, port, scrape_interval_s=1.0)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_progress_line_past_the_budget_has_no_negative_eta():
    line = Progress("x", 3000, "env steps").line(3008, 100.0)
    assert "ETA 0:00" in line and "-" not in line.split("ETA", 1)[1].split("|")[0]
    assert line.endswith("ETA 0:00"), "no dangling separator without extra fields"
    assert Progress("x", 10, "n").line(5, 1.0, loss=0.5).endswith("ETA 0:05 | loss=0.5")


@pytest.mark.slow
@pytest.mark.nodes
def test_a_running_learner_exports_its_progress_and_logs_each_line_once(metrics_head, prometheus, tmp_path):
    from cluster.deploy.prometheus import query
    head = metrics_head
    run_name = f"gauges-{int(time.time())}"
    # 2000 is not a whole number of 64-step rounds: the last round overshoots the budget (the negative-ETA case).
    # Updates start at 1024 env steps (the pendulum preset's min_replay_size), so the loss gauges are set for the
    # last 16 rounds; 3000 steps (31 rounds of updates) checked nothing more and cost ~2x the learner's CPU.
    cmd = [sys.executable, "-m", "experiments.run", "experiment=lift_pretrain", "env=pendulum", "cluster=remote",
           f"cluster.address={head.gcs_address}", f"output_dir={tmp_path}", f"run_name={run_name}",
           "experiment.total_env_steps=2000", "experiment.eval_every_steps=1000", "experiment.eval_episodes=2"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=head.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    seen: dict[str, float] = {}
    in_prometheus: list = []  # the learner's env_steps as Prometheus's HTTP API returns it
    charted = dashboard_learner_metrics("lift_pretrain")  # what the dashboard shows of this run must exist
    assert {"env_steps", "eval_return", "updates_per_s"} <= charted, charted
    try:
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            samples = _scrape(head)
            for metric in ("env_steps", "updates", *charted):
                value = _value(samples, f"ray_orrery_learner_{metric}", experiment="lift_pretrain", method="lift")
                if value is not None:
                    seen[metric] = max(seen.get(metric, 0.0), value)
            if prometheus is not None and not in_prometheus:
                in_prometheus = [v for labels, v in query(prometheus, 'ray_orrery_learner_env_steps{experiment='
                                                          '"lift_pretrain",method="lift"}') if v > 0]
            if seen.get("env_steps", 0) > 0 and charted <= set(seen) and (prometheus is None or in_prometheus):
                break
            time.sleep(1)
        assert proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0, "".join(lines)[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(timeout=30)
    log = "".join(lines)
    assert seen.get("env_steps", 0) > 0 and charted <= set(seen), (charted - set(seen), seen, log[-3000:])
    assert prometheus is None or in_prometheus, "Prometheus never returned the learner's env_steps"
    progress = [re.sub(r"^.*?(\[lift_pretrain rank0\])", r"\1", ln.strip()) for ln in lines
                if "[lift_pretrain rank0]" in ln]
    assert progress, log[-3000:]
    assert len(progress) == len(set(progress)), f"a progress line appears twice: {progress}"
    assert not any("ETA -" in p for p in progress), progress
    last = re.match(r"\[lift_pretrain rank0\] (\d+)/2000 ", progress[-1])
    assert last and 1500 <= int(last.group(1)) <= 2000, progress  # the last round's line; no round crosses the cap


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
            ("ray_orrery_pool_retries_total", "pool"): 0.0,   # counters exist at 0 before anything is retried
            ("ray_orrery_pool_restarts_total", "pool"): 0.0,
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
        exported = {n for (n, lab), v in samples.items() if name in dict(lab).values()}
        exported |= {n.removesuffix("_count") for n in exported}  # a histogram is named without its suffixes
        missing = readme_metric_names("ray_orrery_pool_") - exported
        assert not missing, f"README names pool metrics Ray does not export: {missing}; exported: {sorted(exported)}"
    finally:
        driver.stdin.close()
        driver.wait(timeout=60)
