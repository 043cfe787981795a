"""The Sachs et al. (2005) flow-cytometry data (11 phospho-proteins), its consensus graph (18 edges, one cycle
PIP3 -> plcg -> PIP2 -> PIP3) and the commonly used 17-arc DAG (:data:`SACHS_DAG_17`). Data and consensus as shipped
inside the ``cdt`` 0.6.0 wheel (cdt/data/resources/cyto_full_*.csv); read as a file, without importing cdt (which
imports torch models at the top level).

The 7466 rows are grouped by experimental condition; the first 1755 are the two general-stimulation conditions
(cd3cd28, cd3cd28icam2) that the E-CIT paper used. Split such data into subsets at random, never in row order.
"""
from __future__ import annotations

import csv
import importlib.metadata
from pathlib import Path

import numpy as np

GENERAL_STIMULATION_ROWS = 1755
# The other reference graph: the 17-arc DAG that most DAG-learning benchmarks score Sachs against, Sachs et al.
# (2005)'s network as the bnlearn repository encodes it (network "sachs"; model string "[PKC][PKA|PKC][Raf|PKC:PKA]
# [Mek|PKC:PKA:Raf][Erk|Mek:PKA][Akt|Erk:PKA][P38|PKC:PKA][Jnk|PKC:PKA][Plcg][PIP3|Plcg][PIP2|Plcg:PIP3]", Nagarajan,
# Scutari & Lebre, "Bayesian Networks in R", Springer 2013, ch. 6), in cdt's column names (Raf = praf, Mek = pmek,
# Erk = p44/42, Akt = pakts473, Jnk = pjnk). Against cdt's 18-edge consensus it is acyclic, adds PKC -> PKA and
# Erk -> Akt, drops plcg -> PKC, PIP2 -> PKC and PIP3 -> Akt, and reverses PIP3 -> plcg and PIP2 -> PIP3.
SACHS_DAG_17 = (("PKC", "PKA"), ("PKC", "praf"), ("PKA", "praf"), ("PKC", "pmek"), ("PKA", "pmek"), ("praf", "pmek"),
                ("pmek", "p44/42"), ("PKA", "p44/42"), ("p44/42", "pakts473"), ("PKA", "pakts473"), ("PKC", "P38"),
                ("PKA", "P38"), ("PKC", "pjnk"), ("PKA", "pjnk"), ("plcg", "PIP3"), ("plcg", "PIP2"),
                ("PIP3", "PIP2"))


def sachs_dag_17(names: list[str]) -> np.ndarray:
    """Adjacency ``[d, d]`` (i -> j) of :data:`SACHS_DAG_17` over ``names`` (cdt's column order)."""
    index = {name: i for i, name in enumerate(names)}
    missing = sorted({v for edge in SACHS_DAG_17 for v in edge} - set(index))
    if missing:
        raise ValueError(f"sachs 17-arc DAG: no column named {', '.join(missing)}")
    adj = np.zeros((len(names), len(names)), dtype=bool)
    for cause, effect in SACHS_DAG_17:
        adj[index[cause], index[effect]] = True
    return adj


def _resource(name: str) -> Path:
    try:
        dist = importlib.metadata.distribution("cdt")
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError("the Sachs data ships with the 'cdt' package: pip install cdt==0.6.0") from None
    path = Path(dist.locate_file(f"cdt/data/resources/{name}"))
    if not path.exists():
        raise FileNotFoundError(f"cdt is installed but lacks {path}")
    return path


def load_sachs(rows: str = "general", log: bool = True) -> tuple[np.ndarray, list[str], np.ndarray]:
    """``(data [n, 11], names, adjacency [11, 11] of the consensus graph)``; rows "general" (the first 1755) or
    "all" (7466); ``log``: log(1 + x) of the skewed concentrations."""
    with open(_resource("cyto_full_data.csv")) as fh:
        reader = csv.reader(fh)
        names = next(reader)
        data = np.array([[float(v) for v in row] for row in reader])
    if rows == "general":
        data = data[:GENERAL_STIMULATION_ROWS]
    elif rows != "all":
        raise ValueError(f"sachs rows: choose general or all, got {rows!r}")
    if log:
        data = np.log1p(np.maximum(data, 0.0))
    index = {name: i for i, name in enumerate(names)}
    adj = np.zeros((len(names), len(names)), dtype=bool)
    with open(_resource("cyto_full_target.csv")) as fh:
        reader = csv.reader(fh)
        next(reader)
        for cause, effect in reader:
            adj[index[cause], index[effect]] = True
    return data, names, adj
