"""Where to branch a response: Attention-based Tree Branching, ATB (AttnRL Eq. 7), the entropy-based branching of
TreeRL that ATB replaces (the ``entropy_tree`` baseline), and the step-level controls that tell whether attention
matters: the earliest steps, random steps, and the steps of the answer's true dependency cone (an oracle).

All return response offsets: a continuation keeps the response up to the offset and resamples from there on. The
step-level rules branch at the first token of a step and never at the first response step (branching there is
just another fresh sample).
"""

from __future__ import annotations

import random
from typing import Sequence

import torch


def select_branch_points(step_scores: Sequence[float], step_starts: Sequence[int], num_points: int = 2,
                         rho: float = 0.2, min_token_distance: int = 1) -> list[int]:
    """Response offsets at which to regenerate (the first token of each chosen step), sorted.

    C = {k : y_k >= Quantile(y, 1 - rho)} over the response steps (top ``rho`` fraction by FCI; if that
    threshold is 0 the smallest positive score is used). Candidates are visited earliest first and accepted if
    their first token is at least ``min_token_distance`` tokens from the response start and from every accepted
    point; the first response step is never a candidate (branching there is just another fresh sample). If fewer
    than ``num_points`` are accepted, the earliest remaining steps fill up (no distance check).
    ``step_scores[0]`` is the prompt; ``step_starts[i]`` is where response step i + 1 begins.

    Departures from the released code (``attnrl_core_algos.py``; ``algos/attnrl/README.md``): it measures the distance
    from the sequence start, prompt included, and from the *end* of an accepted step (``:671-682``), so with short
    prompts it accepts earlier steps than this rule; and when too few steps qualify it repeats a step until N points
    exist (``:718``), where this returns fewer (a two-step response gets 1 point, not 2).
    """
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"rho must be in (0, 1], got {rho}")
    if len(step_scores) != len(step_starts) + 1:
        raise ValueError("step_scores must have one entry per response step plus one for the prompt")
    scores = torch.as_tensor(list(step_scores)[1:], dtype=torch.float64)
    if scores.numel() < 2 or num_points < 1:
        return []
    threshold = float(torch.quantile(scores, 1.0 - rho))
    if threshold <= 0.0 and bool((scores > 0).any()):
        threshold = float(scores[scores > 0].min())
    offsets: list[int] = []
    for i in range(1, scores.numel()):
        start = step_starts[i]
        if scores[i] >= threshold and start >= min_token_distance and all(
                abs(start - o) >= min_token_distance for o in offsets):
            offsets.append(start)
            if len(offsets) == num_points:
                return sorted(offsets)
    for i in range(1, scores.numel()):
        if len(offsets) == num_points:
            break
        if step_starts[i] not in offsets:
            offsets.append(step_starts[i])
    return sorted(offsets)


def select_entropy_branch_points(entropies: Sequence[float], num_points: int, min_token_distance: int = 1,
                                 forbid_last: bool = True) -> list[int]:
    """Response offsets of the ``num_points`` highest-entropy tokens, at least ``min_token_distance`` from the
    response start and from each other; the continuation resamples from that token on. Offset 0 (a fresh sample)
    and, with ``forbid_last``, the final (end) token are never chosen. Returned sorted. (The released TreeRL-style
    rule, ``attnrl_core_algos.py:645``, is a plain top-k over ``entropies[:-1]``: no distance rule, offset 0
    allowed; at the laptop's distance 1 the two differ only in offset 0.)"""
    if num_points < 0 or min_token_distance < 1:
        raise ValueError("num_points must be >= 0 and min_token_distance >= 1")
    last = len(entropies) - 1 if forbid_last else len(entropies)
    order = sorted(range(1, last), key=lambda i: (-entropies[i], i))
    chosen: list[int] = []
    for i in order:
        if len(chosen) == num_points:
            break
        if i >= min_token_distance and all(abs(i - c) >= min_token_distance for c in chosen):
            chosen.append(i)
    return sorted(chosen)


def select_earliest_branch_points(step_starts: Sequence[int], num_points: int) -> list[int]:
    """The first tokens of the ``num_points`` earliest response steps after the first (the paper's "w/ Early 2
    steps" ablation: what ATB amounts to when FCI carries no information beyond position)."""
    return list(step_starts[1:1 + max(num_points, 0)])


def select_random_branch_points(step_starts: Sequence[int], num_points: int, rng: random.Random,
                                exclude_last: bool = True) -> list[int]:
    """The first tokens of ``num_points`` response steps drawn uniformly without replacement, after the first step
    and (with ``exclude_last``, when there are at least three steps) before the last one, the answer line. Sorted."""
    last = len(step_starts) - 1 if exclude_last and len(step_starts) >= 3 else len(step_starts)
    candidates = list(step_starts[1:last])
    return sorted(rng.sample(candidates, min(max(num_points, 0), len(candidates))))


def select_oracle_branch_points(in_cone: Sequence[bool], step_starts: Sequence[int], num_points: int) -> list[int]:
    """The first tokens of the earliest response steps (after the first) that belong to the answer's dependency cone;
    the earliest remaining steps fill up. ``in_cone[i]`` says whether response step i + 1 feeds the answer (entries
    past ``in_cone`` count as outside the cone: a response may have more lines than the reference)."""
    steps = range(1, len(step_starts))
    inside = [i for i in steps if i < len(in_cone) and in_cone[i]]
    outside = [i for i in steps if not (i < len(in_cone) and in_cone[i])]
    return sorted(step_starts[i] for i in (inside + outside)[:max(num_points, 0)])
