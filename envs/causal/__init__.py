"""Data with known causal truth for conditional independence tests and causal discovery.

- ``sem``: random DAGs and linear-Gaussian or nonlinear structural equation models on them (seeded).
- ``triplets``: one CI question X _||_ Y | Z, null (no edge X -> Y) or alternative (an edge), any n.
- ``sachs``: the Sachs et al. (2005) protein-signalling flow-cytometry data and its consensus graph, read from the
  ``cdt`` wheel (the package ships the CSV; nothing is downloaded).
- ``datasets``: a JSON-able spec (kind + seed, or a path) -> the same arrays in any process, so pool requests carry
  the spec and never the arrays.
"""
from envs.causal.datasets import Dataset, make_dataset
from envs.causal.sem import random_dag, sample_sem
from envs.causal.triplets import ci_triplet

__all__ = ["Dataset", "ci_triplet", "make_dataset", "random_dag", "sample_sem"]
