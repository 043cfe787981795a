"""A learner's progress on the dashboard and in its job log: a real lift_pretrain run on a `ray start` head exports
``ray_orrery_learner_*`` gauges tagged by run, experiment and method (read from the node's metrics endpoint while the
run is going, as Prometheus would), and its log carries each progress line once, with no negative ETA."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from cluster.metrics import Progress
from tests.test_metrics_export import _scrape, _value

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "cluster" / "deploy" / "grafana-orrery.json"


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


@pytest.fixture
def metrics_head():
    """A `ray start` head of its own, exporting metrics every second (Ray's default is every 10 s)."""
    from cluster.deploy.local import LocalNode
    temp = Path(tempfile.mkdtemp(prefix="orr-lm-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    head = None
    try:
        head = LocalNode.head(temp, num_cpus=2, env={"RAY_metrics_report_interval_ms": "1000"})
        yield head
    finally:
        if head is not None:
            head.stop()
        shutil.rmtree(temp, ignore_errors=True)


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


@pytest.mark.slow
@pytest.mark.nodes
def test_a_running_learner_exports_its_progress_and_logs_each_line_once(metrics_head, prometheus, tmp_path):
    from cluster.deploy.prometheus import query
    head = metrics_head
    run_name = f"gauges-{int(time.time())}"
    # 3000 is not a whole number of 64-step rounds: the last round overshoots the budget (the negative-ETA case)
    cmd = [sys.executable, "-m", "experiments.run", "experiment=lift_pretrain", "env=pendulum", "cluster=remote",
           f"cluster.address={head.gcs_address}", f"output_dir={tmp_path}", f"run_name={run_name}",
           "experiment.total_env_steps=3000", "experiment.eval_every_steps=1000", "experiment.eval_episodes=2"]
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
    assert progress[-1].startswith("[lift_pretrain rank0] 3008/3000"), progress[-1]
