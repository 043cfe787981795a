"""Analysis, not the algorithm: does FCI rank reasoning steps like their true influence?"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from algos.attnrl.fci import fci_scores
from algos.attnrl.lm import GenerationRequest, Policy, generate
from algos.attnrl.scoring import forward_scores


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


def branch_every_step(policy: Policy, task, problems: Sequence, continuations: int = 4, temperature: float = 1.0,
                      deltas: Sequence[int] = (1, 2, 4), zero_first_step: bool = True,
                      generator: torch.Generator | None = None, max_batch_size: int = 256,
                      interventions: int = 0, seed: int = 0) -> list[dict]:
    """Branch one sampled response per problem at every response step and record what each branch point does.

    For each problem the policy samples one response (at ``temperature``); responses whose line count differs
    from the program's are dropped (their lines cannot be matched to the program's steps). From the first token
    of every response step after the first, ``continuations`` continuations are sampled. Per step the record
    holds: the outcome-flip rate (share of continuations whose reward differs from the original response's), whether
    the branch group (original + continuations) has mixed outcomes, FCI for every delta (teacher-forced on the
    original response, as the learner computes it), membership in the answer's dependency cone
    (``task.dependency_cone``) and the number of direct readers (``task.influence``, not transitive).

    With ``interventions`` > 0 each computation step also gets ``intervention``: the share of ``interventions``
    forced changes of the step's written result (other values, drawn with ``random.Random(seed)``) after which the
    greedy continuation ends with a different answer line than the original response. It asks whether the model's
    later computation *uses* the step, one step at a time, without needing the model to err (resampling only
    moves the answer when the model makes a mistake, so with an accurate model it is mostly noise).
    """
    codec = policy.codec
    max_tokens = task.max_response_chars()
    requests = [GenerationRequest(tuple(codec.encode(p.prompt)), tag=i) for i, p in enumerate(problems)]
    originals = generate(policy, requests, max_tokens, temperature, generator, max_batch_size=max_batch_size)
    kept = [r for r in originals if r.finished and len(r.step_starts) == problems[r.tag].difficulty + 1]
    if not kept:
        return []
    branch_requests = [GenerationRequest(r.prompt_ids, tuple(r.response_ids[:start]), max_tokens - start,
                                         tag=(k, s))
                       for k, r in enumerate(kept) for s, start in enumerate(r.step_starts) if s >= 1
                       for _ in range(continuations)]
    branches = generate(policy, branch_requests, max_tokens, temperature, generator, max_batch_size=max_batch_size)
    outcomes: dict[tuple[int, int], list[float]] = {}
    for b in branches:
        problem = problems[kept[b.tag[0]].tag]
        outcomes.setdefault(b.tag, []).append(task.reward(problem, codec.decode(b.response_ids), b.finished))
    with torch.no_grad():
        alphas = forward_scores(policy, [r.prompt_ids for r in kept], [r.response_ids for r in kept],
                                temperature, output_step_attention=True).step_attention
    intervened = (_intervene(policy, task, problems, kept, interventions, max_tokens, seed, max_batch_size)
                  if interventions > 0 else {})
    records = []
    for k, (r, alpha) in enumerate(zip(kept, alphas)):
        problem = problems[r.tag]
        reward = task.reward(problem, codec.decode(r.response_ids), r.finished)
        fci = {d: fci_scores(alpha, d, zero_first_step).tolist()[1:] for d in deltas}  # per response step
        cone, readers = task.dependency_cone(problem), task.influence(problem, transitive=False)
        steps = []
        for s in range(1, len(r.step_starts)):
            results = outcomes[(k, s)]
            steps.append({"step": s, "flip": sum(x != reward for x in results) / len(results),
                          "mixed": len(set(results) | {reward}) > 1, "in_cone": bool(cone[s]),
                          "readers": readers[s], "fci": {d: fci[d][s] for d in deltas}})
            if (k, s) in intervened:
                steps[-1]["intervention"] = intervened[(k, s)]
        records.append({"problem": r.tag, "difficulty": problem.difficulty, "reward": reward,
                        "step_starts": r.step_starts, "first_step_in_cone": bool(cone[0]), "steps": steps})
    return records


def _intervene(policy: Policy, task, problems: Sequence, kept: Sequence, per_step: int, max_tokens: int, seed: int,
               max_batch_size: int) -> dict[tuple[int, int], float]:
    """(kept response, response step) -> share of forced result changes that change the greedy answer line."""
    import random

    codec, rng = policy.codec, random.Random(seed)
    newline = codec.decode(sorted(codec.delimiter_ids)[:1])  # the step delimiter as text
    last_line = lambda ids: codec.decode(ids).rstrip(newline).split(newline)[-1]  # noqa: E731 - the answer line
    requests, originals = [], {}
    for k, r in enumerate(kept):
        problem = problems[r.tag]
        ids = r.response_ids
        originals[k] = last_line(ids)
        width, modulus = problem.value_width, problem.modulus
        size = len(codec.encode("0" * width))  # tokens of a written value: ``width`` characters, or one unit token
        for s in range(1, problem.difficulty):  # computation steps after the first; the answer line has no result
            end = r.step_starts[s + 1] - 1  # the step's delimiter; its result is the ``size`` tokens before it
            written = codec.decode(ids[end - size:end])
            others = [v for v in range(modulus) if str(v).zfill(width) != written]
            for value in rng.sample(others, min(per_step, len(others))):
                prefix = tuple(ids[:end - size]) + tuple(codec.encode(str(value).zfill(width) + newline))
                requests.append(GenerationRequest(r.prompt_ids, prefix, max_tokens - len(prefix), tag=(k, s)))
    changed: dict[tuple[int, int], list[float]] = {}
    for b in generate(policy, requests, max_tokens, 0.0, max_batch_size=max_batch_size):
        changed.setdefault(b.tag, []).append(float(not b.finished or last_line(b.response_ids) != originals[b.tag[0]]))
    return {key: sum(v) / len(v) for key, v in changed.items()}


def summarize_branching(records: Sequence[dict], deltas: Sequence[int] = (1, 2, 4), num_points: int = 2,
                        rho: float = 0.2, seed: int = 0) -> dict:
    """What :func:`branch_every_step` says about where to branch, over the branching candidates (computation
    steps after the first; the answer line is left out).

    * ``flip`` / ``mixed``: mean outcome-flip rate and share of mixed-outcome branch groups, over all candidates,
      cone steps and distractor steps.
    * ``spearman``: mean per-response rank correlation of FCI (per delta) with the flip rate, with cone membership
      (the true dependency) and with the number of direct readers; the same for earliness (a position-only
      ranking) and of the flip rate with cone membership, for calibration.
    * ``rules``: for the branch points each rule picks (ATB per delta, earliest-2, random, the cone oracle): the
      share in the cone, the mean flip rate and the mixed share; ``atb_equals_earliest``: how often ATB picks
      exactly the earliest steps.
    """
    import random

    from algos.attnrl.branching import (select_branch_points, select_earliest_branch_points,
                                        select_oracle_branch_points, select_random_branch_points)

    rng = random.Random(seed)
    mean = lambda v: sum(v) / len(v) if v else float("nan")  # noqa: E731
    cand_all, corr = [], {}
    picks: dict[str, list[dict]] = {}
    atb_is_earliest = {d: [] for d in deltas}

    def add_corr(name: str, x: Sequence[float], y: Sequence[float]) -> None:
        c = spearman(x, y)
        if not math.isnan(c):
            corr.setdefault(name, []).append(c)

    for rec in records:
        steps = rec["steps"][:-1]  # response steps 2..K; the last record is the answer line
        if len(steps) < 2:
            continue
        cand_all += steps
        flip, cone = [s["flip"] for s in steps], [float(s["in_cone"]) for s in steps]
        earliness = [-s["step"] for s in steps]
        add_corr("earliness~flip", earliness, flip)
        add_corr("earliness~cone", earliness, cone)
        add_corr("flip~cone", flip, cone)
        for d in deltas:
            fci = [s["fci"][d] for s in steps]
            add_corr(f"fci(d={d})~flip", fci, flip)
            add_corr(f"fci(d={d})~cone", fci, cone)
            add_corr(f"fci(d={d})~readers", fci, [s["readers"] for s in steps])
        by_start = {rec["step_starts"][s["step"]]: s for s in rec["steps"]}
        starts = rec["step_starts"]
        for d in deltas:
            scores = [0.0, 0.0] + [s["fci"][d] for s in rec["steps"]]  # prompt, first response step (zeroed)
            chosen = select_branch_points(scores, starts, num_points, rho)
            picks.setdefault(f"atb(d={d})", []).extend(by_start[o] for o in chosen)
            atb_is_earliest[d].append(chosen == select_earliest_branch_points(starts, num_points))
        cone_flags = [rec["first_step_in_cone"]] + [s["in_cone"] for s in rec["steps"]]
        for name, chosen in (("earliest", select_earliest_branch_points(starts, num_points)),
                             ("random", select_random_branch_points(starts, num_points, rng)),
                             ("oracle", select_oracle_branch_points(cone_flags, starts, num_points))):
            picks.setdefault(name, []).extend(by_start[o] for o in chosen)

    def stats(steps: Sequence[dict]) -> dict:
        return {"n": len(steps), "in_cone": mean([float(s["in_cone"]) for s in steps]),
                "flip": mean([s["flip"] for s in steps]), "mixed": mean([float(s["mixed"]) for s in steps])}

    return {"responses": len(records), "reward": mean([r["reward"] for r in records]),
            "all": stats(cand_all), "cone": stats([s for s in cand_all if s["in_cone"]]),
            "distractor": stats([s for s in cand_all if not s["in_cone"]]),
            "spearman": {k: mean(v) for k, v in corr.items()},
            "spearman_n": {k: len(v) for k, v in corr.items()},
            "rules": {k: stats(v) for k, v in picks.items()},
            "atb_equals_earliest": {d: mean([float(x) for x in v]) for d, v in atb_is_earliest.items()}}


INFLUENCES = ("marginal", "suffix", "intervention")


def step_rank_correlations(records: Sequence[dict], delta: int, seed: int = 0,
                           influence: str = "marginal", random_draws: int = 1) -> list[dict]:
    """Per branched response of :func:`branch_every_step`: the rank correlation with the measured influence of each
    step of three orderings of the branching candidates (computation steps after the first; the answer line is left
    out): FCI at ``delta``, earliness (earlier ranks higher, the paper's "early steps" ablation) and a random ordering
    (``random.Random(seed)``, one permutation per response).

    The measured influence of step k on the answer:

    * ``"marginal"``: flip(k) - flip(k + 1), how much more often the outcome changes when step k itself is resampled
      than when only the steps after it are (the resampling importance of Bogdan et al. 2025, "Thought Anchors",
      the paper AttnRL takes its delta from). Not positional by construction.
    * ``"suffix"``: flip(k), the outcome-flip rate when step k and everything after it is resampled. This grows with
      the number of answer-relevant steps after k, so in expectation earliness ranks it best whatever FCI does.
    * ``"intervention"``: the share of forced changes of step k's result that change the answer
      (``branch_every_step(..., interventions=n)``): whether the model's later steps use step k, measured one step
      at a time and without waiting for the model to err.

    Responses whose influence is the same at every candidate carry no ranking and are left out. An ordering that is
    constant over the candidates (FCI all zero, say) ranks nothing: it counts as 0, not as missing, so a blind FCI
    cannot win by abstaining. With ``random_draws`` > 1 the random ordering's correlation is the mean over that many
    permutations per response: the same chance level, estimated with less noise (one permutation's correlation
    varies by about +-0.5 on 6-8 steps, which swamps small differences in a paired comparison). Returns ``[{"difficulty", "fci", "earliest", "random", "steps"}]``.
    """
    import random

    if influence not in INFLUENCES:
        raise ValueError(f"influence must be one of {INFLUENCES}, got {influence!r}")
    rng = random.Random(seed)
    out = []
    for rec in records:
        steps = rec["steps"][:-1]
        if len(steps) < 2:
            continue
        order = list(range(len(steps)))
        orders = []
        for _ in range(random_draws):  # drawn for every response, so one response's skip does not shift the others'
            rng.shuffle(order)
            orders.append(list(order))
        flips = [s["flip"] for s in rec["steps"]]
        if influence == "marginal":
            target = [flips[i] - flips[i + 1] for i in range(len(steps))]
        elif influence == "suffix":
            target = flips[:-1]
        else:
            if any("intervention" not in s for s in steps):
                raise ValueError("influence='intervention' needs records made with branch_every_step(interventions>0)")
            target = [s["intervention"] for s in steps]
        if len(set(target)) < 2:
            continue
        fci = [s["fci"][delta] if delta in s["fci"] else s["fci"][str(delta)] for s in steps]

        def corr(x: Sequence[float]) -> float:
            c = spearman(x, target)
            return 0.0 if math.isnan(c) else c

        out.append({"difficulty": rec["difficulty"], "fci": corr(fci), "earliest": corr([-s["step"] for s in steps]),
                    "random": sum(corr(o) for o in orders) / random_draws, "steps": len(steps)})
    return out
