"""Graph truth and scores for causal discovery, on causal-learn's endpoint matrices (``G[i, j]``: the mark at i of
the edge i - j; i -> j is ``G[j, i] = 1, G[i, j] = -1``; an undirected edge is -1 at both ends).

The truth of a DAG is its CPDAG (what PC can identify from independences); SHD counts node pairs whose edge differs
(missing, extra, or other marks), as causal-learn's ``graph.SHD`` does; the skeleton F1 ignores directions.
"""
from __future__ import annotations

import numpy as np


def cpdag(adj: np.ndarray) -> np.ndarray:
    """Endpoint matrix of the CPDAG of the DAG ``adj`` (``adj[i, j]``: edge i -> j), by causal-learn's dag2cpdag."""
    from causallearn.graph.Dag import Dag
    from causallearn.graph.GraphNode import GraphNode
    from causallearn.utils.DAG2CPDAG import dag2cpdag

    nodes = [GraphNode(f"X{i + 1}") for i in range(len(adj))]
    dag = Dag(nodes)
    for i, j in zip(*np.nonzero(adj)):
        dag.add_directed_edge(nodes[i], nodes[j])
    return np.asarray(dag2cpdag(dag).graph)


def shd(truth: np.ndarray, est: np.ndarray) -> int:
    """Structural Hamming distance between two endpoint matrices (pairs i < j whose marks differ)."""
    if truth.shape != est.shape:
        raise ValueError(f"shd: graphs of different sizes {truth.shape} and {est.shape}")
    i, j = np.triu_indices(len(truth), k=1)
    return int(np.sum((truth[i, j] != est[i, j]) | (truth[j, i] != est[j, i])))


def skeleton_scores(truth: np.ndarray, est: np.ndarray) -> dict[str, float]:
    """Adjacency precision, recall and F1 (an empty estimate has precision 1 by convention, F1 0 if truth has
    edges)."""
    i, j = np.triu_indices(len(truth), k=1)
    t = (truth[i, j] != 0) | (truth[j, i] != 0)
    e = (est[i, j] != 0) | (est[j, i] != 0)
    tp, fp, fn = int(np.sum(t & e)), int(np.sum(~t & e)), int(np.sum(t & ~e))
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "tp": tp, "fp": fp, "fn": fn}


def oriented_scores(reference: np.ndarray, est: np.ndarray) -> dict[str, float]:
    """Oriented-edge precision and recall of the endpoint matrix ``est`` against the directed graph ``reference``
    (``reference[i, j]``: edge i -> j; a cycle is fine): an estimated i -> j is right when the reference has i -> j.
    Undirected estimated edges are neither right nor wrong (they count in no denominator but the reference's); with
    no directed edge at all the precision (and F1) is undefined: NaN, not a perfect score."""
    if reference.shape != est.shape:
        raise ValueError(f"oriented_scores: graphs of different sizes {reference.shape} and {est.shape}")
    directed = (est.T == 1) & (est == -1)          # est[j, i] = 1 and est[i, j] = -1: i -> j
    right = int(np.sum(directed & reference.astype(bool)))
    n_est, n_ref = int(directed.sum()), int(reference.astype(bool).sum())
    precision = right / n_est if n_est else float("nan")
    recall = right / n_ref if n_ref else 1.0
    f1 = 2 * precision * recall / (precision + recall) if n_est and precision + recall else float("nan")
    return {"precision": precision, "recall": recall, "f1": f1, "right": right, "directed": n_est}
