"""Datasets from JSON-able specs: every process that gets the same spec builds the same arrays, so a pool request
carries the spec (a few numbers) and the worker rebuilds the data once and caches it.

    {"kind": "triplet", "n": 4000, "seed": 3, "dependent": true, "dz": 1, "noise": "t3", "effect": 0.5,
     "nonlinear": true, "rho": 0.9}                     columns [x, y, z_1..z_dz]; truth: dependent or not
                                                        (rho optional: the determinism dial, envs.causal.triplets)
    {"kind": "sem", "n": 4000, "seed": 3, "d": 8, "degree": 2.0, "sem": "linear"|"nonlinear", "noise": "t3"}
                                                        columns = nodes; truth: the DAG
    {"kind": "sachs", "rows": "general"|"all", "log": true}
    {"kind": "file", "path": "/shared/data.npy"}        an (n, d) .npy array on a path every worker can read
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import numpy as np

from envs.causal.sem import random_dag, sample_sem
from envs.causal.triplets import ci_triplet

KINDS = ("triplet", "sem", "sachs", "file")


@dataclass
class Dataset:
    data: np.ndarray                  # [n, d]
    names: list[str]
    dag: np.ndarray | None = None     # [d, d] bool, i -> j (sem, sachs's consensus graph)
    dependent: bool | None = None     # triplet: whether X and Y are dependent given Z


def _require(spec: dict, *keys: str) -> None:
    missing = [k for k in keys if k not in spec]
    if missing:
        raise ValueError(f"dataset spec {spec.get('kind')!r}: missing {', '.join(missing)}")


def make_dataset(spec: dict) -> Dataset:
    """The dataset a spec names (module docstring); cached per spec in this process."""
    return _cached(json.dumps(spec, sort_keys=True))


@functools.lru_cache(maxsize=4)
def _cached(key: str) -> Dataset:
    spec = json.loads(key)
    kind = spec.get("kind")
    if kind == "triplet":
        _require(spec, "n", "seed", "dependent")
        dz = int(spec.get("dz", 1))
        x, y, z = ci_triplet(int(spec["n"]), bool(spec["dependent"]), np.random.default_rng(int(spec["seed"])),
                             dz=dz, noise=spec.get("noise", "t3"), effect=float(spec.get("effect", 0.5)),
                             nonlinear=bool(spec.get("nonlinear", True)),
                             rho=None if spec.get("rho") is None else float(spec["rho"]))
        return Dataset(np.hstack([x, y, z]), ["x", "y"] + [f"z{i}" for i in range(dz)],
                       dependent=bool(spec["dependent"]))
    if kind == "sem":
        _require(spec, "n", "seed", "d")
        rng = np.random.default_rng(int(spec["seed"]))
        dag = random_dag(int(spec["d"]), float(spec.get("degree", 2.0)), rng)
        data = sample_sem(dag, int(spec["n"]), rng, kind=spec.get("sem", "linear"), noise=spec.get("noise", "gaussian"))
        return Dataset(data, [f"x{i}" for i in range(len(dag))], dag=dag)
    if kind == "sachs":
        from envs.causal.sachs import load_sachs
        data, names, dag = load_sachs(spec.get("rows", "general"), bool(spec.get("log", True)))
        return Dataset(data, names, dag=dag)
    if kind == "file":
        _require(spec, "path")
        data = np.load(spec["path"])
        if data.ndim != 2:
            raise ValueError(f"dataset file {spec['path']}: expected a 2-D array, got shape {data.shape}")
        return Dataset(np.asarray(data, dtype=np.float64), [f"x{i}" for i in range(data.shape[1])])
    raise ValueError(f"dataset spec: unknown kind {kind!r} (choose from {', '.join(KINDS)})")
