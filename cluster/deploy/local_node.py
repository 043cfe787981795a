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
    node.stop(); head.stop()"""
from __future__ import annotations

import json
import logging
import os
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
