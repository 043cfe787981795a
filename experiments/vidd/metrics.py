"""What is measured on a set of generated samples (reward statistics, validity, uniqueness, diversity), and where the
samples go (run_dir/data/samples, Parquet, one row per sample with the method name as a string column)."""
from __future__ import annotations

import numpy as np


def reward_stats(rewards: np.ndarray) -> dict[str, float]:
    r = np.sort(np.asarray(rewards, dtype=np.float64))
    top = r[-max(1, len(r) // 10):]
    return {"reward_mean": float(r.mean()), "reward_median": float(np.median(r)), "reward_top10": float(top.mean())}


def set_metrics(task: str, sequences: list[str]) -> dict[str, float]:
    """Validity, uniqueness (among valid) and diversity (molecules: mean pairwise Tanimoto distance of Morgan
    fingerprints; sequences: mean pairwise normalized Hamming distance) of a set of generated samples."""
    n = max(len(sequences), 1)
    if task == "molecule":
        from rdkit import Chem

        from envs.bio.molecules import parse_molecule, tanimoto_diversity
        mols = [parse_molecule(s) for s in sequences]
        valid = [m for m in mols if m is not None]
        unique = {Chem.MolToSmiles(m) for m in valid}
        diversity = tanimoto_diversity(valid) if len(valid) > 1 else float("nan")
    else:
        from envs.bio.protein import hamming_diversity
        valid = [s for s in sequences if s]
        unique = set(valid)
        diversity = hamming_diversity(valid) if len(valid) > 1 else float("nan")
    return {"validity": len(valid) / n, "uniqueness": len(unique) / max(len(valid), 1), "diversity": diversity}


def write_samples(store, columns: dict, method: str, iteration: int, queries: int, seed: int) -> None:
    n = len(columns["sequence"])
    store.append({"method": [method] * n, "iteration": np.full(n, iteration), "queries": np.full(n, queries),
                  "seed": np.full(n, seed), **columns})
