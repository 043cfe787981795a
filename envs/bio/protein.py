"""Protein task (a toy): sequences from a user FASTA file and a beta-sheet **propensity proxy** reward.

No protein dataset or structure predictor is available offline, so the reward is Biopython's
``ProteinAnalysis.secondary_structure_fraction()[2]``: the fraction of residues in {V, I, Y, F, W, L},
a composition statistic loosely associated with beta strands. It is not a structure prediction and
is trivially gamed by composition; use it to exercise the pipeline, not to claim protein design.

Sequences use the 20 standard amino acids, right-padded with ``<pad>`` to a fixed length.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np
from Bio import SeqIO
from Bio.SeqUtils.ProtParam import ProteinAnalysis
from torch import Tensor

from envs.bio.sequences import Vocab, as_token_rows, is_string_batch

log = logging.getLogger(__name__)

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
PAD = "<pad>"
PROTEIN_VOCAB = Vocab(tuple(AMINO_ACIDS) + (PAD,), pad=PAD)
# UniProt-like background frequencies, used only by the synthetic FASTA writer
_BACKGROUND = np.array([8.3, 1.4, 5.5, 6.8, 3.9, 7.1, 2.3, 5.9, 5.8, 9.7,
                        2.4, 4.1, 4.7, 3.9, 5.5, 6.6, 5.3, 6.9, 1.1, 2.9])


# --------------------------------------------------------------------------------------------------
# FASTA input
# --------------------------------------------------------------------------------------------------


def read_fasta(path: str | Path) -> list[str]:
    """Protein sequences of a FASTA file, upper-cased; raises a clear error for bad input.

    ``FileNotFoundError`` if the path does not exist; ``ValueError`` if the file has no records, a record
    is empty, or a record contains anything other than the 20 standard amino acids (named in the error).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"FASTA file not found: {path}")
    try:
        records = list(SeqIO.parse(str(path), "fasta"))
    except Exception as err:  # Biopython raises ValueError/UnicodeDecodeError on malformed files
        raise ValueError(f"{path} is not a readable FASTA file: {err}") from err
    if not records:
        raise ValueError(f"{path} contains no FASTA records (is it empty or not FASTA?)")
    allowed = set(AMINO_ACIDS)
    seqs = []
    for record in records:
        seq = str(record.seq).upper().rstrip("*")
        if not seq:
            raise ValueError(f"{path}: record {record.id!r} has an empty sequence")
        bad = sorted(set(seq) - allowed)
        if bad:
            raise ValueError(f"{path}: record {record.id!r} contains non-standard residues {bad}")
        seqs.append(seq)
    return seqs


def write_synthetic_fasta(
    path: str | Path, n: int = 64, min_len: int = 30, max_len: int = 60, seed: int = 0
) -> Path:
    """Write ``n`` random sequences with background amino-acid frequencies (for tests and demos)."""
    if n < 1 or not 1 <= min_len <= max_len:
        raise ValueError(f"need n >= 1 and 1 <= min_len <= max_len, got {n}, {min_len}, {max_len}")
    rng = np.random.default_rng(seed)
    probs = _BACKGROUND / _BACKGROUND.sum()
    path = Path(path)
    with path.open("w") as handle:
        for i in range(n):
            length = int(rng.integers(min_len, max_len + 1))
            seq = "".join(rng.choice(list(AMINO_ACIDS), size=length, p=probs))
            handle.write(f">synthetic_{i}\n{seq}\n")
    return path


def protein_tokens(seqs: Sequence[str], max_len: int) -> Tensor:
    """``[N, max_len]`` padded tokens; sequences longer than ``max_len`` raise (filter them first)."""
    too_long = [len(s) for s in seqs if len(s) > max_len]
    if too_long:
        raise ValueError(f"{len(too_long)} sequences exceed max_len={max_len} (longest {max(too_long)})")
    return PROTEIN_VOCAB.encode_batch([list(s) for s in seqs], max_len)


def tokens_to_protein(tokens: Tensor | Sequence) -> list[str]:
    return ["".join(PROTEIN_VOCAB.decode(row)) for row in as_token_rows(tokens)]


# --------------------------------------------------------------------------------------------------
# Reward oracle and metrics
# --------------------------------------------------------------------------------------------------


class BetaSheetProxyReward:
    """Sequence-level beta-sheet propensity proxy (ProtParam sheet fraction), in [0, 1].

    Call with ``[B, L]`` tokens, token rows or amino-acid strings. Empty sequences (all padding) and
    strings with non-standard residues get ``floor`` and are counted; failures never raise.
    """

    def __init__(self, floor: float = 0.0) -> None:
        self.floor = floor

    def __call__(self, batch: Tensor | Sequence) -> tuple[np.ndarray, dict]:
        info = {"n_queries": len(batch), "n_valid": 0, "n_empty": 0, "n_invalid": 0, "n_errors": 0}
        if is_string_batch(batch):
            seqs = [None if s is None else s.upper() for s in batch]
        else:
            seqs = []
            for row in as_token_rows(batch):
                try:
                    seqs.append("".join(PROTEIN_VOCAB.decode(row)))
                except ValueError:
                    seqs.append(None)
        rewards = np.full(len(seqs), self.floor, dtype=np.float64)
        allowed = set(AMINO_ACIDS)
        for i, seq in enumerate(seqs):
            if seq is None or not set(seq) <= allowed:
                info["n_invalid"] += 1
            elif not seq:
                info["n_empty"] += 1
            else:
                try:
                    rewards[i] = ProteinAnalysis(seq).secondary_structure_fraction()[2]
                    info["n_valid"] += 1
                except Exception as err:
                    log.debug("ProtParam failed on %s: %s", seq, err)
                    info["n_errors"] += 1
        return rewards, info


def hamming_diversity(seqs: Sequence[str]) -> float:
    """Mean pairwise normalized Hamming distance, comparing position by position over the longer length."""
    if len(seqs) < 2:
        return float("nan")
    total, pairs = 0.0, 0
    for i in range(len(seqs)):
        for j in range(i):
            a, b = seqs[i], seqs[j]
            longest = max(len(a), len(b), 1)
            same = sum(x == y for x, y in zip(a, b))
            total += 1.0 - same / longest
            pairs += 1
    return total / pairs
