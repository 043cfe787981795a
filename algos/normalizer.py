"""Per-feature running mean/variance observation normalizer (Brax ``running_statistics``, as LIFT uses it).

Statistics are population moments over every sample seen, merged batch-wise with Chan et al.'s parallel
update (exact, order independent up to rounding). They are kept in float64 because LIFT runs see 1e7-1e9
samples, where float32 sums lose precision. ``normalize`` returns ``(x - mean) / std`` with ``std`` clipped
to ``clip_std`` and no clipping of the normalized value (LIFT default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

ArrayLike = torch.Tensor | np.ndarray


class RunningNormalizer(nn.Module):
    """Running per-feature statistics over the trailing ``shape`` dims of every batch.

    Buffers (all float64, saved in ``state_dict``): ``mean``, ``var`` (population variance), ``count`` (scalar).
    Before the first update ``mean = 0``, ``var = 1``, so normalization is the identity.

    Args:
        shape: feature shape, e.g. ``(obs_dim,)``.
        eps: added to ``var`` before the square root (0 reproduces Brax exactly).
        clip_std: ``(min, max)`` clip of the standard deviation, Brax defaults ``(1e-6, 1e6)``.
    """

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, shape: int | Sequence[int], eps: float = 0.0, clip_std: tuple[float, float] = (1e-6, 1e6)):
        super().__init__()
        self.shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        if not 0 < clip_std[0] <= clip_std[1]:
            raise ValueError(f"clip_std must satisfy 0 < min <= max, got {clip_std}")
        self.eps = float(eps)
        self.clip_std = (float(clip_std[0]), float(clip_std[1]))
        self.register_buffer("mean", torch.zeros(self.shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(self.shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @property
    def std(self) -> torch.Tensor:
        return (self.var + self.eps).sqrt().clamp(*self.clip_std)

    @torch.no_grad()
    def update(self, x: ArrayLike) -> None:
        """Merge the samples of ``x`` (shape ``(*batch, *self.shape)``) into the statistics."""
        x = torch.as_tensor(x, device=self.mean.device, dtype=torch.float64)
        if x.shape[x.ndim - len(self.shape):] != self.shape:
            raise ValueError(f"expected trailing shape {self.shape}, got {tuple(x.shape)}")
        x = x.reshape(-1, *self.shape)
        if x.shape[0] == 0:
            return
        batch_var, batch_mean = torch.var_mean(x, dim=0, correction=0)
        self._merge(batch_mean, batch_var, torch.tensor(float(x.shape[0]), dtype=torch.float64, device=x.device))

    @torch.no_grad()
    def merge_(self, other: RunningNormalizer | Mapping[str, ArrayLike]) -> RunningNormalizer:
        """Pool another set of statistics into these (Chan's parallel formula); returns ``self``.

        ``other`` is a ``RunningNormalizer`` or a mapping with ``mean``, ``var``, ``count`` (e.g. another
        rank's ``state_dict()``). Pooling assumes the two sets summarise *disjoint* samples: to combine
        ranks, let each rank accumulate only its new data in a fresh normalizer and merge those.
        """
        stats = other.state_dict() if isinstance(other, RunningNormalizer) else other
        as64 = lambda v: torch.as_tensor(v, dtype=torch.float64, device=self.mean.device)  # noqa: E731
        mean, var, count = as64(stats["mean"]), as64(stats["var"]), as64(stats["count"])
        if mean.shape != self.shape or var.shape != self.shape:
            raise ValueError(f"expected stats of shape {self.shape}, got mean {tuple(mean.shape)}, var {tuple(var.shape)}")
        if count > 0:
            self._merge(mean, var, count)
        return self

    def _merge(self, mean_b: torch.Tensor, var_b: torch.Tensor, count_b: torch.Tensor) -> None:
        count_a = self.count.clone()
        total = count_a + count_b
        delta = mean_b - self.mean
        # M2 of the union = M2_a + M2_b + delta^2 * n_a n_b / n (Chan, Golub & LeVeque 1979).
        m2 = self.var * count_a + var_b * count_b + delta.square() * (count_a * count_b / total)
        self.mean.add_(delta * (count_b / total))
        # A fresh normalizer has var = 1 as a placeholder; count_a = 0 removes it from m2 above.
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """``(x - mean) / std`` in ``x``'s dtype and device."""
        mean = self.mean.to(device=x.device, dtype=x.dtype)
        std = self.std.to(device=x.device, dtype=x.dtype)
        return (x - mean) / std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.normalize(x)

    def extra_repr(self) -> str:
        return f"shape={self.shape}, eps={self.eps}, clip_std={self.clip_std}"
