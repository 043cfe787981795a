"""Is a run's directory on storage every node sees? A multi-node run writes from every node (rank 0's metrics, each
rank's replay and checkpoint shards) and its driver reads it all back, so an ``output_dir`` on one node's own disk
loses data silently. ``require_shared(path)`` checks before any learner starts: the driver writes a marker with a
fresh token into ``path``, one zero-CPU task per alive node reads it back, and a node that reads something else (or
nothing) fails the run with one line naming it.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

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
