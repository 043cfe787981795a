"""The Sachs et al. (2005) flow-cytometry data (11 phospho-proteins) and its consensus graph (18 edges, one cycle
PIP3 -> plcg -> PIP2 -> PIP3), as shipped inside the ``cdt`` 0.6.0 wheel (cdt/data/resources/cyto_full_*.csv); read
as a file, without importing cdt (which imports torch models at the top level).

The 7466 rows are grouped by experimental condition; the first 1755 are the two general-stimulation conditions
(cd3cd28, cd3cd28icam2) that the E-CIT paper used. Split such data into subsets at random, never in row order.
"""
from __future__ import annotations

import csv
import importlib.metadata
from pathlib import Path

import numpy as np

GENERAL_STIMULATION_ROWS = 1755


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
