"""Synthetic DNA enhancer task: 200-bp sequences and a liver-TF **motif proxy** reward.

There is no MPRA data offline, so this is a transparent stand-in for the paper's HepG2 task, not
a model of enhancer activity:

* Corpus: a second-order background Markov chain (GC ~ 42 %, CpG-depleted) with binding sites of four
  liver transcription factors (HNF4A, HNF1A, FOXA2, CEBPB) planted at a fixed per-sequence rate,
  sampled from their JASPAR position frequency matrices on a random strand.
* Reward, ``kind="best"``: for each TF the best relative log-odds score over positions and both strands (1 = the
  consensus site, 0 = the worst possible site), averaged over the TFs. It saturates: 200 bp of background alone
  score ~0.81 and the corpus ~0.85, so it leaves fine-tuning little room.
* Reward, ``kind="sites"`` (with room): for each TF a soft count ``c`` of strong sites (windows on either strand whose
  relative score passes ``site_threshold``, through a sigmoid of width ``site_temperature``), mapped to
  ``1 - exp(-c / sites_scale)``, averaged over the TFs: 0 without sites, -> 1 with several strong sites of every TF.
  The corpus scores ~0.15; a site-packed sequence approaches 1.
* The training oracle uses the JASPAR2024 matrices; an evaluation oracle with the JASPAR2022 matrix versions (other
  widths and counts for all four TFs) is a second, related but different proxy (compare them to spot reward hacking).

JASPAR matrices come from the SQLite files shipped inside the ``pyjaspar`` wheel (no downloads).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from envs.bio.sequences import Vocab, as_token_rows, is_string_batch

log = logging.getLogger(__name__)

DNA_VOCAB = Vocab(("A", "C", "G", "T"))
LIVER_TFS: dict[str, str] = {"HNF4A": "MA0114", "HNF1A": "MA0046", "FOXA2": "MA0047", "CEBPB": "MA0466"}
TRAIN_RELEASE = "JASPAR2024"
EVAL_RELEASE = "JASPAR2022"


# --------------------------------------------------------------------------------------------------
# JASPAR matrices
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def load_liver_pfms(release: str = TRAIN_RELEASE, pseudocount: float = 0.5) -> dict[str, np.ndarray]:
    """Position frequency matrices ``[4, width]`` (rows A, C, G, T; columns sum to 1) of the liver TFs.

    Each base id (e.g. ``MA0114``) resolves to its latest matrix version within ``release``.
    """
    from pyjaspar import jaspardb  # imported lazily: opening the SQLite file costs ~0.1 s

    db = jaspardb(release=release)
    pfms = {}
    for name, base_id in LIVER_TFS.items():
        motif = db.fetch_motif_by_id(base_id)
        if motif is None:
            raise ValueError(f"{release} has no matrix {base_id} ({name})")
        counts = np.array([motif.counts[base] for base in "ACGT"], dtype=np.float64) + pseudocount
        pfms[name] = counts / counts.sum(axis=0, keepdims=True)
        log.debug("%s %s: %s width %d", release, name, motif.matrix_id, counts.shape[1])
    return pfms


def log_odds(pfm: np.ndarray, background: Sequence[float] = (0.25, 0.25, 0.25, 0.25)) -> np.ndarray:
    """Position weight matrix ``log2(p / background)``, ``[4, width]``."""
    return np.log2(pfm / np.asarray(background, dtype=np.float64)[:, None])


def reverse_complement_matrix(matrix: np.ndarray) -> np.ndarray:
    """The matrix scanning the opposite strand: reverse the columns, swap A<->T and C<->G."""
    return matrix[::-1, ::-1].copy()


# --------------------------------------------------------------------------------------------------
# Corpus generator
# --------------------------------------------------------------------------------------------------


def background_transition_matrix(gc: float = 0.42, cpg_depletion: float = 0.25, seed: int = 0) -> np.ndarray:
    """``P(x_i | x_{i-2}, x_{i-1})`` as ``[16, 4]``: GC-biased, CpG-depleted, mildly context-dependent."""
    rng = np.random.default_rng(seed)
    base = np.array([(1 - gc) / 2, gc / 2, gc / 2, (1 - gc) / 2])
    table = np.empty((16, 4))
    for context in range(16):
        probs = base * rng.dirichlet(np.full(4, 50.0)) * 4
        if context % 4 == 1:  # previous base is C: deplete the following G (CpG)
            probs[2] *= cpg_depletion
        table[context] = probs / probs.sum()
    return table


def generate_dna_corpus(
    n: int,
    length: int = 200,
    motif_rate: float = 0.25,
    seed: int = 0,
    release: str = TRAIN_RELEASE,
) -> list[str]:
    """``n`` background sequences, each carrying a site of each liver TF with probability ``motif_rate``."""
    if n < 1 or length < 20:
        raise ValueError(f"need n >= 1 and length >= 20, got n={n}, length={length}")
    if not 0.0 <= motif_rate <= 1.0:
        raise ValueError(f"motif_rate must lie in [0, 1], got {motif_rate}")
    rng = np.random.default_rng(seed)
    table = background_transition_matrix()
    cumulative = table.cumsum(axis=1)
    seqs = np.empty((n, length), dtype=np.int64)
    seqs[:, :2] = rng.integers(0, 4, size=(n, 2))
    uniforms = rng.random((n, length))
    for i in range(2, length):
        context = seqs[:, i - 2] * 4 + seqs[:, i - 1]
        seqs[:, i] = (uniforms[:, i, None] > cumulative[context]).sum(axis=1).clip(max=3)
    for pfm in load_liver_pfms(release).values():
        width = pfm.shape[1]
        carriers = np.flatnonzero(rng.random(n) < motif_rate)
        draws = rng.random((len(carriers), width, 1))
        sites = (draws > pfm.T.cumsum(axis=1)[None]).sum(axis=2).clip(max=3)
        reverse = rng.random(len(carriers)) < 0.5
        sites[reverse] = 3 - sites[reverse, ::-1]  # reverse complement in A, C, G, T order
        starts = rng.integers(0, length - width + 1, size=len(carriers))
        for row, start, site in zip(carriers, starts, sites):
            seqs[row, start : start + width] = site
    return ["".join("ACGT"[b] for b in row) for row in seqs]


def dna_to_tokens(seqs: Sequence[str]) -> Tensor:
    """``[N, L]`` tokens of equal-length DNA strings."""
    lengths = {len(s) for s in seqs}
    if len(lengths) != 1:
        raise ValueError(f"DNA sequences must share one length, got lengths {sorted(lengths)[:5]}")
    return DNA_VOCAB.encode_batch([list(s.upper()) for s in seqs], lengths.pop())


def tokens_to_dna(tokens: Tensor | Sequence) -> list[str]:
    return ["".join(DNA_VOCAB.decode(row)) for row in as_token_rows(tokens)]


# --------------------------------------------------------------------------------------------------
# Reward oracle
# --------------------------------------------------------------------------------------------------


@dataclass
class MotifProxyReward:
    """Liver-TF motif proxy: mean over TFs of the best relative PWM score over positions and strands.

    Call with ``[B, L]`` tokens, a list of token rows or a list of DNA strings. Returns
    ``(rewards in [0, 1] as float64 [B], info)``; rows with non-ACGT symbols or shorter than the widest
    motif get ``floor`` and are counted in ``info['n_invalid']``. Not a model of HepG2 activity.
    """

    release: str = TRAIN_RELEASE
    floor: float = 0.0
    kind: str = "best"  # "best": best relative site score per TF; "sites": soft count of strong sites per TF
    site_threshold: float = 0.9  # relative score of a strong site (background: ~0.1 such windows per TF per 200 bp)
    site_temperature: float = 0.02
    sites_scale: float = 2.0

    def __post_init__(self) -> None:
        if self.kind not in ("best", "sites"):
            raise ValueError(f"MotifProxyReward.kind must be 'best' or 'sites', got {self.kind!r}")
        if self.site_temperature <= 0 or self.sites_scale <= 0:
            raise ValueError("MotifProxyReward.site_temperature and sites_scale must be > 0")
        self._filters: list[tuple[Tensor, float, float]] | None = None

    def _motif_filters(self) -> list[tuple[Tensor, float, float]]:
        """``(conv weight [2, 4, width], min score, max score)`` per TF; both strands in one conv."""
        if self._filters is None:
            self._filters = []
            for pfm in load_liver_pfms(self.release).values():
                pwm = log_odds(pfm)
                weight = torch.tensor(np.stack([pwm, reverse_complement_matrix(pwm)]), dtype=torch.float32)
                self._filters.append((weight, float(pwm.min(axis=0).sum()), float(pwm.max(axis=0).sum())))
        return self._filters

    def __getstate__(self) -> dict:  # ship the config, not the cached tensors
        return {"release": self.release, "floor": self.floor, "kind": self.kind, "site_threshold": self.site_threshold,
                "site_temperature": self.site_temperature, "sites_scale": self.sites_scale}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def per_tf_scores(self, onehot: Tensor) -> Tensor:
        """Per TF, ``[B, n_tfs]``, for one-hot input ``[B, 4, L]``: the best relative score (``best``) or the
        saturating soft count of strong sites (``sites``)."""
        scores = []
        for weight, lo, hi in self._motif_filters():
            relative = (F.conv1d(onehot, weight) - lo) / (hi - lo)  # [B, 2 strands, windows]
            if self.kind == "best":
                scores.append(relative.amax(dim=(1, 2)))
            else:
                count = torch.sigmoid((relative - self.site_threshold) / self.site_temperature).sum(dim=(1, 2))
                scores.append(1.0 - torch.exp(-count / self.sites_scale))
        return torch.stack(scores, dim=1)

    def __call__(self, batch: Tensor | Sequence) -> tuple[np.ndarray, dict]:
        rows = ([None if s is None else list(s.upper()) for s in batch] if is_string_batch(batch)
                else as_token_rows(batch))
        index = {b: i for i, b in enumerate("ACGT")}
        rewards = np.full(len(rows), self.floor, dtype=np.float64)
        info = {"n_queries": len(rows), "n_valid": 0, "n_invalid": 0}
        min_width = max(f[0].shape[-1] for f in self._motif_filters())
        ids, keep = [], []
        for i, row in enumerate(rows):
            try:
                encoded = None if row is None else [index[b] if isinstance(b, str) else int(b) for b in row]
            except KeyError:
                encoded = None
            if encoded is None or len(encoded) < min_width or not all(0 <= b < 4 for b in encoded):
                info["n_invalid"] += 1
                continue
            ids.append(encoded)
            keep.append(i)
        # equal lengths are the norm; group by length so ragged string batches also work
        for length in sorted({len(r) for r in ids}):
            members = [j for j, r in enumerate(ids) if len(r) == length]
            onehot = F.one_hot(torch.tensor([ids[j] for j in members]), 4).float().transpose(1, 2)
            values = self.per_tf_scores(onehot).mean(dim=1).numpy()
            rewards[[keep[j] for j in members]] = values
        info["n_valid"] = len(keep)
        return rewards, info


# --------------------------------------------------------------------------------------------------
# Naturalness metrics
# --------------------------------------------------------------------------------------------------


def kmer_frequencies(seqs: Sequence[str], k: int = 3) -> np.ndarray:
    """Normalized counts of all ``4**k`` k-mers (ACGT only) over a set of sequences."""
    index = {b: i for i, b in enumerate("ACGT")}
    counts = np.zeros(4**k)
    for s in seqs:
        codes = [index.get(b, -1) for b in s.upper()]
        for i in range(len(codes) - k + 1):
            window = codes[i : i + k]
            if min(window) < 0:
                continue
            counts[sum(c * 4 ** (k - 1 - j) for j, c in enumerate(window))] += 1
    total = counts.sum()
    return counts / total if total else counts


def kmer_correlation(generated: Sequence[str], reference: Sequence[str], k: int = 3) -> float:
    """Pearson correlation of k-mer frequencies (the paper's 3-mer naturalness metric)."""
    return float(np.corrcoef(kmer_frequencies(generated, k), kmer_frequencies(reference, k))[0, 1])


def gc_content(seqs: Sequence[str]) -> float:
    total = sum(len(s) for s in seqs)
    return sum(s.upper().count("G") + s.upper().count("C") for s in seqs) / total if total else float("nan")
