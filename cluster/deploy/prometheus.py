"""Prometheus for a local cluster (Debian's ``prometheus`` package, or any binary on PATH): it scrapes every node's
metrics endpoint through the service-discovery file the head keeps, so learners' ``ray_orrery_learner_*`` and the
pool's ``ray_orrery_pool_*`` gauges can be queried and charted (``cluster/deploy/grafana-orrery.json``), and the Ray
dashboard shows them when the head was started with ``RAY_PROMETHEUS_HOST`` pointing here.

    proc = start_prometheus(head, port)            # head: cluster.deploy.local.LocalNode
    query(port, 'ray_orrery_learner_env_steps')    # Prometheus's HTTP API: [(labels, value), ...]
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


def write_config(head_temp_dir: str | Path, out: Path, scrape_interval_s: float = 5.0) -> Path:
    """A config scraping every node the head lists in ``<temp_dir>/prom_metrics_service_discovery.json``."""
    sd = Path(head_temp_dir).resolve() / "prom_metrics_service_discovery.json"
    interval = f"{max(1, round(scrape_interval_s * 1000))}ms"  # Prometheus durations take no decimals ("1.0s")
    out.write_text(
        f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"
        f"scrape_configs:\n  - job_name: ray\n    file_sd_configs:\n      - files: ['{sd}']\n")
    return out


def start_prometheus(head: Any, port: int, scrape_interval_s: float = 5.0,
                     timeout_s: float = 60.0) -> subprocess.Popen:
    """Start Prometheus on 127.0.0.1:``port`` for ``head``'s cluster (data and config in the head's temp dir) and
    wait until it answers. The caller stops it (``proc.terminate()``)."""
    binary = prometheus_binary()
    if binary is None:
        raise FileNotFoundError("prometheus is not on PATH (Debian/Ubuntu: apt-get install prometheus)")
    base = Path(head.temp_dir) / "prometheus"
    base.mkdir(parents=True, exist_ok=True)
    config = write_config(head.temp_dir, base / "prometheus.yml", scrape_interval_s)
    log = open(base / "prometheus.log", "ab")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
                             f"--storage.tsdb.path={base / 'data'}"], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {proc.returncode}; log: {base / 'prometheus.log'}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise TimeoutError(f"prometheus did not answer on port {port} within {timeout_s:.0f} s")


def query(port: int, expr: str) -> list[tuple[dict[str, str], float]]:
    """An instant query through Prometheus's HTTP API: (labels, value) per series."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.loads(resp.read().decode())
    if body.get("status") != "success":
        raise RuntimeError(f"prometheus query {expr!r} failed: {body}")
    return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]
