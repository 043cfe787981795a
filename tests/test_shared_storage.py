"""Multi-node runs refuse an output_dir that some node cannot see (cluster/storage.py), checked with real tasks on
the session cluster's node (on the three raylets of a multi-node cluster: tests/test_rehearsal.py); the deploy files
mount the shared volume the README names."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cluster import storage

DEPLOY = Path(__file__).resolve().parents[1] / "cluster" / "deploy"


def test_every_node_reads_the_marker_of_a_shared_directory(ray_cluster, tmp_path):
    token = storage.write_marker(tmp_path / "runs")
    assert (tmp_path / "runs" / storage.MARKER).read_text() == token
    assert storage.nodes_not_seeing(tmp_path / "runs", token) == []
    storage.require_shared(tmp_path / "runs", min_nodes=1)  # one node, forced: passes


def test_a_node_reading_another_marker_or_none_is_named(ray_cluster, tmp_path):
    storage.write_marker(tmp_path / "a")
    missing = storage.nodes_not_seeing(tmp_path / "a", "a token no node wrote")
    assert len(missing) == len(storage.alive_nodes()) >= 1
    assert storage.nodes_not_seeing(tmp_path / "nowhere", "x") == missing  # no marker at all


def test_require_shared_fails_with_one_line_naming_the_nodes(ray_cluster, tmp_path, monkeypatch):
    # as if the driver's disk were not the nodes' disk: the marker the nodes read holds another token
    monkeypatch.setattr(storage, "write_marker", lambda d: (Path(d).mkdir(parents=True, exist_ok=True), "driver's")[1])
    with pytest.raises(storage.StorageNotShared) as err:
        storage.require_shared(tmp_path / "local-disk", min_nodes=1)
    message = str(err.value)
    assert "\n" not in message and "is not on storage every node sees" in message and "output_dir=" in message


def test_a_single_node_cluster_is_not_checked(ray_cluster, tmp_path):
    storage.require_shared(tmp_path / "never-written")  # default min_nodes=2: no marker, no task
    assert not (tmp_path / "never-written").exists()


def test_deploy_files_mount_shared_storage_at_the_readme_path():
    """README and both deploy files use output_dir=/mnt/shared/runs: the launcher mounts EFS there on every node (and
    into the container), KubeRay mounts the ReadWriteMany claim defined in kuberay-storage.yaml on every pod."""
    launcher = yaml.safe_load((DEPLOY / "ray-cluster.yaml").read_text())
    assert any("/mnt/shared" in c and "mount" in c for c in launcher["initialization_commands"])
    assert "-v /mnt/shared:/mnt/shared" in launcher["docker"]["run_options"]
    ray_cluster_spec = yaml.safe_load((DEPLOY / "kuberay.yaml").read_text())["spec"]
    groups = [ray_cluster_spec["headGroupSpec"], *ray_cluster_spec["workerGroupSpecs"]]
    claim = yaml.safe_load((DEPLOY / "kuberay-storage.yaml").read_text())
    assert claim["kind"] == "PersistentVolumeClaim" and claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for group in groups:
        pod = group["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for c in pod["containers"] for m in c["volumeMounts"]}
        assert volumes[mounts["/mnt/shared"]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]


# ------------------------------------------------------------------- inputs every node reads (experiment.hf_model)

def _model_dir(path: Path, weights: bytes) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "qwen2"}')
    (path / "model.safetensors").write_bytes(weights)
    return path


def test_the_fingerprint_tells_copies_from_other_files(tmp_path):
    big = bytes(range(256)) * (4 * storage.SAMPLE_BYTES // 256)  # 4 MiB: sampled, not read whole
    a = storage.fingerprint(_model_dir(tmp_path / "a", big))
    assert a is not None and storage.fingerprint(_model_dir(tmp_path / "copy", big)) == a
    assert storage.fingerprint(_model_dir(tmp_path / "tail", big[:-1] + b"\x01")) != a  # last byte
    assert storage.fingerprint(_model_dir(tmp_path / "short", big[:-1])) != a  # size
    (tmp_path / "extra").mkdir()
    _model_dir(tmp_path / "extra" / "m", big)
    (tmp_path / "extra" / "m" / "tokenizer.json").write_text("{}")
    assert storage.fingerprint(tmp_path / "extra" / "m") != a  # one more file
    assert storage.fingerprint(tmp_path / "nowhere") is None
    assert storage.input_paths({"hf_model": str(tmp_path / "a"), "seed": 0}) == [str(tmp_path / "a")]
    assert storage.input_paths({"hf_model": None}) == []


def test_a_node_reading_another_model_is_named(ray_cluster, tmp_path):
    model = _model_dir(tmp_path / "m", b"weights")
    assert storage.nodes_reading_otherwise(model) == []
    assert len(storage.nodes_reading_otherwise(model, expected="the driver's other copy")) == 1
    storage.require_same_inputs([model], min_nodes=1)  # the one node reads the driver's files: passes


def test_require_same_inputs_fails_with_one_line_naming_the_nodes(ray_cluster, tmp_path, monkeypatch):
    model = _model_dir(tmp_path / "m", b"weights")
    real = storage.fingerprint
    # as if the driver's copy differed from the nodes' (the task on the node computes the real one)
    monkeypatch.setattr(storage, "fingerprint", lambda p: "driver's" if Path(p) == model else real(p))
    with pytest.raises(storage.StorageNotShared) as err:
        storage.require_same_inputs([model], min_nodes=1)
    message = str(err.value)
    assert "\n" not in message and "is not the same on every node" in message


def test_runs_and_sweeps_check_their_inputs_before_any_learner_starts():
    """experiments.run and experiments.sweep call the input check right after the output-directory check."""
    import inspect

    from experiments import run, sweep
    for source in (inspect.getsource(run), inspect.getsource(sweep)):
        assert "require_same_inputs(input_paths(cfg[\"experiment\"]))" in source
