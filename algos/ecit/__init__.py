"""E-CIT (efficient ensemble conditional independence test): subset tests combined by a stable-law combination.

Pure numpy/scipy; the base tests come from causal-learn. Entry point: :func:`ecit_pvalue`.
"""
from algos.ecit.base import BASES, KCI_WIDTHS, RELEASED_WIDTH, base_pvalue, width_options
from algos.ecit.combine import COMBINERS, combine, stable_cdf, stable_quantile
from algos.ecit.ecit import ecit_pvalue, subset_pvalue, subset_seeds
from algos.ecit.partition import num_subsets, partition

__all__ = ["BASES", "COMBINERS", "KCI_WIDTHS", "RELEASED_WIDTH", "base_pvalue", "combine", "ecit_pvalue", "num_subsets",
           "partition", "stable_cdf", "stable_quantile", "subset_pvalue", "subset_seeds", "width_options"]
