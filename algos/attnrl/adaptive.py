"""Adaptive Sampling, ADS (AttnRL Eq. 8-10): which initial responses to branch, and how many prompts per batch.

* Difficulty-aware expansion (Eq. 9): a prompt solved by a fraction ``acc`` of its n samples gets about
  n * exp(-acc) trees, the minority outcome first.
* Attention-based filtering (Eq. 8): an all-correct prompt is branched only if its mean FCI exceeds the running
  mean over all all-correct prompts seen so far.
* Adaptive batch size (Eq. 10): grow or shrink the next batch so it yields about ``target`` valid training paths.
"""

from __future__ import annotations

import math
import random
from typing import Sequence


def expansion_count(n: int, accuracy: float, rounding: str = "ceil") -> int:
    """Eq. 9: number of initial responses to branch, n * exp(-accuracy), rounded up (code) or to nearest (paper)."""
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"accuracy must be in [0, 1], got {accuracy}")
    x = n * math.exp(-accuracy)
    if rounding == "ceil":
        return min(n, math.ceil(x - 1e-9))
    if rounding == "round":
        return min(n, int(math.floor(x + 0.5)))
    raise ValueError(f"rounding must be 'ceil' or 'round', got {rounding!r}")


class RunningMean:
    """Cumulative mean of every value seen so far (the reference code's running average with alpha = 0)."""

    def __init__(self) -> None:
        self.total, self.count = 0.0, 0

    def update(self, values: Sequence[float]) -> None:
        self.total += float(sum(values))
        self.count += len(values)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0


def responses_to_expand(correct: Sequence[bool], num_trees: int, rng: random.Random) -> list[int]:
    """Which initial responses to branch: all of the minority outcome (incorrect ones when accuracy >= 1/2), then
    random majority ones up to ``num_trees``; for all-equal outcomes simply the first ``num_trees``."""
    n = len(correct)
    if all(correct) or not any(correct):
        return list(range(min(num_trees, n)))
    minority_is_correct = sum(correct) < n / 2
    minority = [i for i in range(n) if bool(correct[i]) == minority_is_correct]
    majority = [i for i in range(n) if bool(correct[i]) != minority_is_correct]
    extra = rng.sample(majority, max(0, min(num_trees, n) - len(minority)))
    return sorted(minority + extra)


def adaptive_expansion(correct: Sequence[bool], problem_fci: float, fci_of_solved: RunningMean | None,
                       rng: random.Random, rounding: str = "ceil", difficulty_expansion: bool = True) -> list[int]:
    """Which initial responses of one problem to branch: attention-based filtering (Eq. 8), then difficulty-aware
    expansion (Eq. 9), each of which can be off on its own (the paper's two ADS ablations).

    All-correct problems are branched only if their mean FCI exceeds the running mean over all all-correct
    problems seen so far (update the running mean with the current batch first, as the reference code does);
    otherwise they get no continuations and are not trained on. ``fci_of_solved=None`` disables the filter.
    With ``difficulty_expansion`` off every response of a problem that passes the filter is branched.
    """
    n = len(correct)
    accuracy = sum(map(bool, correct)) / n
    if accuracy == 1.0 and fci_of_solved is not None and not problem_fci > fci_of_solved.mean:
        return []
    if not difficulty_expansion:
        return list(range(n))
    return responses_to_expand(correct, expansion_count(n, accuracy, rounding), rng)


def adaptive_batch_size(current: int, valid: int, target: int, lam: float = 0.9, min_size: int = 1,
                        max_size: int | None = None) -> int:
    """Eq. 10 (reference-code form): B <- ceil((1 - lam) * B * target / valid + lam * B), clamped.

    ``valid`` is the number of training paths the last batch yielded and ``target`` the number wanted. A batch
    without any valid path counts as one valid path (so the batch grows as far as ``max_size`` allows).
    """
    if current < 1 or target < 1:
        raise ValueError(f"current and target must be >= 1, got {current}, {target}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    new = math.ceil((1 - lam) * current * target / max(valid, 1) + lam * current - 1e-9)
    new = max(new, min_size)
    return min(new, max_size) if max_size is not None else new
