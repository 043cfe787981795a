"""Driver side of pool E-CIT: one CI question -> subset requests for the "cit" sampler -> one combined p-value.

Many questions go out as one map, so the pool batches and balances all their subset tests at once. The split of
each question is seeded from the question itself (``question_seed``), so asking it again (a retry, PC asking (y, x)
after (x, y)) gives the same p-value, and the pool's answer equals ``algos.ecit.ecit_pvalue(..., rng=split_seed)``
on the same arrays.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from algos.ecit import combine, num_subsets

SAMPLER = "cit"


def question_seed(base_seed: int, x: Sequence[int], y: Sequence[int], z: Sequence[int], rep: int = 0) -> int:
    """A split seed that depends on the question, not on the order of x and y or of z."""
    a, b = sorted([sorted(int(c) for c in x), sorted(int(c) for c in y)])
    words = [int(base_seed), int(rep), len(a), *a, len(b), *b, *sorted(int(c) for c in z)]
    return int(np.random.SeedSequence(words).generate_state(1, dtype=np.uint64)[0] % 2**63)


@dataclass
class Question:
    x: list[int]
    y: list[int]
    z: list[int]
    n: int
    split_seed: int
    data: dict | None = None     # a dataset spec; None: the data published under the map's weights key
    full: bool = False           # the base test on all rows instead of E-CIT
    tag: Any = None              # the caller's label (e.g. (n, rep, dependent))


@dataclass
class Answer:
    question: Question
    pvalues: list[float] = field(default_factory=list)  # subset p-values in subset order (one if full)
    cpu_s: float = 0.0                                   # worker CPU seconds of all its tests

    def pvalue(self, method: str = "stable", alpha: float = 1.75) -> float:
        return self.pvalues[0] if self.question.full else combine(self.pvalues, method, alpha)


def requests_for(q: Question, subset_size: int, per_request: int) -> list[dict]:
    common = {"x": q.x, "y": q.y, "z": q.z, "split_seed": q.split_seed, "subset_size": subset_size}
    if q.data is not None:
        common["data"] = q.data
    if q.full:
        return [{**common, "full": True}]
    k = num_subsets(q.n, subset_size)
    return [{**common, "subsets": [lo, min(k, lo + per_request)]} for lo in range(0, k, per_request)]


def ask(pool, questions: Sequence[Question], config: dict, subset_size: int, per_request: int = 4,
        weights: str | None = None, on_result: Callable[[int, int], None] | None = None) -> list[Answer]:
    """Answer every question through the pool in one map; ``on_result(done, total)`` after each request."""
    requests, owner = [], []
    for qi, q in enumerate(questions):
        for r in requests_for(q, subset_size, per_request):
            requests.append(r)
            owner.append(qi)
    parts: list[dict[int, list[float]]] = [{} for _ in questions]
    answers = [Answer(q) for q in questions]
    for done, (i, result) in enumerate(pool.imap(SAMPLER, requests, config=config, weights=weights), 1):
        lo = 0 if requests[i].get("full") else requests[i]["subsets"][0]
        parts[owner[i]][lo] = result["pvalues"]
        answers[owner[i]].cpu_s += float(sum(result["cpu_s"]))
        if on_result is not None:
            on_result(done, len(requests))
    for a, got in zip(answers, parts):
        a.pvalues = [p for lo in sorted(got) for p in got[lo]]
    return answers
