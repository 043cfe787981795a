"""Tree-based RL: AttnRL (FCI branch points, Adaptive Sampling, one-step off-policy) and the tree baselines
(``entropy_tree``: highest-entropy branch points, every response branched, on-policy; ``attn_tree``,
``earliest_tree``, ``random_tree``, ``oracle_tree``: the same with other branch points, see algos.attnrl.config).

One batch, as in the paper:
    1. sample n initial responses per prompt (with FCI scores for AttnRL) and reward them;
    2. choose which responses to branch (ADS) and where (ATB or entropy), sample T continuations per point;
    3. build one tree per prompt, drop the prompts without signal, turn root-to-leaf paths into training
       sequences carrying TreeRL's process advantages, and run one PPO update;
    4. adapt the next batch size to the number of valid paths.
Off-policy, step 2 of batch m shares a generation call with step 1 of batch m + 1 (:mod:`algos.attnrl.offpolicy`).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

from algos.attnrl.adaptive import RunningMean, adaptive_batch_size, adaptive_expansion
from algos.attnrl.branching import (select_branch_points, select_earliest_branch_points,
                                   select_entropy_branch_points, select_oracle_branch_points,
                                   select_random_branch_points)
from algos.attnrl.config import RLConfig
from algos.attnrl.fci import fci_scores, mean_fci
from algos.attnrl.lm import GenerationRequest, Rollout
from algos.attnrl.offpolicy import OffPolicyScheduler
from algos.attnrl.ppo import TrainSequence
from algos.attnrl.training_run import TrainingRun, valid_tokens
from algos.attnrl.tree import Continuation, PromptTree, training_paths


@dataclass
class TreeBatch:
    problems: list
    initial: list[list[Rollout]] = field(default_factory=list)  # [problem][sample]
    rewards: list[list[float]] = field(default_factory=list)
    branch_offsets: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (problem, sample) -> offsets
    continuations: dict[tuple[int, int, int], list[Continuation]] = field(default_factory=dict)  # (p, s, offset)


def train_tree(run: TrainingRun) -> None:
    cfg = run.cfg
    scheduler = OffPolicyScheduler(cfg.off_policy)
    fci_of_solved = RunningMean() if cfg.ads.attention_filter else None
    step_score_fn = fci_step_score_fn(cfg)
    batches: dict[int, TreeBatch] = {}
    batch_size = cfg.prompts_per_batch
    while True:
        t0 = time.perf_counter()
        pending = scheduler.pending_batch
        # the pending batch's continuations are planned first: what they can still cost is then known exactly
        requests = [] if pending is None else plan_continuations(run, batches[pending], fci_of_solved)
        owed = None if pending is None else sum(min(run.max_tokens, r.max_new_tokens or run.max_tokens)
                                                for r in requests)
        # the adaptive size stays the rule's state; only the batch drawn is cut to what still fits the budget
        prompts = run.batch_prompts(scheduler.version, batch_size, owed)
        call = scheduler.next_call(prompts > 0)
        if call is None:
            break
        if call.initial_batch is not None:
            batches[call.initial_batch] = TreeBatch(run.task.sample(run.rng, prompts))
            requests += initial_requests(run, batches[call.initial_batch].problems)
        rollouts = run.sample(requests, call.policy_version, step_score_fn)
        if call.initial_batch is not None:
            add_initial_samples(run, batches[call.initial_batch], [r for r in rollouts if r.tag[0] == "init"])
        if call.continuation_batch is None:
            continue
        batch = batches.pop(call.continuation_batch)
        add_continuations(run, batch, [r for r in rollouts if r.tag[0] == "cont"])
        trees = build_trees(batch)
        kept = [t for t in trees if t.has_signal()] if cfg.ads.zero_advantage_filter else trees
        sequences = [s for t in kept for s in training_paths(t)]
        stats = run.update(sequences)
        scheduler.record_update()
        metrics = batch_metrics(scheduler.version, batch, trees, sequences, cfg.samples_per_prompt) | {
            "call_tokens": sum(r.num_generated for r in rollouts), "seconds": time.perf_counter() - t0}
        if cfg.ads.adaptive_batch:
            batch_size = adaptive_batch_size(batch_size, len(sequences), cfg.target_valid_paths, cfg.ads.lam,
                                             cfg.min_prompts_per_batch, cfg.max_prompts_per_batch)
        metrics["next_prompts_per_batch"] = batch_size
        run.record(metrics | stats)


def fci_step_score_fn(cfg: RLConfig):
    """FCI from the decoding pass for the rules that need it, else None (a partial of ``fci_scores``: the pool
    sampler reads its keywords)."""
    if cfg.branching != "fci":
        return None
    return functools.partial(fci_scores, delta=cfg.delta, zero_first_step=cfg.zero_first_step)


def initial_requests(run: TrainingRun, problems: list) -> list[GenerationRequest]:
    encode = run.policy.codec.encode
    return [GenerationRequest(tuple(encode(p.prompt)), tag=("init", i, j))
            for i, p in enumerate(problems) for j in range(run.cfg.samples_per_prompt)]


def add_initial_samples(run: TrainingRun, batch: TreeBatch, rollouts: list[Rollout]) -> None:
    """Group the initial samples by their tag ("init", problem, sample) and reward them: a sampler may return
    rollouts in any order (a pool gathers them from several workers)."""
    n = run.cfg.samples_per_prompt
    by_tag = {tuple(r.tag[1:]): r for r in rollouts}
    if len(by_tag) != len(rollouts) or set(by_tag) != {(i, j) for i in range(len(batch.problems)) for j in range(n)}:
        raise ValueError("initial rollouts must carry the tags ('init', problem, sample) of their requests, once each")
    batch.initial = [[by_tag[(i, j)] for j in range(n)] for i in range(len(batch.problems))]
    batch.rewards = [[run.score(p, r) for r in rolls] for p, rolls in zip(batch.problems, batch.initial)]


def plan_continuations(run: TrainingRun, batch: TreeBatch, fci_of_solved: RunningMean | None
                       ) -> list[GenerationRequest]:
    """Rewards are known: choose which initial responses to branch (ADS), where (ATB or entropy), and request
    ``continuations_per_point`` continuations from every branch point."""
    cfg = run.cfg
    n = cfg.samples_per_prompt
    problem_fci = [sum(mean_fci(r.step_scores or [0.0]) for r in rolls) / n for rolls in batch.initial]
    if fci_of_solved is not None:
        fci_of_solved.update([f for f, rw in zip(problem_fci, batch.rewards) if all(x > 0 for x in rw)])
    requests = []
    for i, rolls in enumerate(batch.initial):
        correct = [r > 0 for r in batch.rewards[i]]
        expand = adaptive_expansion(correct, problem_fci[i], fci_of_solved, run.rng, cfg.ads.rounding,
                                    cfg.ads.difficulty_expansion)
        for j in expand:
            r = rolls[j]
            offsets = branch_offsets(run, batch.problems[i], r)
            batch.branch_offsets[(i, j)] = offsets
            response = r.response_ids
            for o in offsets:
                for _ in range(cfg.continuations_per_point):
                    requests.append(GenerationRequest(r.prompt_ids, tuple(response[:o]), run.max_tokens - o,
                                                      tag=("cont", i, j, o)))
    return requests


def branch_offsets(run: TrainingRun, problem, rollout: Rollout) -> list[int]:
    """Where to branch ``rollout`` under the run's rule: ATB (top-FCI steps), the highest-entropy tokens, the
    earliest steps, random steps, or the earliest steps of the answer's dependency cone (``task.dependency_cone``)."""
    cfg, rule = run.cfg, run.cfg.branching
    if rule == "fci":
        return select_branch_points(rollout.step_scores, rollout.step_starts, cfg.branch_points, cfg.rho,
                                    cfg.min_branch_distance)
    if rule == "entropy":
        return select_entropy_branch_points(rollout.entropies, cfg.branch_points, cfg.min_branch_distance)
    if rule == "earliest":
        return select_earliest_branch_points(rollout.step_starts, cfg.branch_points)
    if rule == "random":
        return select_random_branch_points(rollout.step_starts, cfg.branch_points, run.rng)
    if rule == "oracle":
        return select_oracle_branch_points(run.task.dependency_cone(problem), rollout.step_starts, cfg.branch_points)
    raise ValueError(f"unknown branching rule {rule!r}")


def add_continuations(run: TrainingRun, batch: TreeBatch, rollouts: list[Rollout]) -> None:
    """Reward the continuations and file them under their branch point; the batch is now sampled completely."""
    for r in rollouts:
        _, i, j, o = r.tag
        batch.continuations.setdefault((i, j, o), []).append(
            Continuation(r.generated_ids, r.logprobs, run.score(batch.problems[i], r)))


def build_trees(batch: TreeBatch) -> list[PromptTree]:
    trees = []
    for i, rolls in enumerate(batch.initial):
        tree = PromptTree(rolls[0].prompt_ids)
        for j, r in enumerate(rolls):
            offsets = batch.branch_offsets.get((i, j), [])
            conts = {o: batch.continuations.get((i, j, o), []) for o in offsets}
            tree.add_response(r.response_ids, r.logprobs, batch.rewards[i][j], {o: c for o, c in conts.items() if c})
        trees.append(tree)
    return trees


def batch_metrics(update: int, batch: TreeBatch, trees: list[PromptTree], sequences: list[TrainSequence],
                  n: int) -> dict:
    leaves = [x for t in trees for x in t.leaf_rewards()]
    return {"update": update, "prompts": len(batch.problems),
            "mean_reward": sum(map(sum, batch.rewards)) / (n * len(batch.problems)),
            "mean_leaf_reward": sum(leaves) / max(len(leaves), 1),
            "valid_prompt_ratio": sum(t.has_signal() for t in trees) / len(trees),
            "expanded_responses": sum(1 for offsets in batch.branch_offsets.values() if offsets),
            "continuations": sum(len(c) for c in batch.continuations.values()),
            "train_sequences": len(sequences), "train_tokens": sum(len(s.response_ids) for s in sequences),
            "valid_train_tokens": valid_tokens(sequences)}
