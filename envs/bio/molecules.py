"""Small-molecule task: MOSES SMILES as SELFIES tokens, RDKit reward oracles and sample metrics.

Data: the MOSES training/test SMILES shipped in the ``molsets`` wheel (install with
``pip install --no-deps molsets``; the ``moses`` package itself is never imported because its pinned
dependencies do not build on Python 3.11). Molecules are SELFIES token sequences right-padded to a
fixed length, so every generated row decodes to *some* molecule (possibly empty).

Rewards (RDKit): QED, synthetic accessibility (Ertl & Schuffenhauer SA score from RDKit Contrib,
mapped to ``(10 - SA) / 9`` so that higher is better) and the composite ``QED - w (SA - 1) / 9``.
Empty, unparsable or failing molecules receive a floor reward and are counted; an oracle never raises
on a bad molecule. String input is SMILES or SELFIES (:func:`molecule_string_to_smiles`: a SELFIES string is
decoded, not misread as SMILES; a string that is valid both ways with different molecules raises a clear error).
"""

from __future__ import annotations

import gzip
import importlib.metadata
import itertools
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
import selfies as sf
from rdkit import Chem, DataStructs, RDConfig, RDLogger
from rdkit.Chem import QED, rdFingerprintGenerator
from torch import Tensor

from envs.bio.sequences import Vocab, as_token_rows, build_vocab, is_string_batch

log = logging.getLogger(__name__)

MOSES_FILES = {"train": "train.csv.gz", "test": "test.csv.gz", "test_scaffolds": "test_scaffolds.csv.gz"}
PAD = "[nop]"  # SELFIES' own no-operation symbol: decoders skip it, so padding is harmless


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


def moses_csv_path(split: str = "train") -> Path:
    """Path of a MOSES split inside the installed ``molsets`` distribution."""
    if split not in MOSES_FILES:
        raise ValueError(f"split must be one of {sorted(MOSES_FILES)}, got {split!r}")
    try:
        dist = importlib.metadata.distribution("molsets")
    except importlib.metadata.PackageNotFoundError as err:
        raise FileNotFoundError(
            "MOSES data needs the 'molsets' wheel: pip install --no-deps molsets"
        ) from err
    path = Path(dist.locate_file(f"moses/dataset/data/{MOSES_FILES[split]}"))
    if not path.is_file():
        raise FileNotFoundError(f"molsets is installed but {path} is missing")
    return path


def load_moses_smiles(n: int, split: str = "train", skip: int = 0) -> list[str]:
    """The ``n`` SMILES after the first ``skip`` of a MOSES split (the files are already shuffled)."""
    with gzip.open(moses_csv_path(split), "rt") as handle:
        header = next(handle).strip()
        if header != "SMILES":
            raise ValueError(f"unexpected MOSES header {header!r}")
        return [line.strip() for line in itertools.islice(handle, skip, skip + n)]


def smiles_to_selfies_symbols(smiles: str) -> list[str] | None:
    """SELFIES symbols of a SMILES string, or ``None`` if it cannot be encoded."""
    try:
        return list(sf.split_selfies(sf.encoder(smiles)))
    except Exception:  # selfies raises EncoderError and assorted RDKit-independent errors
        return None


@dataclass
class MoleculeData:
    vocab: Vocab
    seq_len: int
    train_tokens: Tensor
    heldout_tokens: Tensor
    train_smiles: list[str]
    heldout_smiles: list[str]


def make_molecule_dataset(
    n_train: int = 5000, n_heldout: int = 500, max_len: int = 40, heldout_split: str = "test"
) -> MoleculeData:
    """Tokenised MOSES subset: molecules with more than ``max_len`` SELFIES symbols are dropped.

    The vocabulary comes from the training molecules; held-out molecules with unseen symbols are
    dropped (rare). Held-out molecules come from a different MOSES split.
    """
    if n_train < 1 or n_heldout < 1 or max_len < 2:
        raise ValueError(f"need n_train, n_heldout >= 1 and max_len >= 2, got {n_train}, {n_heldout}, {max_len}")

    def tokenise(smiles: list[str], vocab: Vocab | None) -> tuple[list[list[str]], list[str]]:
        kept_symbols, kept_smiles = [], []
        for s in smiles:
            symbols = smiles_to_selfies_symbols(s)
            if symbols is None or not 0 < len(symbols) <= max_len:
                continue
            if vocab is not None and any(sym not in vocab.symbols for sym in symbols):
                continue
            kept_symbols.append(symbols)
            kept_smiles.append(s)
        return kept_symbols, kept_smiles

    train_symbols, train_smiles = tokenise(load_moses_smiles(n_train, "train"), None)
    vocab = build_vocab(train_symbols, pad=PAD)
    heldout_symbols, heldout_smiles = tokenise(load_moses_smiles(n_heldout, heldout_split), vocab)
    log.info("molecule data: %d train, %d held-out, vocab %d", len(train_smiles), len(heldout_smiles), vocab.size)
    return MoleculeData(
        vocab=vocab,
        seq_len=max_len,
        train_tokens=vocab.encode_batch(train_symbols, max_len),
        heldout_tokens=vocab.encode_batch(heldout_symbols, max_len),
        train_smiles=train_smiles,
        heldout_smiles=heldout_smiles,
    )


# --------------------------------------------------------------------------------------------------
# Decoding and chemistry
# --------------------------------------------------------------------------------------------------


def tokens_to_smiles(tokens: Tensor | Sequence, vocab: Vocab) -> list[str | None]:
    """SMILES of each token row ("" for an empty molecule, ``None`` when decoding fails)."""
    out: list[str | None] = []
    for row in as_token_rows(tokens):
        try:
            out.append(sf.decoder("".join(vocab.decode(row))))
        except Exception:
            out.append(None)
    return out


_ALL_BRACKETED = re.compile(r"^(\[[^\[\]]+\])+$")  # a SELFIES string has nothing outside [symbols]
InputFormat = Literal["auto", "smiles", "selfies"]


def selfies_to_smiles(text: str) -> str | None:
    """SMILES of a SELFIES string, or ``None`` when it does not decode."""
    try:
        return sf.decoder(text)
    except Exception:  # selfies' DecoderError and friends
        return None


def molecule_string_to_smiles(text: str | None, input_format: InputFormat = "auto") -> str | None:
    """SMILES of a molecule given as SMILES or SELFIES (``None`` stays ``None``: a failed molecule).

    ``auto``: a string with anything outside square brackets is SMILES. An all-bracketed string is read both ways:
    if only one reading parses, that one; if both give the same molecule (``[Na+]``, ``[13CH4]``), that molecule;
    if they differ (``[C][C][O]``: ethanol as SELFIES, a carbon-radical chain as SMILES) it raises a ``ValueError``
    asking for ``input_format``, rather than silently scoring the wrong molecule.
    """
    if text is None or input_format == "smiles":
        return text
    if input_format == "selfies":
        return selfies_to_smiles(text)
    if input_format != "auto":
        raise ValueError(f"input_format must be 'auto', 'smiles' or 'selfies', got {input_format!r}")
    if not _ALL_BRACKETED.match(text):
        return text
    as_smiles, decoded = parse_molecule(text), selfies_to_smiles(text)
    as_selfies = parse_molecule(decoded)
    if as_smiles is None or as_selfies is None:
        return decoded if as_smiles is None and decoded else text
    if Chem.MolToSmiles(as_smiles) == Chem.MolToSmiles(as_selfies):
        return text
    raise ValueError(f"molecule string {text!r} is ambiguous: as SMILES it is {Chem.MolToSmiles(as_smiles)!r}, as "
                     f"SELFIES {decoded!r}; pass MoleculeReward(input_format='smiles' or 'selfies')")


def parse_molecule(smiles: str | None) -> Chem.Mol | None:
    """RDKit molecule, or ``None`` for failed, empty or unparsable SMILES."""
    if not smiles:
        return None
    with _quiet_rdkit():
        mol = Chem.MolFromSmiles(smiles)
    return mol if mol is not None and mol.GetNumAtoms() > 0 else None


class _quiet_rdkit:
    """RDKit prints a warning per bad molecule; rewards see thousands of them."""

    def __enter__(self) -> None:
        RDLogger.DisableLog("rdApp.*")

    def __exit__(self, *exc) -> None:
        RDLogger.EnableLog("rdApp.*")


_SASCORER = None


def _sascorer():
    """RDKit's Contrib SA scorer, imported on first use (it loads a fragment table)."""
    global _SASCORER
    if _SASCORER is None:
        path = os.path.join(RDConfig.RDContribDir, "SA_Score")
        if path not in sys.path:
            sys.path.append(path)
        import sascorer  # type: ignore[import-not-found]

        _SASCORER = sascorer
    return _SASCORER


def qed_score(mol: Chem.Mol) -> float:
    return float(QED.qed(mol))


def sa_score(mol: Chem.Mol) -> float:
    """Synthetic accessibility, 1 (easy) .. 10 (hard)."""
    return float(_sascorer().calculateScore(mol))


# --------------------------------------------------------------------------------------------------
# Reward oracle
# --------------------------------------------------------------------------------------------------

RewardKind = Literal["qed", "sa", "composite"]


@dataclass
class MoleculeReward:
    """Batched RDKit reward: ``reward(tokens [B, L] | list of token rows | list of SMILES/SELFIES strings or None)``.

    Returns ``(rewards float64 [B], info)`` with ``info`` counting ``n_queries``, ``n_valid``,
    ``n_empty`` (decoded to no atoms), ``n_invalid`` (RDKit could not parse) and ``n_errors``
    (decoding or scoring raised, or the string was ``None``). Cheap to construct and picklable, so pool workers can
    build one each. Strings are read by :func:`molecule_string_to_smiles` with ``input_format``.
    """

    vocab: Vocab | None = None
    kind: RewardKind = "qed"
    sa_weight: float = 0.5  # composite = QED - sa_weight * (SA - 1) / 9
    floor: float | None = None  # reward of invalid molecules; default: the kind's minimum
    input_format: InputFormat = "auto"  # how string input is read: auto | smiles | selfies

    def __post_init__(self) -> None:
        if self.kind not in ("qed", "sa", "composite"):
            raise ValueError(f"MoleculeReward.kind must be 'qed', 'sa' or 'composite', got {self.kind!r}")
        if self.sa_weight < 0:
            raise ValueError(f"MoleculeReward.sa_weight must be >= 0, got {self.sa_weight}")
        if self.input_format not in ("auto", "smiles", "selfies"):
            raise ValueError(f"MoleculeReward.input_format must be auto, smiles or selfies, got {self.input_format!r}")
        if self.floor is None:
            self.floor = -self.sa_weight if self.kind == "composite" else 0.0

    def score(self, mol: Chem.Mol) -> float:
        if self.kind == "qed":
            return qed_score(mol)
        if self.kind == "sa":
            return (10.0 - sa_score(mol)) / 9.0
        return qed_score(mol) - self.sa_weight * (sa_score(mol) - 1.0) / 9.0

    def __call__(self, batch: Tensor | Sequence) -> tuple[np.ndarray, dict]:
        if is_string_batch(batch):
            smiles = [molecule_string_to_smiles(s, self.input_format) for s in batch]
        else:
            if self.vocab is None:
                raise ValueError("MoleculeReward got token ids but was built without a vocab")
            smiles = tokens_to_smiles(batch, self.vocab)
        rewards = np.full(len(smiles), self.floor, dtype=np.float64)
        info = {"n_queries": len(smiles), "n_valid": 0, "n_empty": 0, "n_invalid": 0, "n_errors": 0}
        for i, s in enumerate(smiles):
            if s is None:
                info["n_errors"] += 1
                continue
            if s == "":
                info["n_empty"] += 1
                continue
            mol = parse_molecule(s)
            if mol is None:
                info["n_invalid"] += 1
                continue
            try:
                rewards[i] = self.score(mol)
                info["n_valid"] += 1
            except Exception as err:  # a reward oracle must never take a run down
                log.debug("reward failed for %s: %s", s, err)
                info["n_errors"] += 1
        return rewards, info


# --------------------------------------------------------------------------------------------------
# Sample metrics
# --------------------------------------------------------------------------------------------------


def tanimoto_diversity(mols: Sequence[Chem.Mol], radius: int = 2, n_bits: int = 2048) -> float:
    """Mean pairwise Tanimoto distance of Morgan fingerprints (MOSES IntDiv_1); NaN below 2 molecules."""
    if len(mols) < 2:
        return float("nan")
    generator = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=n_bits)
    fps = [generator.GetFingerprint(m) for m in mols]
    total, pairs = 0.0, 0
    for i in range(1, len(fps)):
        sims = DataStructs.BulkTanimotoSimilarity(fps[i], fps[:i])
        total += len(sims) - sum(sims)
        pairs += len(sims)
    return total / pairs


def molecule_metrics(smiles: Sequence[str | None]) -> dict:
    """Validity, uniqueness, diversity, QED (median and top-10% mean over all samples, invalid = 0) and
    SA (median over valid molecules) of generated molecules."""
    mols = [parse_molecule(s) for s in smiles]
    valid = [m for m in mols if m is not None]
    n = max(len(smiles), 1)
    metrics = {"validity": len(valid) / n, "n_samples": len(smiles)}
    if not valid:
        return metrics | {"uniqueness": 0.0, "diversity": float("nan"), "qed_median": 0.0,
                          "qed_top10_mean": 0.0, "sa_median": float("nan")}
    canonical = {Chem.MolToSmiles(m) for m in valid}
    # invalid molecules count as QED 0 so that a method cannot raise the median by failing to decode
    qeds = np.sort([qed_score(m) for m in valid] + [0.0] * (len(smiles) - len(valid)))
    top = qeds[-max(1, len(qeds) // 10):]
    sas = []
    for m in valid:
        try:
            sas.append(sa_score(m))
        except Exception:
            continue
    metrics.update(
        uniqueness=len(canonical) / len(valid),
        diversity=tanimoto_diversity(valid),
        qed_median=float(np.median(qeds)),
        qed_top10_mean=float(top.mean()),
        sa_median=float(np.median(sas)) if sas else float("nan"),
    )
    return metrics
