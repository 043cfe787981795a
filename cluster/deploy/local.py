"""A local orrery cluster from the command line: ``python -m cluster.deploy.local`` starts a head (and worker nodes) as
real ``ray start`` processes (``cluster.deploy.local_node``), makes the pool on it and prints how to reach it."""
from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# What tests and benchmarks import from here: one node's helpers live in local_node.
from cluster.deploy.local_node import (STARTUP_ATTEMPTS, LocalNode, free_port, free_ports, node_env,  # noqa: F401
                                       processes_using, ray_executable, retry_startup)

log = logging.getLogger(__name__)


REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
_REEXEC_MARK = "ORRERY_LOCAL_REEXEC"  # set on the re-exec, so a venv without `ray` cannot loop


def ensure_ray_cli(argv: list[str]) -> None:
    """Nodes are started with the ``ray`` beside this interpreter. Started by a Python without one (``python3 -m
    cluster.deploy.local`` outside the venv), run again under the repo's ``.venv/bin/python``, saying so in one line;
    without a venv, exit with one line saying how to make one."""
    if Path(ray_executable()).exists():
        return
    if VENV_PYTHON.exists() and not os.environ.get(_REEXEC_MARK):
        print(f"no ray beside {sys.executable}; running under {VENV_PYTHON}", file=sys.stderr, flush=True)
        os.environ[_REEXEC_MARK] = "1"
        os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), "-m", "cluster.deploy.local", *argv])
    command = " ".join([".venv/bin/python -m cluster.deploy.local", *argv])
    raise SystemExit(f"no ray beside {sys.executable}: run `python3 -m experiments.venv` in {REPO_ROOT}, then "
                     f"`{command}`")


def start_pool(head: "LocalNode", token_file: Path, overrides: list[str]) -> bool:
    """Create the shared pool now, from a process that is no user job (``experiments.pool_up``), so that nothing it
    holds is credited to the first job. A subprocess: ``cluster/`` does not import ``experiments``. On failure the
    cluster stays up and the first job creates the pool, as before; one line says so."""
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}
    done = subprocess.run([sys.executable, "-m", "experiments.pool_up", "--address", head.gcs_address, *overrides],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    lines = (done.stdout.strip() or done.stderr.strip() or "(no output)").splitlines()
    if done.returncode == 0:
        print(lines[-1], flush=True)
        return True
    print(f"the shared pool was not created at start (exit {done.returncode}: {lines[-1]}); the first job creates it",
          file=sys.stderr, flush=True)
    return False


# Ray 2.60 warns on every submit that `.git` and `.venv` "are now ignored by default", even when the job's runtime env
# (configs/runtime_env.yaml) excludes them itself. Emptying Ray's default list, as its warning suggests, leaves that
# file's excludes (a superset of the defaults) the only ones, and the submit quiet.
QUIET_SUBMIT_ENV = {"RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES": ""}


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # `kill <pid>` stops the cluster as Ctrl-C does


def start_lines(head: "LocalNode", token_file: Path, run_dir: Path, prometheus_url: str | None, head_cpus: int,
                workers: int, cpus: int, gpus: int) -> list[str]:
    """What the start prints: one labelled line per thing an operator needs, each command ready to paste."""
    ray_cli = ".venv/bin/ray"
    auth = f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={token_file}"
    submit = auth + "".join(f" {k}={shlex.quote(v)}" for k, v in QUIET_SUBMIT_ENV.items())  # for `ray job submit`
    scale = " scale=rehearsal" if workers and gpus else ""
    nodes = f" + {workers} worker nodes ({cpus} CPUs, {gpus} logical GPUs each)" if workers else ""
    lines = [f"cluster up: 1 head ({head_cpus} CPUs){nodes}",
             f"  dashboard:  {head.dashboard_url}  (it asks for the token once)"]
    if prometheus_url:
        lines.append(f"  prometheus: {prometheus_url}/graph  (ray_orrery_learner_*, ray_orrery_pool_*)")
    lines += [
        f"  token:      {token_file}  (print it: RAY_AUTH_TOKEN_PATH={token_file} {ray_cli} get-auth-token; a bare "
        f"`ray get-auth-token` prints ~/.ray/auth_token, another cluster's)",
        f"  run dir:    {run_dir}  (node logs: {run_dir}/h/session_latest/logs)",
        f"  shell:      export {submit}",
        f"  metrics:    {head.metrics_url}  (the head's Prometheus text)",
        f"  job:        {submit} {ray_cli} job submit --address {head.dashboard_url} --working-dir . "
        f"--runtime-env configs/runtime_env.yaml -- \"$PWD/.venv/bin/python\" -m experiments.run experiment=collect"
        f"{scale} cluster=remote output_dir=$PWD/runs",
        f"  driver:     {auth} .venv/bin/python -m experiments.run experiment=lift_pretrain env=pendulum{scale} "
        f"cluster=remote cluster.address={head.gcs_address}",
        f"  stop:       Ctrl-C here, or kill {os.getpid()}",
    ]
    return lines


def main(argv: list[str] | None = None) -> None:
    """``python -m cluster.deploy.local``: a head and N worker nodes on this machine (token auth on), the worker nodes
    declaring logical GPUs; prints how to reach it and keeps it up until Ctrl-C. What ``scale=rehearsal`` runs on."""
    import argparse
    import secrets
    import tempfile
    argv = sys.argv[1:] if argv is None else argv
    ensure_ray_cli(argv)
    parser = argparse.ArgumentParser(prog="python -m cluster.deploy.local", description=main.__doc__)
    parser.add_argument("--workers", type=int, default=2, help="worker nodes besides the head")
    parser.add_argument("--head-cpus", type=int, default=None,
                        help="logical CPUs of the head (default: 1 beside worker nodes, else 2: a learner and the "
                             "pool's two workers must fit on it)")
    parser.add_argument("--cpus", type=int, default=2, help="logical CPUs per worker node")
    parser.add_argument("--gpus", type=int, default=2, help="logical GPUs per worker node (no CUDA needed)")
    parser.add_argument("--dashboard-port", type=int, default=8265, help="used if free, else a free port (printed)")
    parser.add_argument("--prometheus", action="store_true",
                        help="also start Prometheus (on PATH, e.g. apt-get install prometheus) scraping every node")
    parser.add_argument("--prometheus-port", type=int, default=9090, help="used if free, else a free port (printed)")
    args = parser.parse_args(argv)
    if args.head_cpus is None:
        args.head_cpus = 1 if args.workers else 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from cluster.deploy.prometheus import prometheus_binary, start_prometheus
    from cluster.ports import pick_port
    if args.prometheus and prometheus_binary() is None:
        raise SystemExit("--prometheus: prometheus is not on PATH (Debian/Ubuntu: apt-get install prometheus)")
    token = secrets.token_hex(32)
    temp = Path(tempfile.mkdtemp(prefix="orr-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    token_file = temp / "auth_token"
    token_file.touch(mode=0o600)
    token_file.write_text(token)
    dashboard_port = pick_port(args.dashboard_port, "dashboard", "--dashboard-port")
    prometheus_port = pick_port(args.prometheus_port, "prometheus", "--prometheus-port") if args.prometheus else None
    prometheus_url = f"http://127.0.0.1:{prometheus_port}" if prometheus_port else None
    # The head's dashboard queries Prometheus for its charts (they also need Grafana, see README section 5).
    head_env = {"RAY_PROMETHEUS_HOST": prometheus_url} if prometheus_url else None
    signal.signal(signal.SIGTERM, _raise_interrupt)
    nodes: list[LocalNode] = []
    prometheus = None
    try:
        nodes.append(LocalNode.head(temp / "h", num_cpus=args.head_cpus, token=token, env=head_env,
                                    dashboard_port=dashboard_port))
        for i in range(args.workers):
            nodes.append(LocalNode.worker(nodes[0], temp / f"w{i}", num_cpus=args.cpus, num_gpus=args.gpus))
        head = nodes[0]
        if prometheus_port:
            prometheus = start_prometheus(head, prometheus_port)
        start_pool(head, token_file, ["scale=rehearsal"] if args.workers and args.gpus else [])
        print("\n".join(start_lines(head, token_file, temp, prometheus_url, args.head_cpus, args.workers, args.cpus,
                                    args.gpus)),
              flush=True)
        while all(node.proc.poll() is None for node in nodes):
            time.sleep(1.0)
        log.error("a node exited; stopping the others (logs under %s)", temp)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second `kill` while stopping ends the process
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(timeout=30)
        for node in reversed(nodes):
            node.stop()
        print(f"cluster stopped: {len(nodes)} node(s){' and Prometheus' if prometheus else ''} down "
              f"(logs kept in {temp})", flush=True)


if __name__ == "__main__":
    main()
