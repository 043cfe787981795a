"""Is a run's directory on storage every node sees? A multi-node run writes from every node (rank 0's metrics, each
rank's replay and checkpoint shards) and its driver reads it all back, so an ``output_dir`` on one node's own disk
loses data silently. ``require_shared(path)`` checks before any learner starts: the driver writes a marker with a
fresh token into ``path``, one zero-CPU task per alive node reads it back, and a node that reads something else (or
nothing) fails the run with one line naming it.

Inputs read on every node (an AttnRL run's ``experiment.hf_model``, loaded by each learner and pool sampler from its
own path) must be the same files everywhere: ``require_same_inputs(paths)`` compares a fingerprint of each path
(names, sizes and sampled content) computed by one zero-CPU task per node with the driver's.
"""
from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import Iterable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

MARKER = ".orrery-shared-check"


class StorageNotShared(RuntimeError):
    """An output directory some node of the cluster cannot see."""


@ray.remote(num_cpus=0, max_retries=0)
def _read_marker(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def alive_nodes() -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def nodes_not_seeing(directory: str | Path, token: str, nodes: list[dict] | None = None,
                     timeout_s: float = 120.0) -> list[str]:
    """The nodes (``ip (node id prefix)``) on which ``<directory>/.orrery-shared-check`` does not hold ``token``."""
    marker = str(Path(directory).resolve() / MARKER)
    nodes = alive_nodes() if nodes is None else nodes
    refs = [_read_marker.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(marker) for n in nodes]
    seen = ray.get(refs, timeout=timeout_s)
    return [f"{n.get('NodeManagerAddress', '?')} ({n['NodeID'][:8]})" for n, got in zip(nodes, seen) if got != token]


def write_marker(directory: str | Path) -> str:
    """Write a fresh token into ``directory``'s marker (atomically) and return it."""
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    partial = directory / f"{MARKER}.{os.getpid()}.tmp"
    partial.write_text(token)
    partial.replace(directory / MARKER)
    return token


def require_shared(directory: str | Path, min_nodes: int = 2) -> None:
    """Refuse (``StorageNotShared``) a ``directory`` that some alive node cannot read, on clusters of at least
    ``min_nodes`` nodes (one node always sees its own disk)."""
    nodes = alive_nodes()
    if len(nodes) < min_nodes:
        return
    missing = nodes_not_seeing(directory, write_marker(directory), nodes)
    if missing:
        raise StorageNotShared(
            f"output_dir {Path(directory).resolve()} is not on storage every node sees ({len(missing)} of "
            f"{len(nodes)} nodes cannot read it: {', '.join(missing)}); pass output_dir=<a shared filesystem mounted "
            f"at the same path on every node> (NFS/EFS, /mnt/shared in cluster/deploy/)")


# ------------------------------------------------------------------------------------- inputs read on every node

SAMPLE_BYTES = 1 << 20  # per file: the first, middle and last MiB are hashed (a 3.5 GB model in ~10 ms per node)
INPUT_KEYS = ("hf_model",)  # experiment fields naming a path that learners and samplers read on their own node


def fingerprint(path: str | Path) -> str | None:
    """A digest of ``path`` (a file or a directory tree): every file's relative name and size, and the hash of its
    first, middle and last MiB (all of a file up to 3 MiB); None if ``path`` does not exist. Two copies of a
    model that differ in a file, a size or a sampled byte differ here; reading whole multi-GB weights on every node
    (from network storage) would cost minutes."""
    root = Path(path)
    if not root.exists():
        return None
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    digest = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        digest.update(f"{f.relative_to(root) if f != root else f.name}\0{size}\0".encode())
        with f.open("rb") as fh:
            if size <= 3 * SAMPLE_BYTES:
                digest.update(fh.read())
            else:
                for offset in (0, size // 2, size - SAMPLE_BYTES):
                    fh.seek(offset)
                    digest.update(fh.read(SAMPLE_BYTES))
    return digest.hexdigest()


@ray.remote(num_cpus=0, max_retries=0)
def _fingerprint(path: str) -> str | None:
    try:
        return fingerprint(path)
    except OSError:
        return None


def nodes_reading_otherwise(path: str | Path, expected: str | None = None, nodes: list[dict] | None = None,
                            timeout_s: float = 300.0) -> list[str]:
    """The nodes (``ip (node id prefix)``) on which ``path`` does not have the fingerprint ``expected`` (default:
    the one this process computes)."""
    expected = fingerprint(path) if expected is None else expected
    nodes = alive_nodes() if nodes is None else nodes
    refs = [_fingerprint.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(str(path)) for n in nodes]
    seen = ray.get(refs, timeout=timeout_s)
    return [f"{n.get('NodeManagerAddress', '?')} ({n['NodeID'][:8]})" for n, got in zip(nodes, seen) if got != expected]


def input_paths(experiment: dict) -> list[str]:
    """The paths in an experiment's config that every node reads for itself (``INPUT_KEYS`` that are set)."""
    return [str(experiment[k]) for k in INPUT_KEYS if experiment.get(k)]


def require_same_inputs(paths: Iterable[str | Path], min_nodes: int = 2) -> None:
    """Refuse (``StorageNotShared``) an input path that some alive node reads differently (another copy, another
    version, or nothing), on clusters of at least ``min_nodes`` nodes."""
    paths = list(paths)
    nodes = alive_nodes()
    if len(nodes) < min_nodes or not paths:
        return
    for path in paths:
        expected = fingerprint(path)
        if expected is None:
            raise FileNotFoundError(f"input {path} does not exist on the driver's node")
        differ = nodes_reading_otherwise(path, expected, nodes)
        if differ:
            raise StorageNotShared(
                f"input {Path(path).resolve()} is not the same on every node ({len(differ)} of {len(nodes)} nodes "
                f"read other files or none: {', '.join(differ)}); put it on storage every node mounts at the same "
                f"path (/mnt/shared in cluster/deploy/) or copy the identical files to every node")
