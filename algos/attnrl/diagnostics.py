"""Analysis, not the algorithm: does FCI rank reasoning steps like their true influence?"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from algos.attnrl.fci import fci_scores
from algos.attnrl.lm import Policy, forward_scores


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties); nan when either side is constant."""
    def ranks(v: Sequence[float]) -> torch.Tensor:
        t = torch.as_tensor(v, dtype=torch.float64)
        order = t.argsort()
        r = torch.empty_like(t)
        r[order] = torch.arange(len(t), dtype=torch.float64)
        for value in t.unique():  # ties share their mean rank
            tie = t == value
            r[tie] = r[tie].mean()
        return r
    rx, ry = ranks(x), ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = float(rx.norm() * ry.norm())
    return float((rx * ry).sum()) / denom if denom > 0 else float("nan")


def fci_influence_correlation(policy: Policy, task, problems: Sequence, delta: int, transitive: bool = True,
                              zero_first_step: bool = False) -> dict[str, float]:
    """Mean per-problem Spearman correlation between FCI (teacher-forced on the reference solution) and the
    ground-truth influence of each step (``task.influence``), over the steps that have a later step at least
    ``delta`` away. For calibration it also returns the correlation of FCI with earliness and that of the
    trivial "earlier is more influential" ranking with the true influence; problems where either ranking is
    constant are skipped."""
    codec = policy.codec
    prompts = [codec.encode(p.prompt) for p in problems]
    responses = [codec.encode(p.solution) + [codec.eos_id] for p in problems]
    with torch.no_grad():
        alphas = forward_scores(policy, prompts, responses, output_step_attention=True).step_attention
    correlations, earliness_correlations, baseline_correlations = [], [], []
    for p, alpha in zip(problems, alphas):
        fci = fci_scores(alpha, delta, zero_first_step).tolist()
        last = len(fci) - 1 - delta  # steps 1..last have a later step at distance >= delta (the answer is step -1)
        scores, influence = fci[1:last + 1], task.influence(p, transitive)[:last]
        earliness = [-i for i in range(len(scores))]
        correlation = spearman(scores, influence)
        if not math.isnan(correlation):
            correlations.append(correlation)
            earliness_correlations.append(spearman(scores, earliness))
            baseline_correlations.append(spearman(earliness, influence))
    mean = lambda v: sum(v) / max(len(v), 1)  # noqa: E731
    return {"spearman": mean(correlations), "fci_vs_earliness": mean(earliness_correlations),
            "earliness_vs_influence": mean(baseline_correlations), "problems": len(correlations)}
