"""The GPU cluster definitions, checked without any cloud: the `ray up` YAML against the schema Ray itself uses, the
KubeRay RayCluster against a schema of the fields we rely on, and scale=paper's learners and samplers packed onto
the nodes each file declares."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml

from experiments.config import load

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "cluster" / "deploy"

# The part of the KubeRay ray.io/v1 RayCluster CRD these manifests use (no CRD ships with any installed package).
_RESOURCES = {"type": "object", "properties": {
    "requests": {"type": "object", "additionalProperties": {"type": ["string", "integer"]}},
    "limits": {"type": "object", "additionalProperties": {"type": ["string", "integer"]}}}}
_POD = {"type": "object", "required": ["spec"], "properties": {"spec": {
    "type": "object", "required": ["containers"], "properties": {"containers": {
        "type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["name", "image", "resources"],
            "properties": {"name": {"type": "string"}, "image": {"type": "string", "minLength": 1},
                           "resources": _RESOURCES,
                           "env": {"type": "array", "items": {"type": "object", "required": ["name"]}}}}}}}}}
_START_PARAMS = {"type": "object", "additionalProperties": {"type": "string"}}  # KubeRay wants strings
RAYCLUSTER_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "ray.io/v1"}, "kind": {"const": "RayCluster"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {"type": "object", "required": ["headGroupSpec", "workerGroupSpecs"], "properties": {
            "rayVersion": {"type": "string"},
            "enableInTreeAutoscaling": {"type": "boolean"},
            "headGroupSpec": {"type": "object", "required": ["rayStartParams", "template"],
                              "properties": {"rayStartParams": _START_PARAMS, "template": _POD}},
            "workerGroupSpecs": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["groupName", "replicas", "minReplicas", "maxReplicas",
                                               "rayStartParams", "template"],
                "properties": {"groupName": {"type": "string"}, "replicas": {"type": "integer", "minimum": 0},
                               "minReplicas": {"type": "integer", "minimum": 0},
                               "maxReplicas": {"type": "integer", "minimum": 1},
                               "rayStartParams": _START_PARAMS, "template": _POD}}}}}}}


def _ray_up() -> dict:
    return yaml.safe_load((DEPLOY / "ray-cluster.yaml").read_text())


def _kuberay() -> dict:
    return yaml.safe_load((DEPLOY / "kuberay.yaml").read_text())


def _demand(scale: str) -> list[dict[str, float]]:
    """One resource bundle per Ray Train worker and per pool worker (of every worker group) of ``scale``."""
    typed = load([f"scale={scale}"])["_typed"]
    train, pool = typed["train"], typed["pool"]
    learner = {"CPU": train.cpus_per_worker, "GPU": train.gpus_per_worker if train.use_gpu else 0.0}
    samplers = [{"CPU": g.num_cpus, "GPU": g.num_gpus} for g in pool.worker_groups().values()
                for _ in range(g.num_workers)]
    return [learner] * train.num_workers + samplers


def _fits(bundles: list[dict[str, float]], nodes: list[dict[str, float]]) -> bool:
    """First-fit decreasing (GPU first): can every bundle be placed, fractional GPUs within one GPU's capacity?"""
    free = [dict(n) for n in nodes]
    for b in sorted(bundles, key=lambda b: (-b["GPU"], -b["CPU"])):
        for node in free:
            if node.get("CPU", 0) >= b["CPU"] - 1e-9 and node.get("GPU", 0) >= b["GPU"] - 1e-9:
                node["CPU"] -= b["CPU"]
                node["GPU"] = node.get("GPU", 0) - b["GPU"]
                break
        else:
            return False
    return True


def test_ray_up_yaml_is_valid_for_ray():
    from ray.autoscaler._private.util import prepare_config, validate_config
    cfg = _ray_up()
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    jsonschema.validate(cfg, schema)
    validate_config(prepare_config(copy.deepcopy(cfg)))  # what `ray up` runs before touching the cloud
    broken = copy.deepcopy(cfg)
    broken["available_node_types"]["gpu"]["gpus"] = 8
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)

    head = cfg["available_node_types"][cfg["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    setup = " ".join(cfg["setup_commands"])
    assert "python3 -m experiments.venv" in setup and "ORRERY_TORCH=" in setup and "cu1" in setup
    for cmd in (cfg["head_start_ray_commands"][-1], cfg["worker_start_ray_commands"][-1]):
        assert "RAY_AUTH_MODE=token" in cmd and "/orrery/.venv/bin/ray start" in cmd and "--metrics-export-port" in cmd
    assert cfg["file_mounts"]["/home/ray/.ray/auth_token"] == "~/.ray/auth_token"
    assert {".venv", ".git", "runs"} <= set(cfg["rsync_exclude"])


def test_ray_up_syncs_no_environment_or_wheel_folder():
    """``ray up`` rsyncs the checkout to every node: the other Pythons' venvs (.venv312, .venv313) and wheel folders
    (.whl, .gl) are GBs that each node builds for itself."""
    from fnmatch import fnmatch
    cfg = _ray_up()
    for folder in (".venv", ".venv312", ".venv313", ".whl", ".gl"):
        assert any(fnmatch(folder, pattern) for pattern in cfg["rsync_exclude"]), folder
    assert ".gitignore" in cfg["rsync_filter"]


def test_the_readme_installs_boto3_before_ray_up():
    """``ray up``'s AWS provider imports boto3 on the laptop too, and orrery's venv has none: the README's
    launcher block installs it into that venv before ``ray up``."""
    import re
    block = (ROOT / "README.md").read_text().split(".venv/bin/ray up -y cluster/deploy/ray-cluster.yaml")[0]
    block = block[block.rindex("```bash"):]
    assert re.search(r"\.venv/bin/python -m pip install [^\n]*boto3", block), block


def test_kuberay_manifest_matches_the_raycluster_schema():
    manifest = _kuberay()
    jsonschema.validate(manifest, RAYCLUSTER_SCHEMA)
    assert manifest["spec"]["rayVersion"] == ray.__version__
    broken = copy.deepcopy(manifest)
    broken["spec"]["workerGroupSpecs"][0]["rayStartParams"]["num-cpus"] = 8  # must be a string for KubeRay
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, RAYCLUSTER_SCHEMA)
    pods = [manifest["spec"]["headGroupSpec"]["template"]] + [g["template"] for g in manifest["spec"]["workerGroupSpecs"]]
    for pod in pods:
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token" and "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"]
    gpu = manifest["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]
    assert gpu["limits"]["nvidia.com/gpu"] == gpu["requests"]["nvidia.com/gpu"] >= 1


def _ray_up_nodes() -> list[dict[str, float]]:
    cfg = _ray_up()
    nodes = []
    for name, node_type in cfg["available_node_types"].items():
        count = 1 if name == cfg["head_node_type"] else node_type["max_workers"]
        nodes += [dict(node_type["resources"])] * count
    return nodes


def _kuberay_nodes() -> list[dict[str, float]]:
    spec = _kuberay()["spec"]
    nodes = [{"CPU": float(spec["headGroupSpec"]["rayStartParams"]["num-cpus"]),
              "GPU": float(spec["headGroupSpec"]["rayStartParams"].get("num-gpus", 0))}]
    for group in spec["workerGroupSpecs"]:
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        node = {"CPU": float(group["rayStartParams"].get("num-cpus", limits["cpu"])),
                "GPU": float(limits.get("nvidia.com/gpu", 0))}
        nodes += [node] * group["maxReplicas"]
    return nodes


@pytest.mark.parametrize("nodes", [_ray_up_nodes, _kuberay_nodes], ids=["ray-up", "kuberay"])
def test_paper_scale_fits_the_declared_gpu_nodes(nodes):
    demand = _demand("paper")
    learners = [b for b in demand if b["GPU"] == 1.0]
    samplers = [b for b in demand if b not in learners]
    assert len(learners) >= 1 and all(b["GPU"] == 0 or 0 < b["GPU"] < 1 for b in samplers), demand
    assert any(0 < b["GPU"] < 1 for b in samplers), "model samplers share GPUs fractionally"
    nodes = nodes()
    assert _fits(demand, nodes)
    assert _fits(demand, [n for n in nodes if n.get("GPU", 0) > 0][:1]), "one GPU node should hold a paper run"
    assert not _fits(demand, [n for n in nodes if n.get("GPU", 0) == 0]), "paper scale must need the GPU nodes"
    assert _fits(_demand("smoke"), [{"CPU": 2, "GPU": 0}]), "smoke scale must fit a 2-core laptop"


def test_free_ports_are_distinct_bindable_and_never_handed_out_twice():
    """A node's ports are picked together while their sockets are held, so none repeats within a node (two Ray
    components on one port made `ray start` refuse), nor across the nodes this process starts."""
    import socket

    from cluster.deploy.local import free_ports
    first, second = free_ports(64), free_ports(64)
    assert len(set(first)) == 64 and len(set(second)) == 64
    assert not set(first) & set(second), "a port handed out once is not handed out again"
    for port in first:  # nothing keeps them: each can be bound by the node that gets it
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", port))


def test_free_ports_differ_even_when_the_os_reuses_a_closed_port(monkeypatch):
    """An OS that hands out the lowest port not bound right now (Linux may reuse a just-closed ephemeral port): ports
    picked one socket at a time would all be equal."""
    import cluster.deploy.local_node as local  # the module that owns the port helpers (and their socket)

    bound: set[int] = set()

    class ReusingSocket:
        def __init__(self, *args):
            self.port = None

        def bind(self, address):
            self.port = min(set(range(40000, 40100)) - bound)
            bound.add(self.port)

        def getsockname(self):
            return ("0.0.0.0", self.port)

        def close(self):
            bound.discard(self.port)

    import types
    fake_os = types.SimpleNamespace(socket=ReusingSocket, AF_INET=None, SOCK_STREAM=None)
    monkeypatch.setattr(local, "socket", fake_os)  # only local.py sees it, not Ray's sockets in this process
    monkeypatch.setattr(local, "_handed_out", set())
    ports = local.free_ports(12)
    assert len(set(ports)) == 12, ports
    assert not set(local.free_ports(12)) & set(ports), "the second node gets other ports than the first"


def test_a_node_that_times_out_during_startup_is_started_again():
    """Ray gives a raylet a fixed 30 s to register; on a loaded machine that fails now and then. The local deploy
    helper starts such a node again (bounded), and fails at once on any other error."""
    from cluster.deploy import local
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < local.STARTUP_ATTEMPTS:
            raise RuntimeError("ray start exited with 1 before node registration; log:\nException: The current node "
                               "timed out during startup. This could happen because ...")
        return "node"

    assert local.retry_startup(flaky) == "node" and len(calls) == local.STARTUP_ATTEMPTS
    calls.clear()
    with pytest.raises(RuntimeError, match="timed out during startup"):
        local.retry_startup(lambda: calls.append(1) or (_ for _ in ()).throw(
            RuntimeError("The current node timed out during startup")))
    assert len(calls) == local.STARTUP_ATTEMPTS
    calls.clear()

    def broken():
        calls.append(1)
        raise RuntimeError("ray start exited with 1 before dashboard; log:\nport in use")

    with pytest.raises(RuntimeError, match="port in use"):
        local.retry_startup(broken)
    assert len(calls) == 1


def test_the_venv_stamp_reads_back_as_written():
    """A second `python3 -m experiments.venv` must find its stamp and install nothing: the stamp is compared stripped,
    so the wanted value must carry no trailing space (an empty torch index left one, and every call reinstalled)."""
    from experiments.venv import _wanted_stamp
    for index in ("", "https://download.pytorch.org/whl/cu126"):
        wanted = _wanted_stamp("torch==2.13.0", index)
        assert (wanted + "\n").strip() == wanted, repr(wanted)
