"""Real Ray nodes on one machine, as separate ``ray start --block`` processes (a head, more worker nodes).

What tests and laptop rehearsals of a multi-node setup need, without touching any other Ray on the machine:

* every node gets its own ``--temp-dir`` and its own free ports (GCS, dashboard, agents, metrics export, workers),
  so it coexists with an embedded ``ray.init()`` cluster and other heads;
* ``RAY_AUTH_MODE`` / the token and ``HOME`` are passed explicitly in the node's environment, so nothing is read
  from or written to ``~/.ray`` (P1 of the Ray card);
* a node is stopped by signalling *its own* process group and then any process that still names its temp dir on
  its command line. Never by ``ray stop``, which kills every Ray process on the machine.

    head = LocalNode.head(tmp / "h", num_cpus=2, token=token)      # ray start --head --block ...
    node = LocalNode.worker(head, tmp / "w", num_cpus=1, resources={"side": 1})
    ...  # drivers: ray.init(address=head.gcs_address); jobs: head.dashboard_url
    node.stop(); head.stop()
"""
from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

log = logging.getLogger(__name__)

_NODE_PORTS = ("node_manager", "object_manager", "dashboard_agent_listen", "dashboard_agent_grpc", "runtime_env_agent",
               "metrics_export")
_HEAD_PORTS = ("gcs", "dashboard", "ray_client_server")


_handed_out: set[int] = set()  # ports this process gave away: a node may not have bound them yet


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports nobody listens on right now, none handed out before by this process.

    All sockets stay bound until every port is picked: ports picked one at a time can repeat (the OS may hand the
    same ephemeral port out again once its socket is closed), and a node started with two equal ports fails."""
    held: list[socket.socket] = []
    try:
        ports: list[int] = []
        while len(ports) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(s)
            s.bind(("", 0))
            port = s.getsockname()[1]
            if port not in _handed_out:
                ports.append(port)
        _handed_out.update(ports)
        return ports
    finally:
        for s in held:
            s.close()


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    return free_ports(1)[0]


# Ray gives a starting raylet a fixed 30 s to register with the GCS; a busy 2-core machine sometimes misses it
# ("The current node timed out during startup"). That is load, not a fault: start the node again.
_STARTUP_TIMEOUT = "timed out during startup"
T = TypeVar("T")
STARTUP_ATTEMPTS = 3


def retry_startup(start: Callable[[], T], cleanup: Callable[[], None] | None = None) -> T:
    """``start()``, again (after ``cleanup()``) while it fails only by missing Ray's registration window; any other
    error, or the last attempt's, is raised at once. Ray raises that one as a bare Exception from ``ray.init``."""
    for attempt in range(1, STARTUP_ATTEMPTS):
        try:
            return start()
        except Exception as e:  # noqa: BLE001 - told apart by its message below
            if _STARTUP_TIMEOUT not in str(e):
                raise
            log.warning("ray start: the node timed out during startup (attempt %d of %d); starting it again",
                        attempt, STARTUP_ATTEMPTS)
            if cleanup is not None:
                cleanup()
    return start()


def ray_executable() -> str:
    """The ``ray`` CLI of *this* interpreter's environment: nodes run the same Python as the caller."""
    return str(Path(sys.executable).with_name("ray"))


def node_env(token: str | None, home: str | Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a Ray CLI/node/driver: explicit auth mode, a private HOME, no usage stats, 1 thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # No drain wait on SIGTERM: a stopped node should leave now (the default waits up to 30 s for idle workers).
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", OMP_NUM_THREADS="1",
               RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
    if token is None:
        env["RAY_AUTH_MODE"] = "disabled"
    else:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    env.update(extra or {})
    return env


@dataclass
class LocalNode:
    """One ``ray start --block`` process (its own session/process group) and what it listens on."""

    proc: subprocess.Popen
    temp_dir: Path
    ports: dict[str, int]
    env: dict[str, str]
    head_address: str  # GCS address host:port of the cluster this node belongs to
    log_path: Path
    extra_env: dict[str, str] = field(default_factory=dict)  # extra variables, passed on to nodes that join
    stopped: bool = False

    # -- start -----------------------------------------------------------------------------------------------------
    @classmethod
    def head(cls, temp_dir: str | Path, *, num_cpus: int = 2, num_gpus: int | None = None,
             resources: dict[str, float] | None = None, token: str | None = None,
             object_store_mb: int = 256, env: dict[str, str] | None = None, timeout_s: float = 120.0,
             dashboard_port: int | None = None) -> "LocalNode":
        """Start a head node with a dashboard on 127.0.0.1 (``dashboard_port``, else a free port) and wait until its
        dashboard answers."""
        def start() -> "LocalNode":
            names = _HEAD_PORTS + _NODE_PORTS + ("dashboard_metrics", "autoscaler_metrics")
            ports = dict(zip(names, free_ports(len(names))))
            if dashboard_port is not None:
                ports["dashboard"] = dashboard_port
            # The head's own metrics servers have fixed default ports (44227, 44217): give them free ones too.
            # RAY_API_SERVER_ADDRESS: Ray's own state-API clients inside the cluster (Ray Train's
            # PlacementGroupCleaner) otherwise look for "the" local Ray and fail with `Found multiple active Ray
            # instances` when another cluster runs on the machine. Nodes that join inherit it (extra_env).
            node_env_extra = {"DASHBOARD_METRIC_PORT": str(ports["dashboard_metrics"]),
                              "AUTOSCALER_METRIC_PORT": str(ports["autoscaler_metrics"]),
                              "RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{ports['dashboard']}", **(env or {})}
            args = ["--head", f"--port={ports['gcs']}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                    f"--dashboard-port={ports['dashboard']}", f"--ray-client-server-port={ports['ray_client_server']}"]
            node = cls._start(temp_dir, args, ports, f"127.0.0.1:{ports['gcs']}", num_cpus, num_gpus, resources,
                              token, object_store_mb, node_env_extra)
            node._wait(lambda: node._dashboard_up() and node.alive_nodes() >= 1, timeout_s, "dashboard")
            return node

        node = retry_startup(start)
        recorded = node.temp_dir / "ray_current_cluster"  # the GCS address as Ray resolved it (the node's IP)
        if recorded.exists():
            node.head_address = recorded.read_text().strip() or node.head_address
        return node

    @classmethod
    def worker(cls, head: "LocalNode", temp_dir: str | Path, *, num_cpus: int = 1, num_gpus: int | None = None,
               resources: dict[str, float] | None = None, object_store_mb: int = 256,
               timeout_s: float = 120.0) -> "LocalNode":
        """Join ``head`` as another node (its own temp dir and ports); returns once the cluster lists it."""
        token = head.env.get("RAY_AUTH_TOKEN")

        def start() -> "LocalNode":
            ports = dict(zip(_NODE_PORTS, free_ports(len(_NODE_PORTS))))
            before = head.alive_nodes()
            node = cls._start(temp_dir, [f"--address={head.head_address}"], ports, head.head_address, num_cpus,
                              num_gpus, resources, token, object_store_mb, head.extra_env)
            node._wait(lambda: head.alive_nodes() > before, timeout_s, "node registration")
            return node

        return retry_startup(start)

    @classmethod
    def _start(cls, temp_dir: str | Path, args: list[str], ports: dict[str, int], head_address: str,
               num_cpus: int, num_gpus: int | None, resources: dict[str, float] | None, token: str | None,
               object_store_mb: int, extra_env: dict[str, str] | None) -> "LocalNode":
        temp_dir = Path(temp_dir).resolve()
        if len(str(temp_dir)) > 40:
            # Ray's unix socket paths (<temp>/session_<date>_<pid>/sockets/plasma_store) must fit in 107 bytes.
            raise ValueError(f"temp_dir {temp_dir} is too long for Ray's socket paths; use a short /tmp/... path")
        temp_dir.mkdir(parents=True, exist_ok=True)
        home = temp_dir / "home"
        home.mkdir(exist_ok=True)
        env = node_env(token, home, extra_env)
        cmd = [ray_executable(), "start", "--block", *args,
               f"--temp-dir={temp_dir}", f"--num-cpus={num_cpus}", "--disable-usage-stats",
               f"--object-store-memory={object_store_mb * 1024 * 1024}",
               f"--node-manager-port={ports['node_manager']}", f"--object-manager-port={ports['object_manager']}",
               f"--dashboard-agent-listen-port={ports['dashboard_agent_listen']}",
               f"--dashboard-agent-grpc-port={ports['dashboard_agent_grpc']}",
               f"--runtime-env-agent-port={ports['runtime_env_agent']}",
               f"--metrics-export-port={ports['metrics_export']}",
               "--min-worker-port=0", "--max-worker-port=0"]  # 0: the OS picks worker ports, no clashes
        if num_gpus is not None:
            cmd.append(f"--num-gpus={num_gpus}")
        if resources:
            cmd.append(f"--resources={json.dumps(resources)}")
        log_path = temp_dir / "ray-start.log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)  # own process group: stop() signals only this node
        return cls(proc, temp_dir, ports, env, head_address, log_path, dict(extra_env or {}))

    # -- addresses -------------------------------------------------------------------------------------------------
    @property
    def gcs_address(self) -> str:
        return self.head_address

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['dashboard']}"

    @property
    def metrics_url(self) -> str:
        """This node's Prometheus endpoint (text exposition format)."""
        return f"http://127.0.0.1:{self.ports['metrics_export']}/metrics"

    def http(self, path: str, token: str | None = "default", timeout: float = 10.0) -> tuple[int, str]:
        """GET ``path`` on the dashboard; ``token="default"`` sends this cluster's token, ``None`` sends none."""
        if token == "default":
            token = self.env.get("RAY_AUTH_TOKEN")
        req = urllib.request.Request(self.dashboard_url + path)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(errors="replace")

    def alive_nodes(self) -> int:
        """How many nodes the cluster's state API reports ALIVE (0 while the dashboard is not answering)."""
        try:
            status, body = self.http("/api/v0/nodes?limit=1000", timeout=5)
        except (OSError, urllib.error.URLError):
            return 0
        if status != 200:
            return 0
        nodes = json.loads(body)["data"]["result"]["result"]
        return sum(1 for n in nodes if n.get("state") == "ALIVE")

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def _dashboard_up(self) -> bool:
        try:
            return self.http("/api/version", timeout=2)[0] == 200
        except (OSError, urllib.error.URLError):
            return False

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"ray start exited with {self.proc.returncode} before {what}; log:\n"
                                   f"{self.log_tail()}")
            if ready():
                return
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"no {what} after {timeout_s:.0f} s; log:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, graceful: bool = True, timeout_s: float = 15.0) -> None:
        """Stop this node only: SIGTERM (graceful: the raylet deregisters) or SIGKILL (the node just vanishes).

        Then SIGKILL what is left of its process group and whatever still names its temp dir, by pid.
        """
        if self.stopped:
            return
        self.stopped = True
        if graceful:
            # `ray start --block` handles SIGTERM: it drains the node (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S) and
            # terminates its processes, so the cluster sees the node leave at once.
            _signal(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.proc.pid, signal.SIGKILL)  # what is left of the group (everything, if not graceful)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.warning("ray start (pid %d) of node %s did not exit", self.proc.pid, self.temp_dir)
        deadline = time.monotonic() + 10
        while left := processes_using(self.temp_dir):  # workers/agents that outlived the group, by pid
            if time.monotonic() > deadline:
                log.warning("processes of node %s still alive after stop: %s", self.temp_dir, left)
                return
            for pid in left:
                _signal(pid, signal.SIGKILL)
            time.sleep(0.2)

    def __enter__(self) -> "LocalNode":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def processes_using(temp_dir: str | Path) -> list[int]:
    """Pids whose command line mentions ``temp_dir`` (Ray passes the node's temp/session dir to all its processes)."""
    needle = str(Path(temp_dir).resolve()).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


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
