"""Random DAGs and structural equation models on them.

``random_dag``: Erdos-Renyi DAG over a random causal order with the given expected degree (edges per node, in +
out). ``sample_sem``: each node is a weighted sum of functions of its parents plus independent noise, standardised
node by node in causal order (so nonlinear chains neither blow up nor vanish):

    linear    : x_j = sum_i w_ij x_i + e_j,            w_ij = +-U(0.5, 1.5),  e_j ~ N(0, 1)
    nonlinear : x_j = sum_i w_ij f_ij(x_i) + e_j,      f_ij from {x, tanh(2x), sin(2x), x^2 - 1},  e_j ~ noise
"""
from __future__ import annotations

import numpy as np

NONLINEAR = (lambda v: v, lambda v: np.tanh(2 * v), lambda v: np.sin(2 * v), lambda v: v * v - 1.0)
NOISES = ("gaussian", "t3", "laplace")


def random_dag(d: int, expected_degree: float, rng: np.random.Generator) -> np.ndarray:
    """Boolean adjacency ``A[i, j]`` = edge i -> j of a random DAG on ``d`` nodes."""
    if d < 2:
        raise ValueError(f"random_dag: need d >= 2 nodes, got {d}")
    if not 0 < expected_degree <= d - 1:
        raise ValueError(f"random_dag: expected_degree must be in (0, {d - 1}], got {expected_degree}")
    p = expected_degree / (d - 1)
    upper = np.triu(rng.uniform(size=(d, d)) < p, k=1)
    order = rng.permutation(d)  # node order[k] is the k-th in causal order
    adj = np.zeros((d, d), dtype=bool)
    adj[np.ix_(order, order)] = upper
    return adj


def topological_order(adj: np.ndarray) -> list[int]:
    indeg = adj.sum(0).astype(int)
    ready = [j for j in range(len(adj)) if indeg[j] == 0]
    out = []
    while ready:
        i = ready.pop()
        out.append(i)
        for j in np.flatnonzero(adj[i]):
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(int(j))
    if len(out) != len(adj):
        raise ValueError("adjacency has a cycle")
    return out


def draw_noise(kind: str, size: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if kind == "gaussian":
        return rng.normal(size=size)
    if kind == "t3":
        return rng.standard_t(3, size=size) / np.sqrt(3.0)  # unit variance
    if kind == "laplace":
        return rng.laplace(scale=1 / np.sqrt(2.0), size=size)
    raise ValueError(f"noise: unknown kind {kind!r} (choose from {', '.join(NOISES)})")


def sample_sem(adj: np.ndarray, n: int, rng: np.random.Generator, kind: str = "linear",
               noise: str = "gaussian") -> np.ndarray:
    """``n`` rows of the SEM on DAG ``adj`` (see the module docstring); columns are the nodes."""
    if kind not in ("linear", "nonlinear"):
        raise ValueError(f"sem kind: choose linear or nonlinear, got {kind!r}")
    if n < 1:
        raise ValueError(f"sample_sem: n must be >= 1, got {n}")
    d = len(adj)
    weights = rng.uniform(0.5, 1.5, size=(d, d)) * rng.choice([-1.0, 1.0], size=(d, d))
    funcs = rng.integers(0, len(NONLINEAR), size=(d, d))
    data = np.zeros((n, d))
    for j in topological_order(adj):
        e = draw_noise("gaussian" if kind == "linear" else noise, (n,), rng)
        total = e.copy()
        for i in np.flatnonzero(adj[:, j]):
            f = NONLINEAR[0] if kind == "linear" else NONLINEAR[funcs[i, j]]
            total += weights[i, j] * f(data[:, i])
        data[:, j] = (total - total.mean()) / (total.std() + 1e-12)
    return data
