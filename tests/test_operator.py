"""What an operator meets on one machine (issue 40): a taken dashboard port moves to a free one with one line instead
of Ray's `Failed to bind`, `cluster.deploy.local` started by a Python without Ray re-runs under the venv, its start
prints labelled lines whose token command prints this cluster's token (not ~/.ray/auth_token), stopping prints a
line, and TensorBoard serves a learner's scalars from its `tb/` folder. Ray runs in subprocesses with a private HOME
and their own temp dirs; nothing is read from or left in ~/.ray."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import cluster.deploy.local as local
from cluster.deploy.local import node_env, processes_using
from cluster.ports import pick_port, port_is_free

ROOT = Path(__file__).resolve().parents[1]


def _occupied() -> socket.socket:
    """A listening socket on 127.0.0.1 (the caller closes it): a port another server holds."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


def _get(url: str, token: str | None = None, timeout: float = 10.0) -> tuple[int, str]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def test_a_taken_port_is_replaced_by_a_free_one_with_one_line(caplog):
    with _occupied() as held:
        taken = held.getsockname()[1]
        assert not port_is_free(taken)
        with caplog.at_level("WARNING", logger="cluster.ports"):
            port = pick_port(taken, "Ray dashboard", "cluster.dashboard_port=<port>")
        assert port != taken and port_is_free(port)
        (record,) = caplog.records
        assert record.getMessage() == (f"Ray dashboard: port {taken} is taken; using {port} instead "
                                       "(cluster.dashboard_port=<port> to choose one)")
    caplog.clear()
    assert pick_port(taken, "Ray dashboard", "x") == taken and not caplog.records  # free again: kept, no line


def test_local_cluster_outside_the_venv_runs_again_under_it(tmp_path):
    """A Python with no `ray` beside it (here: the venv's base interpreter under another name) re-execs under
    .venv/bin/python with one line; `--help` shows that it got there without starting anything."""
    if not local.VENV_PYTHON.exists():
        pytest.skip("no .venv in this checkout")
    outside = tmp_path / "bin" / "python3"
    outside.parent.mkdir()
    outside.symlink_to(getattr(sys, "_base_executable", sys.executable))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "ORRERY_LOCAL_REEXEC")}
    out = subprocess.run([str(outside), "-m", "cluster.deploy.local", "--help"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.strip() == f"no ray beside {outside}; running under {local.VENV_PYTHON}", out.stderr
    assert "--dashboard-port" in out.stdout and "--prometheus" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr


def test_local_cluster_without_a_venv_says_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python3"))
    monkeypatch.setattr(local, "VENV_PYTHON", tmp_path / "no-venv" / "python")
    with pytest.raises(SystemExit) as exit_info:
        local.ensure_ray_cli(["--prometheus"])
    message = str(exit_info.value)
    assert "\n" not in message and "python3 -m experiments.venv" in message
    assert message.endswith("`.venv/bin/python -m cluster.deploy.local --prometheus`"), message


def test_prometheus_asked_for_but_absent_is_one_line_before_anything_starts(monkeypatch):
    import cluster.deploy.prometheus as prometheus
    monkeypatch.setattr(prometheus, "prometheus_binary", lambda: None)
    monkeypatch.setattr(local.LocalNode, "head", classmethod(lambda *a, **k: pytest.fail("a node was started")))
    with pytest.raises(SystemExit) as exit_info:
        local.main(["--workers", "0", "--prometheus"])
    assert str(exit_info.value) == ("--prometheus: prometheus is not on PATH "
                                    "(Debian/Ubuntu: apt-get install prometheus)")


@pytest.fixture
def short_tmp():
    """A short /tmp dir (Ray's socket paths must fit 107 bytes), removed after the test with any process naming it."""
    path = Path(tempfile.mkdtemp(prefix="orr-", dir="/tmp"))
    yield path
    for pid in processes_using(path):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(path, ignore_errors=True)


EMBEDDED = """
import sys
from cluster.connect import connect
info = connect({"num_cpus": 1, "object_store_mb": 128, "dashboard_port": int(sys.argv[1]), "temp_dir": sys.argv[2]})
print("URL", info["dashboard_url"], flush=True)
import urllib.request
with urllib.request.urlopen(info["dashboard_url"] + "/api/version", timeout=30) as resp:
    print("VERSION", resp.status, flush=True)
"""


@pytest.mark.slow
def test_the_embedded_cluster_moves_off_a_taken_dashboard_port(short_tmp):
    home = short_tmp / "home"
    home.mkdir()
    with _occupied() as held:
        taken = held.getsockname()[1]
        out = subprocess.run([sys.executable, "-c", EMBEDDED, str(taken), str(short_tmp / "r")], cwd=ROOT,
                             env=node_env(None, home), capture_output=True, text=True, timeout=300)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    url = re.search(r"^URL (\S+)$", out.stdout, re.M).group(1)
    assert not url.endswith(f":{taken}") and "VERSION 200" in out.stdout, log[-3000:]
    moved = [ln for ln in log.splitlines() if f"port {taken} is taken" in ln]
    assert len(moved) == 1 and f"using {url.rsplit(':', 1)[1]} instead" in moved[0], log[-3000:]
    assert "Failed to bind" not in log


@pytest.mark.slow
def test_local_cluster_prints_labelled_lines_a_token_that_works_and_a_stop_line(short_tmp):
    from cluster.deploy.prometheus import prometheus_binary
    with_prometheus = prometheus_binary() is not None  # without the binary the Prometheus part is not tested
    home = short_tmp / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("another-clusters-token")  # what a bare `ray get-auth-token` prints
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), TMPDIR=str(short_tmp))  # the cluster's run dir lands under short_tmp
    held = [_occupied(), _occupied()]
    taken = [s.getsockname()[1] for s in held]
    cmd = [sys.executable, "-m", "cluster.deploy.local", "--workers", "0", "--head-cpus", "1",
           "--dashboard-port", str(taken[0])]
    if with_prometheus:
        cmd += ["--prometheus", "--prometheus-port", str(taken[1])]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    up = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.lstrip().startswith("stop:"):
                up.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert up.wait(300), "\n".join(lines)[-4000:]
        for s in held:
            s.close()
        label = {m.group(1): m.group(2) for ln in lines if (m := re.match(r"^  ([a-z ]+):\s+(.*)$", ln))}
        want = {"dashboard", "token", "run dir", "shell", "metrics", "job", "driver", "stop"} | (
            {"prometheus"} if with_prometheus else set())
        assert want <= set(label), lines
        dashboard = label["dashboard"].split()[0]
        assert not dashboard.endswith(f":{taken[0]}")
        assert any(f"dashboard: port {taken[0]} is taken" in ln for ln in lines), lines
        # the shared pool is made at start by a process that is no user job (nothing it holds is a job's)
        assert any(re.match(r"pool 'orrery-pool' up \(default: 2 workers", ln) for ln in lines), lines
        token_file = Path(label["token"].split()[0])
        token = token_file.read_text()
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        assert _get(dashboard + "/api/version", token)[0] == 200
        assert _get(dashboard + "/api/version")[0] == 401  # the token is what the dashboard wants
        # The token line's command prints this cluster's token; the bare command the dashboard suggests does not.
        command = re.search(r"print it: (.*?);", label["token"]).group(1).replace(".venv/bin/ray",
                                                                                  str(local.VENV_PYTHON.parent / "ray"))
        printed = subprocess.run(command, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert printed.stdout == token, (command, printed.stdout, printed.stderr[-2000:])
        bare = subprocess.run([str(local.VENV_PYTHON.parent / "ray"), "get-auth-token"], env=env,
                              capture_output=True, text=True, timeout=120)
        assert bare.stdout == "another-clusters-token"
        assert f"--address {dashboard} " in label["job"] and "$PWD/.venv/bin/python" in label["job"]
        # the submit env that keeps `ray job submit` quiet (test_the_start_lines_submit_env_...), in both lines
        assert "RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES='' " in label["shell"] + " " and \
            "RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES='' " in label["job"]
        # the head's metrics endpoint: the pool's counters are there at 0 from the start (Ray exports every few s)
        deadline, text = time.monotonic() + 60, ""
        while "ray_orrery_pool_retries_total" not in text and time.monotonic() < deadline:
            time.sleep(1.0)
            text = _get(label["metrics"].split()[0])[1]
        assert re.search(r'^ray_orrery_pool_retries_total\{.*pool="orrery-pool".*\} 0\.0$', text, re.M), text[-2000:]
        assert label["stop"].endswith(f"kill {proc.pid}")
        if with_prometheus:
            prom = label["prometheus"].split()[0].removesuffix("/graph")
            assert not prom.endswith(f":{taken[1]}")
            status, _ = _get(prom + "/graph?g0.expr=ray_orrery_learner_env_steps&g0.tab=0")
            assert status == 200
            status, body = _get(prom + "/api/v1/query?query=ray_orrery_learner_env_steps")
            assert status == 200 and json.loads(body)["status"] == "success"
        run_dir = Path(label["run dir"].split()[0])
        # Ray's state-API clients inside the cluster (Ray Train's PlacementGroupCleaner) are pointed at this
        # dashboard, not at whichever Ray they find on the machine ("Found multiple active Ray instances").
        raylets = [pid for pid in processes_using(run_dir / "h") if b"raylet" in Path(f"/proc/{pid}/cmdline")
                   .read_bytes().split(b"\0")[0]]
        assert raylets and all(f"RAY_API_SERVER_ADDRESS={dashboard}".encode() in
                               Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") for pid in raylets)
        proc.send_signal(signal.SIGTERM)  # what the stop line's `kill <pid>` does
        assert proc.wait(timeout=120) == 0, "\n".join(lines)[-4000:]
        reader.join(timeout=30)
        stopped = [ln for ln in lines if ln.startswith("cluster stopped:")]
        assert stopped == [f"cluster stopped: 1 node(s){' and Prometheus' if with_prometheus else ''} down "
                           f"(logs kept in {run_dir})"], lines[-10:]
        assert not processes_using(run_dir / "h")
        assert not any("Traceback" in ln for ln in lines), "\n".join(lines)[-4000:]
    finally:
        for s in held:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.slow
def test_tensorboard_serves_a_learners_scalars_from_its_run(tmp_path):
    pytest.importorskip("tensorboard")
    from cluster.metrics import MetricsLogger
    from cluster.ports import any_free_port
    logger = MetricsLogger(tmp_path / "lift_pretrain" / "run-1", flush_every=100)
    for step, value in ((64, -900.0), (128, -450.5), (192, -120.25)):
        logger.log(step, {"eval_return": value})
    logger.close()
    port = any_free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(tmp_path), "--host",
                             "127.0.0.1", "--port", str(port), "--reload_interval", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = (f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?run=lift_pretrain/run-1/tb&tag=eval_return")
    try:
        deadline = time.monotonic() + 180
        points = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status, body = _get(url, timeout=5)
                if status == 200 and (points := json.loads(body)):
                    break
            except OSError:
                pass
            time.sleep(1)
        assert points, proc.stderr.read()[-3000:] if proc.poll() is not None else "no scalars in time"
        assert [(step, value) for _, step, value in points] == [(64, -900.0), (128, -450.5), (192, -120.25)]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _pack_working_dir(work: Path, zip_path: Path) -> list[str]:
    """What `ray job submit --working-dir <work> --runtime-env configs/runtime_env.yaml` packs (Ray's own packaging,
    no cluster): the names in the zip. Ray's warnings go to the `ray.dashboard.modules.job.cli` logger there; here to
    the logger of this module, which the caller captures."""
    import logging

    import yaml
    from ray._private.runtime_env.packaging import create_package
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed
    from ray.util.debug import reset_log_once
    import zipfile

    runtime_env = {**yaml.safe_load((ROOT / "configs" / "runtime_env.yaml").read_text()), "working_dir": str(work)}
    reset_log_once()  # Ray warns once per process: a warning logged earlier in this process would hide this one

    def upload(path: str, excludes: list[str], is_file: bool = False) -> None:
        create_package(path, zip_path, include_gitignore=True, excludes=excludes)

    upload_working_dir_if_needed(runtime_env, include_gitignore=True, logger=logging.getLogger(__name__),
                                 upload_fn=upload)
    return zipfile.ZipFile(zip_path).namelist()


def test_the_start_lines_submit_env_packs_no_git_or_venv_and_warns_about_neither(tmp_path, monkeypatch, caplog):
    """The `shell:`/`job:` lines' QUIET_SUBMIT_ENV empties Ray's default excludes: a submit of a checkout then logs
    none of Ray 2.60's '.git/.venv is now ignored by default' warnings, and configs/runtime_env.yaml still keeps .git,
    .venv, venv, caches and runs out of the upload. Without it Ray warns (the control)."""
    import logging
    work = tmp_path / "checkout"
    for rel in (".git/HEAD", ".venv/bin/python", "venv/bin/python", "pkg/__pycache__/m.cpython-311.pyc",
                "runs/r/metrics.parquet", "pkg/m.py", "configs/a.yaml", "pkg/sub/.git/HEAD"):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text("x")
    monkeypatch.delenv("RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES", raising=False)
    with caplog.at_level(logging.WARNING, logger=__name__):
        _pack_working_dir(work, tmp_path / "control.zip")
    assert any("ignored by default" in r.getMessage() for r in caplog.records), caplog.text
    caplog.clear()
    for key, value in local.QUIET_SUBMIT_ENV.items():
        monkeypatch.setenv(key, value)
    with caplog.at_level(logging.WARNING, logger=__name__):
        names = _pack_working_dir(work, tmp_path / "quiet.zip")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert {"pkg/m.py", "configs/a.yaml"} <= set(names), names
    assert not [n for n in names if {".git", ".venv", "venv", "__pycache__", "runs"} & set(n.split("/"))], names
