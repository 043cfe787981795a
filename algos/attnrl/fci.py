"""Forward Context Influence, FCI (AttnRL Eq. 5-6): how much later reasoning steps attend to each step."""

from __future__ import annotations

from typing import Sequence

import torch


def later_attention(step_attention: torch.Tensor, delta: int) -> torch.Tensor:
    """y (L, H, S): per layer and head, y_k = sum_{j >= k + delta} alpha_{j,k}, the attention that steps at least
    ``delta`` later pay to step k (Eq. 5)."""
    S = step_attention.shape[-1]
    # the mask lives where the sums do: the sampler accumulates them on its GPU (algos.attnrl.lm.generate)
    steps = torch.arange(S, device=step_attention.device)
    later = (steps[:, None] >= steps[None, :] + delta).to(step_attention.dtype)
    return (step_attention.nan_to_num(0.0) * later).sum(dim=-2)


def fci_scores(step_attention: torch.Tensor, delta: int, zero_first_step: bool = False) -> torch.Tensor:
    """Forward Context Influence of every step.

    ``step_attention`` is alpha (L, H, S, S): alpha[l, h, j, k] is how much step j attends to step k (mean over
    the query tokens of j and key tokens of k). Per layer and head, y_k = sum_{j >= k + delta} alpha_{j,k}
    (attention that *later* steps, at least ``delta`` away, pay to step k); the score is the max over all layers
    and heads. Step 0 (the prompt) is never a branching candidate and scores 0; ``zero_first_step`` also zeroes
    the first response step, as the reference implementation does.
    """
    if step_attention.dim() != 4 or step_attention.shape[-1] != step_attention.shape[-2]:
        raise ValueError(f"step_attention must be (L, H, S, S), got {tuple(step_attention.shape)}")
    if delta < 1:
        raise ValueError(f"delta must be >= 1, got {delta}")
    S = step_attention.shape[-1]
    scores = later_attention(step_attention, delta).flatten(0, 1).amax(dim=0)
    scores[0] = 0.0
    if zero_first_step and S > 1:
        scores[1] = 0.0
    return scores


def mean_fci(step_scores: Sequence[float]) -> float:
    """(1/T) sum_k y_k over the response steps of one response (the per-response term of Eq. 8)."""
    response = list(step_scores)[1:]
    return sum(response) / len(response) if response else 0.0
