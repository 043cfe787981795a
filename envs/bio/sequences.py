"""Token vocabularies shared by the molecule (SELFIES), DNA and protein tasks.

A :class:`Vocab` maps symbols to ids ``0 .. size - 1``. Diffusion models add their own mask id
(``size``) on top, so a vocabulary never contains a mask symbol. Variable-length data is right-padded
with the vocabulary's pad symbol, which the model learns to generate like any other token; decoding
drops pad symbols wherever they appear so that every generated row maps to a sequence.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch
from torch import Tensor


@dataclass(frozen=True)
class Vocab:
    symbols: tuple[str, ...]
    pad: str | None = None
    _index: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.symbols) < 2:
            raise ValueError(f"Vocab.symbols needs at least 2 symbols, got {len(self.symbols)}")
        if len(set(self.symbols)) != len(self.symbols):
            duplicates = sorted(s for s, c in Counter(self.symbols).items() if c > 1)
            raise ValueError(f"Vocab.symbols contains duplicates: {duplicates}")
        if self.pad is not None and self.pad not in self.symbols:
            raise ValueError(f"Vocab.pad {self.pad!r} is not one of Vocab.symbols")
        object.__setattr__(self, "_index", {s: i for i, s in enumerate(self.symbols)})

    @property
    def size(self) -> int:
        return len(self.symbols)

    @property
    def pad_id(self) -> int | None:
        return None if self.pad is None else self._index[self.pad]

    def encode(self, symbols: Sequence[str], length: int | None = None) -> list[int]:
        """Ids of ``symbols``, right-padded to ``length`` (needs a pad symbol when shorter)."""
        unknown = [s for s in symbols if s not in self._index]
        if unknown:
            raise ValueError(f"unknown symbols {sorted(set(unknown))[:10]} for this vocabulary")
        ids = [self._index[s] for s in symbols]
        if length is None:
            return ids
        if len(ids) > length:
            raise ValueError(f"sequence of {len(ids)} symbols is longer than length={length}")
        if len(ids) < length:
            if self.pad_id is None:
                raise ValueError(f"sequence of {len(ids)} symbols needs padding to {length} but Vocab has no pad")
            ids = ids + [self.pad_id] * (length - len(ids))
        return ids

    def encode_batch(self, sequences: Iterable[Sequence[str]], length: int) -> Tensor:
        """``[N, length]`` long tensor of padded ids."""
        return torch.tensor([self.encode(seq, length) for seq in sequences], dtype=torch.long)

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Symbols of ``ids`` with pad symbols removed; ids outside the vocabulary (e.g. mask) raise."""
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.size:
                raise ValueError(f"token id {i} is outside the vocabulary (size {self.size})")
            if i != self.pad_id:
                out.append(self.symbols[i])
        return out

    def decode_batch(self, tokens: Tensor | Sequence[Sequence[int]]) -> list[list[str]]:
        return [self.decode(row) for row in as_token_rows(tokens)]


def build_vocab(sequences: Iterable[Sequence[str]], pad: str | None = "<pad>") -> Vocab:
    """Vocabulary of all symbols seen, sorted by decreasing frequency then name (deterministic)."""
    counts = Counter(s for seq in sequences for s in seq)
    if pad is not None:
        counts.pop(pad, None)
    symbols = sorted(counts, key=lambda s: (-counts[s], s))
    if pad is not None:
        symbols.append(pad)
    return Vocab(tuple(symbols), pad=pad)


def as_token_rows(tokens: Tensor | Sequence) -> list[list[int]]:
    """Normalize ``[B, L]`` tensors, lists of 1-D tensors or lists of int lists to lists of int lists."""
    if isinstance(tokens, Tensor):
        if tokens.dim() != 2:
            raise ValueError(f"expected a [B, L] token tensor, got shape {tuple(tokens.shape)}")
        return tokens.tolist()
    return [row.tolist() if isinstance(row, Tensor) else [int(i) for i in row] for row in tokens]


def is_string_batch(batch: Tensor | Sequence) -> bool:
    """True when a reward oracle received raw sequences (strings, ``None`` for a missing one, e.g. a failed decode)
    rather than token ids. A list of only ``None`` counts as strings: no token row is ``None``."""
    if isinstance(batch, Tensor) or len(batch) == 0:
        return False
    return all(isinstance(x, str) or x is None for x in batch)
