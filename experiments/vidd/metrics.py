"""What is measured on a set of generated samples (reward statistics, validity, uniqueness, diversity), and where the
samples go (run_dir/data/samples, Parquet, one row per sample with the method name as a string column)."""
from __future__ import annotations

from typing import Callable

import numpy as np


def reward_stats(rewards: np.ndarray) -> dict[str, float]:
    """Mean, median and top-10 % mean of the finite rewards (a NaN: a non-finite oracle answer, left out and
    counted in ``reward_nonfinite``)."""
    r = np.asarray(rewards, dtype=np.float64)
    finite = np.sort(r[np.isfinite(r)])
    if not len(finite):
        return {"reward_mean": float("nan"), "reward_median": float("nan"), "reward_top10": float("nan"),
                "reward_nonfinite": float(len(r))}
    top = finite[-max(1, len(finite) // 10):]
    return {"reward_mean": float(finite.mean()), "reward_median": float(np.median(finite)),
            "reward_top10": float(top.mean()), "reward_nonfinite": float(len(r) - len(finite))}


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


def dna_protocol_metrics(n_train: int, n_heldout: int, seq_len: int, seed: int, release: str,
                         reward: str) -> Callable[[list[str]], dict[str, float]]:
    """The DNA protocol's extra metrics of a sample set: the held-out evaluation oracle (another JASPAR release,
    never queried in training) and the 3-mer correlation with the corpus's held-out sequences (regenerated from the
    run's seed, the same as the pretraining split)."""
    from envs.bio.dna import MotifProxyReward, generate_dna_corpus, kmer_correlation
    reference = generate_dna_corpus(n_train + n_heldout, seq_len, seed=seed)[n_train:]
    oracle = MotifProxyReward(release=release, kind="sites" if reward == "motif_sites" else "best")

    def metrics(sequences: list[str]) -> dict[str, float]:
        held_out, _ = oracle([s or None for s in sequences])
        valid = [s for s in sequences if s]
        return {"heldout_reward_median": float(np.median(held_out)) if len(held_out) else float("nan"),
                "kmer3_corr": kmer_correlation(valid, reference) if valid else float("nan")}
    return metrics


def task_metrics(exp, seed: int) -> Callable[[list[str]], dict[str, float]] | None:
    """The extra evaluation metrics of ``exp``'s task (``exp``: the experiment's Config), or None."""
    if exp.task != "dna":
        return None
    return dna_protocol_metrics(exp.n_train, exp.n_heldout, exp.seq_len, seed, exp.dna_eval_release, exp.reward)
