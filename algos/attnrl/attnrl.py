"""AttnRL (Liu et al., 2025, arXiv:2509.26628): attention-guided exploration for process-supervised RL.

Pieces, each a pure function or a small stateful helper, in the order of the paper:

* :func:`fci_scores` -- Forward Context Influence (Eq. 5-6).
* :func:`select_branch_points` -- Attention-based Tree Branching, ATB (Eq. 7).
* :class:`PromptTree`, :func:`tree_advantages`, :func:`training_paths` -- TreeRL process advantages (Eq. 2-3).
* :func:`expansion_count`, :func:`responses_to_expand`, :class:`RunningMean`, :func:`adaptive_batch_size` --
  Adaptive Sampling, ADS (Eq. 8-10 and the zero-advantage filter).
* :class:`OffPolicyScheduler` -- the one-step off-policy pipeline (Sec. 3.3).
* :func:`train` -- a single-process reference driver for ``attnrl``, ``grpo`` and ``entropy_tree``.

The driver only talks to the sampler through ``generate_fn`` (default :func:`algos.attnrl.lm.generate`), whose inputs
are the policy and a list of :class:`~algos.attnrl.lm.GenerationRequest` and whose output is plain
:class:`~algos.attnrl.lm.Rollout` data, so a pool of remote samplers can replace it without touching the algorithm.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch

from algos.attnrl.lm import GenerationRequest, Policy, Rollout, forward_scores, generate
from algos.attnrl.ppo import grpo_advantages, ppo_clip_loss, select_entropy_branch_points

log = logging.getLogger(__name__)

METHODS = ("attnrl", "grpo", "entropy_tree")


# --------------------------------------------------------------------------------------------------- FCI (Eq. 5-6)
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
    j = torch.arange(S)[:, None]
    k = torch.arange(S)[None, :]
    later = (j >= k + delta).to(step_attention.dtype)
    y = (step_attention.nan_to_num(0.0) * later).sum(dim=-2)  # (L, H, S): sum over query steps j
    scores = y.flatten(0, 1).amax(dim=0)
    scores[0] = 0.0
    if zero_first_step and S > 1:
        scores[1] = 0.0
    return scores


def mean_fci(step_scores: Sequence[float]) -> float:
    """(1/T) sum_k y_k over the response steps of one response (the per-response term of Eq. 8)."""
    response = list(step_scores)[1:]
    return sum(response) / len(response) if response else 0.0


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
    rhos, earliness_rhos, baseline_rhos = [], [], []
    for p, alpha in zip(problems, alphas):
        fci = fci_scores(alpha, delta, zero_first_step).tolist()
        last = len(fci) - 1 - delta  # steps 1..last have a later step at distance >= delta (the answer is step -1)
        scores, influence = fci[1:last + 1], task.influence(p, transitive)[:last]
        earliness = [-i for i in range(len(scores))]
        rho = spearman(scores, influence)
        if not math.isnan(rho):
            rhos.append(rho)
            earliness_rhos.append(spearman(scores, earliness))
            baseline_rhos.append(spearman(earliness, influence))
    mean = lambda v: sum(v) / max(len(v), 1)  # noqa: E731
    return {"spearman": mean(rhos), "fci_vs_earliness": mean(earliness_rhos),
            "earliness_vs_influence": mean(baseline_rhos), "problems": len(rhos)}


# ---------------------------------------------------------------------------------------------------- ATB (Eq. 7)
def select_branch_points(step_scores: Sequence[float], step_starts: Sequence[int], num_points: int = 2,
                         rho: float = 0.2, min_token_distance: int = 1) -> list[int]:
    """Response offsets at which to regenerate (the first token of each chosen step), sorted.

    C = {k : y_k >= Quantile(y, 1 - rho)} over the response steps (top ``rho`` fraction by FCI; if that
    threshold is 0 the smallest positive score is used). Candidates are visited earliest first and accepted if
    their first token is at least ``min_token_distance`` tokens from the response start and from every accepted
    point; the first response step is never a candidate (branching there is just another fresh sample). If fewer
    than ``num_points`` are accepted, the earliest remaining steps fill up (no distance check), as in the
    reference code. ``step_scores[0]`` is the prompt; ``step_starts[i]`` is where response step i + 1 begins.
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


# -------------------------------------------------------------------------------------- trees and advantages (Eq. 2-3)
@dataclass
class TreeNode:
    tokens: list[int]
    old_logprobs: list[float]  # behaviour log-probs of ``tokens`` (from the call that sampled them)
    parent: int | None
    children: list[int] = field(default_factory=list)
    reward: float | None = None  # leaves only


@dataclass
class Branch:
    """One continuation sampled from a branch point: its generated tokens, their log-probs and its reward."""

    tokens: list[int]
    logprobs: list[float]
    reward: float


@dataclass
class TrainSequence:
    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    advantages: list[float]  # per response token
    reward: float


class PromptTree:
    """All responses to one prompt as a tree of token segments; node 0 is the prompt (root)."""

    def __init__(self, prompt_ids: Sequence[int]) -> None:
        self.prompt_ids = list(prompt_ids)
        self.nodes: list[TreeNode] = [TreeNode(list(prompt_ids), [], None)]

    def add_node(self, parent: int, tokens: Sequence[int], old_logprobs: Sequence[float],
                 reward: float | None = None) -> int:
        if len(tokens) != len(old_logprobs):
            raise ValueError("tokens and old_logprobs must have equal length")
        self.nodes.append(TreeNode(list(tokens), list(old_logprobs), parent, reward=reward))
        self.nodes[parent].children.append(len(self.nodes) - 1)
        return len(self.nodes) - 1

    def add_response(self, tokens: Sequence[int], logprobs: Sequence[float], reward: float,
                     continuations: Mapping[int, Sequence[Branch]] | None = None) -> None:
        """Add one initial response, cut at its branch offsets; continuations from offset o become siblings of
        the original segment that starts at o. Without continuations the response is a single leaf."""
        continuations = continuations or {}
        cuts = sorted(continuations)
        if cuts and not 0 < cuts[0] <= cuts[-1] < len(tokens):
            raise ValueError(f"branch offsets {cuts} must lie inside the response (1..{len(tokens) - 1})")
        bounds = [0] + cuts + [len(tokens)]
        parent = 0
        for i in range(len(bounds) - 1):
            a, b = bounds[i], bounds[i + 1]
            last = i == len(bounds) - 2
            node = self.add_node(parent, tokens[a:b], logprobs[a:b], reward if last else None)
            for branch in continuations.get(a, ()) if i > 0 else ():
                self.add_node(parent, branch.tokens, branch.logprobs, branch.reward)
            parent = node

    def leaves(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if i > 0 and not n.children]

    def leaf_rewards(self) -> list[float]:
        return [self.nodes[i].reward for i in self.leaves()]

    def has_signal(self) -> bool:
        """False when all leaves are equally rewarded (all advantages are 0): the zero-advantage filter."""
        rewards = self.leaf_rewards()
        return len(set(rewards)) > 1

    def leaf_counts_and_values(self) -> tuple[list[int], list[float]]:
        """|L(s)| and V(s) = mean reward of the leaves under s, for every node (parents precede children)."""
        count = [0] * len(self.nodes)
        total = [0.0] * len(self.nodes)
        for i in reversed(range(1, len(self.nodes))):
            node = self.nodes[i]
            if not node.children:
                count[i], total[i] = 1, float(node.reward)
            count[node.parent] += count[i]
            total[node.parent] += total[i]
        return count, [t / c if c else 0.0 for t, c in zip(total, count)]


def tree_advantages(tree: PromptTree) -> list[float]:
    """TreeRL Eq. 3: A(s) = [(V(s) - V(root)) + (V(s) - V(parent(s)))] / sqrt(|L(s)|); 0 for the root."""
    count, value = tree.leaf_counts_and_values()
    adv = [0.0] * len(tree.nodes)
    for i in range(1, len(tree.nodes)):
        parent = tree.nodes[i].parent
        adv[i] = ((value[i] - value[0]) + (value[i] - value[parent])) / math.sqrt(count[i])
    return adv


def training_paths(tree: PromptTree, advantages: Sequence[float] | None = None,
                   drop_unexpanded: bool = True) -> list[TrainSequence]:
    """One training sequence per root-to-leaf path; each token carries its node's advantage. Paths of a single
    segment (responses that were never branched) are dropped but still counted in V(root)."""
    advantages = tree_advantages(tree) if advantages is None else advantages
    paths = []
    for leaf in tree.leaves():
        chain, i = [], leaf
        while i != 0:
            chain.append(i)
            i = tree.nodes[i].parent
        if drop_unexpanded and len(chain) == 1:
            continue
        chain.reverse()
        tokens, old_lp, adv = [], [], []
        for i in chain:
            node = tree.nodes[i]
            tokens += node.tokens
            old_lp += node.old_logprobs
            adv += [advantages[i]] * len(node.tokens)
        paths.append(TrainSequence(tree.prompt_ids, tokens, old_lp, adv, float(tree.nodes[leaf].reward)))
    return paths


# ---------------------------------------------------------------------------------------------- ADS (Eq. 8-10)
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
                       rng: random.Random, rounding: str = "ceil") -> list[int]:
    """Difficulty-aware expansion (Eq. 9) plus attention-based filtering (Eq. 8).

    All-correct problems are branched only if their mean FCI exceeds the running mean over all all-correct
    problems seen so far (update the running mean with the current batch first, as the reference code does);
    otherwise they get no continuations and are not trained on. ``fci_of_solved=None`` disables the filter.
    """
    n = len(correct)
    accuracy = sum(map(bool, correct)) / n
    if accuracy == 1.0 and fci_of_solved is not None and not problem_fci > fci_of_solved.mean:
        return []
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


# --------------------------------------------------------------------------------- one-step off-policy (Sec. 3.3)
@dataclass(frozen=True)
class GenerationCall:
    """What one sampling call carries and which weights sample it.

    ``policy_version`` = number of policy updates applied before the call. ``initial_batch``: batch whose
    initial responses are sampled; ``continuation_batch``: batch whose branch continuations are sampled, and which
    is trained right after the call.
    """

    policy_version: int
    initial_batch: int | None
    continuation_batch: int | None


class OffPolicyScheduler:
    """Order of generation calls and updates, as pure bookkeeping.

    Off-policy: call m (weights after m updates) samples the initial responses of batch m + 1 *and* the
    continuations of batch m; update m follows. So batch m's originals come from theta_{m-1} and its
    continuations from theta_m (batch 0: both theta_0, after a warm-up call with only its initial samples).
    On-policy: initial samples and continuations of batch m are separate calls, both with theta_m.
    """

    def __init__(self, off_policy: bool = True) -> None:
        self.off_policy = off_policy
        self.version = 0
        self._awaiting_continuation: int | None = None
        self._next_batch = 0

    @property
    def pending_batch(self) -> int | None:
        """Batch whose initial responses exist but whose continuations are not sampled yet."""
        return self._awaiting_continuation

    def next_call(self, start_new_batch: bool = True) -> GenerationCall | None:
        """The next call; ``start_new_batch=False`` lets the pipeline drain. None when nothing is left to do."""
        pending = self._awaiting_continuation
        may_start = start_new_batch and (self.off_policy or pending is None)
        new = self._next_batch if may_start else None
        if pending is None and new is None:
            return None
        if new is not None:
            self._next_batch += 1
        self._awaiting_continuation = new
        return GenerationCall(self.version, new, pending)

    def record_update(self) -> None:
        self.version += 1


# ------------------------------------------------------------------------------------------------- the driver
@dataclass
class AdaptiveSamplingConfig:
    difficulty_expansion: bool = True  # Eq. 9
    attention_filter: bool = True  # Eq. 8
    zero_advantage_filter: bool = True  # drop prompts whose leaves are all correct or all wrong
    adaptive_batch: bool = True  # Eq. 10
    lam: float = 0.9
    rounding: str = "ceil"

    def __post_init__(self) -> None:
        if self.rounding not in ("ceil", "round"):
            raise ValueError(f"rounding must be 'ceil' or 'round', got {self.rounding!r}")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {self.lam}")


@dataclass
class RLConfig:
    """Laptop-scale defaults; paper values in comments where they differ."""

    prompts_per_batch: int = 8  # paper 64 (initial value when the batch size adapts)
    samples_per_prompt: int = 6  # n
    branch_points: int = 2  # N
    continuations_per_point: int = 2  # T
    rho: float = 0.2
    delta: int = 1  # paper 4 (long traces); the laptop task has 2-5 steps
    zero_first_step: bool = False
    min_branch_distance: int = 1  # tokens; paper 512
    temperature: float = 1.0
    max_response_tokens: int | None = None  # None -> task.max_response_chars()
    lr: float = 1e-4  # paper 1e-6 for a 1.5B model
    ppo_minibatch: int = 64  # sequences per gradient step
    ppo_epochs: int = 1
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 1e-3
    grad_clip: float = 1.0
    token_budget: int = 100_000  # generated tokens, counted exactly, all calls included
    max_updates: int = 10_000
    ads: AdaptiveSamplingConfig | None = None  # None -> method default (AttnRL: all on; baselines: off)
    off_policy: bool | None = None  # None -> method default (AttnRL: on; baselines: off)
    target_valid_paths: int | None = None  # None -> 5 * n * prompts_per_batch (the reference setting)
    min_prompts_per_batch: int = 2
    max_prompts_per_batch: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("prompts_per_batch", "samples_per_prompt", "continuations_per_point", "ppo_minibatch",
                     "ppo_epochs", "token_budget", "max_updates", "min_prompts_per_batch", "delta",
                     "min_branch_distance"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.samples_per_prompt < 2:
            raise ValueError("samples_per_prompt must be >= 2 (group baselines need two samples)")
        if self.branch_points < 0:
            raise ValueError(f"branch_points must be >= 0, got {self.branch_points}")
        if not 0.0 < self.rho <= 1.0:
            raise ValueError(f"rho must be in (0, 1], got {self.rho}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 for RL sampling, got {self.temperature}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.max_prompts_per_batch < max(self.min_prompts_per_batch, self.prompts_per_batch):
            raise ValueError("max_prompts_per_batch must be >= prompts_per_batch and min_prompts_per_batch")

    def resolved(self, method: str) -> "RLConfig":
        """Copy with the method defaults filled in."""
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        cfg = copy.copy(self)
        if cfg.ads is None:
            cfg.ads = AdaptiveSamplingConfig() if method == "attnrl" else AdaptiveSamplingConfig(
                difficulty_expansion=False, attention_filter=False, zero_advantage_filter=False,
                adaptive_batch=False)
        if cfg.off_policy is None:
            cfg.off_policy = method == "attnrl"
        if cfg.target_valid_paths is None:
            cfg.target_valid_paths = 5 * cfg.samples_per_prompt * cfg.prompts_per_batch
        return cfg


GenerateFn = Callable[..., list[Rollout]]


def ppo_update(policy: Policy, ref: Policy, optimizer: torch.optim.Optimizer, sequences: Sequence[TrainSequence],
               cfg: RLConfig, rng: random.Random) -> dict[str, float]:
    """PPO-clip epochs over mini-batches of training sequences (token-mean per mini-batch, KL to ``ref``)."""
    if not sequences:
        return {}
    prompts = [s.prompt_ids for s in sequences]
    responses = [s.response_ids for s in sequences]
    with torch.no_grad():
        ref_lp = forward_scores(ref, prompts, responses, cfg.temperature).logprobs
    width = ref_lp.shape[1]

    def padded(rows: Sequence[Sequence[float]]) -> torch.Tensor:
        out = torch.zeros(len(rows), width)
        for i, r in enumerate(rows):
            out[i, :len(r)] = torch.tensor(r, dtype=torch.float32)
        return out

    old_lp = padded([s.old_logprobs for s in sequences]).to(ref_lp.device)
    adv = padded([s.advantages for s in sequences]).to(ref_lp.device)
    policy.model.train()
    sums: dict[str, float] = {}
    n_steps = 0
    for _ in range(cfg.ppo_epochs):
        order = list(range(len(sequences)))
        rng.shuffle(order)
        for i in range(0, len(order), cfg.ppo_minibatch):
            idx = order[i:i + cfg.ppo_minibatch]
            scores = forward_scores(policy, [prompts[j] for j in idx], [responses[j] for j in idx], cfg.temperature)
            w = scores.logprobs.shape[1]
            loss, m = ppo_clip_loss(scores.logprobs, old_lp[idx, :w], adv[idx, :w], scores.mask, ref_lp[idx, :w],
                                    cfg.clip_low, cfg.clip_high, cfg.kl_coef)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            m["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(policy.model.parameters(), cfg.grad_clip))
            optimizer.step()
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v
            n_steps += 1
    policy.model.eval()
    return {k: v / n_steps for k, v in sums.items()} | {"optimizer_steps": n_steps}


@dataclass
class _Batch:
    problems: list
    initial: list[list[Rollout]] = field(default_factory=list)  # [problem][sample]
    rewards: list[list[float]] = field(default_factory=list)
    branches: dict = field(default_factory=dict)  # (problem, sample) -> offsets
    continuations: dict = field(default_factory=dict)  # (problem, sample, offset) -> [Branch]
    initial_tokens: int = 0  # generated for its initial samples (its continuations are still to come)


def train(method: str, policy: Policy, ref: Policy, task, cfg: RLConfig | None = None,
          generate_fn: GenerateFn | None = None, log_fn: Callable[[dict], None] | None = None) -> dict:
    """Train ``policy`` with ``method`` for about ``cfg.token_budget`` generated tokens (or ``max_updates``).

    Every sampled token counts (initial samples, continuations, and samples never trained on); a new batch is
    started only while that is expected to land nearer the budget than stopping (see :func:`_may_start_batch`).

    ``task`` provides ``sample(rng, n)``, ``reward(problem, text, finished)`` and ``max_response_chars()``
    (:class:`envs.reasoning.task.ReasoningTask`). ``generate_fn(policy, requests, max_new_tokens, temperature,
    generator, step_score_fn)`` samples rollouts; swap it for a remote sampler. ``log_fn`` receives one metrics
    dict per update. Returns ``{"history", "generated_tokens", "updates"}``.
    """
    cfg = (cfg or RLConfig()).resolved(method)
    generate_fn = generate_fn or generate
    ref.model.eval()
    for p in ref.model.parameters():
        p.requires_grad_(False)
    rng = random.Random(cfg.seed)
    torch_gen = torch.Generator().manual_seed(cfg.seed)
    optimizer = torch.optim.Adam(policy.model.parameters(), lr=cfg.lr)
    max_tokens = cfg.max_response_tokens or task.max_response_chars()
    # finished_*: tokens and prompts of batches sampled completely (the per-prompt cost of a batch)
    state = {"tokens": 0, "history": [], "finished_tokens": 0, "finished_prompts": 0}

    def sample(requests: list[GenerationRequest], version: int, step_score_fn=None) -> list[Rollout]:
        rollouts = generate_fn(policy, requests, max_tokens, cfg.temperature, torch_gen, step_score_fn)
        for r in rollouts:
            r.policy_version = version
        state["tokens"] += sum(r.num_generated for r in rollouts)
        return rollouts

    def score(problem, rollout: Rollout) -> float:
        return task.reward(problem, policy.codec.decode(rollout.response_ids), rollout.finished)

    def record(metrics: dict) -> None:
        metrics |= {"method": method, "generated_tokens": state["tokens"]}
        state["history"].append(metrics)
        log.info("%s", metrics)
        if log_fn:
            log_fn(metrics)

    if method == "grpo":
        _train_grpo(policy, ref, task, cfg, optimizer, rng, sample, score, record, state)
    else:
        _train_tree(method, policy, ref, task, cfg, optimizer, rng, sample, score, record, state)
    return {"history": state["history"], "generated_tokens": state["tokens"], "updates": len(state["history"])}


def _may_start_batch(state: dict, cfg: RLConfig, updates: int, next_prompts: int,
                     pending: _Batch | None = None) -> bool:
    """Start a batch of ``next_prompts`` prompts only if the run is then expected to end closer to the token budget
    than by stopping. A batch's cost is estimated per prompt from the batches finished so far (initial samples and
    continuations); a ``pending`` off-policy batch still has its continuations to sample: they are owed either way."""
    if updates >= cfg.max_updates - (1 if pending is not None else 0):
        return False
    if state["finished_prompts"]:
        per_prompt = state["finished_tokens"] / state["finished_prompts"]
    elif pending is not None:  # nothing finished yet: continuations cost about as much as initial samples
        per_prompt = 2.0 * pending.initial_tokens / len(pending.problems)
    else:
        return state["tokens"] < cfg.token_budget
    owed = 0.0 if pending is None else max(0.0, per_prompt * len(pending.problems) - pending.initial_tokens)
    return state["tokens"] + owed + 0.5 * per_prompt * next_prompts < cfg.token_budget


def _valid_tokens(sequences: Sequence[TrainSequence]) -> int:
    """Trained tokens that carry a learning signal: those of sequences with a nonzero advantage somewhere (the
    "valid tokens" of the paper's Table 3; zero-advantage sequences only contribute the KL term)."""
    return sum(len(s.response_ids) for s in sequences if any(a != 0.0 for a in s.advantages))


def _train_grpo(policy, ref, task, cfg, optimizer, rng, sample, score, record, state) -> None:
    n = cfg.samples_per_prompt
    update = 0
    while _may_start_batch(state, cfg, update, cfg.prompts_per_batch):
        t0 = time.perf_counter()
        problems = task.sample(rng, cfg.prompts_per_batch)
        requests = [GenerationRequest(tuple(policy.codec.encode(p.prompt)), tag=(i, j))
                    for i, p in enumerate(problems) for j in range(n)]
        rollouts = sample(requests, update)
        state["finished_tokens"] += sum(r.num_generated for r in rollouts)
        state["finished_prompts"] += len(problems)
        rewards = torch.tensor([score(problems[r.tag[0]], r) for r in rollouts]).view(len(problems), n)
        adv = grpo_advantages(rewards)
        sequences = [TrainSequence(list(r.prompt_ids), r.response_ids, r.logprobs,
                                   [float(adv[r.tag])] * r.num_generated, float(rewards[r.tag]))
                     for r in rollouts]
        stats = ppo_update(policy, ref, optimizer, sequences, cfg, rng)
        update += 1
        valid = int((rewards.std(dim=1) > 0).sum())
        record({"update": update, "prompts": len(problems), "mean_reward": float(rewards.mean()),
                "valid_prompt_ratio": valid / len(problems), "train_sequences": len(sequences),
                "train_tokens": sum(len(s.response_ids) for s in sequences),
                "valid_train_tokens": _valid_tokens(sequences),
                "seconds": time.perf_counter() - t0} | stats)


def _plan_continuations(method: str, batch: _Batch, cfg: RLConfig, rng: random.Random,
                        fci_of_solved: RunningMean | None, max_tokens: int) -> list[GenerationRequest]:
    """Rewards are known: choose which initial responses to branch, where, and build the continuation requests."""
    ads = cfg.ads
    n = cfg.samples_per_prompt
    problem_fci = [sum(mean_fci(r.step_scores or [0.0]) for r in rolls) / n for rolls in batch.initial]
    if fci_of_solved is not None:
        fci_of_solved.update([f for f, rw in zip(problem_fci, batch.rewards) if all(x > 0 for x in rw)])
    requests = []
    for i, rolls in enumerate(batch.initial):
        correct = [r > 0 for r in batch.rewards[i]]
        if ads.difficulty_expansion:
            expand = adaptive_expansion(correct, problem_fci[i], fci_of_solved, rng, ads.rounding)
        else:
            expand = list(range(n))
        for j in expand:
            r = rolls[j]
            if method == "attnrl":
                offsets = select_branch_points(r.step_scores, r.step_starts, cfg.branch_points, cfg.rho,
                                               cfg.min_branch_distance)
            else:
                offsets = select_entropy_branch_points(r.entropies, cfg.branch_points, cfg.min_branch_distance)
            batch.branches[(i, j)] = offsets
            response = r.response_ids
            for o in offsets:
                for _ in range(cfg.continuations_per_point):
                    requests.append(GenerationRequest(r.prompt_ids, tuple(response[:o]), max_tokens - o,
                                                      tag=("cont", i, j, o)))
    return requests


def _build_trees(batch: _Batch) -> list[PromptTree]:
    trees = []
    for i, rolls in enumerate(batch.initial):
        tree = PromptTree(rolls[0].prompt_ids)
        for j, r in enumerate(rolls):
            offsets = batch.branches.get((i, j), [])
            conts = {o: batch.continuations.get((i, j, o), []) for o in offsets}
            tree.add_response(r.response_ids, r.logprobs, batch.rewards[i][j], {o: c for o, c in conts.items() if c})
        trees.append(tree)
    return trees


def _train_tree(method, policy, ref, task, cfg, optimizer, rng, sample, score, record, state) -> None:
    n = cfg.samples_per_prompt
    scheduler = OffPolicyScheduler(cfg.off_policy)
    fci_of_solved = RunningMean() if cfg.ads.attention_filter else None
    step_score_fn = functools.partial(fci_scores, delta=cfg.delta, zero_first_step=cfg.zero_first_step) \
        if method == "attnrl" else None
    max_tokens = cfg.max_response_tokens or task.max_response_chars()
    batches: dict[int, _Batch] = {}
    batch_size = cfg.prompts_per_batch
    updates = 0
    while True:
        pending = None if scheduler.pending_batch is None else batches[scheduler.pending_batch]
        call = scheduler.next_call(_may_start_batch(state, cfg, updates, batch_size, pending))
        if call is None:
            break
        t0 = time.perf_counter()
        requests: list[GenerationRequest] = []
        if call.continuation_batch is not None:
            cont_batch = batches[call.continuation_batch]
            requests += _plan_continuations(method, cont_batch, cfg, rng, fci_of_solved, max_tokens)
        if call.initial_batch is not None:
            problems = task.sample(rng, batch_size)
            batches[call.initial_batch] = _Batch(problems)
            requests += [GenerationRequest(tuple(policy.codec.encode(p.prompt)), tag=("init", i, j))
                         for i, p in enumerate(problems) for j in range(n)]
        rollouts = sample(requests, call.policy_version, step_score_fn)
        tokens_this_call = sum(r.num_generated for r in rollouts)
        if call.initial_batch is not None:
            b = batches[call.initial_batch]
            init = [r for r in rollouts if r.tag[0] == "init"]
            b.initial_tokens = sum(r.num_generated for r in init)
            b.initial = [init[i * n:(i + 1) * n] for i in range(len(b.problems))]
            b.rewards = [[score(p, r) for r in rolls] for p, rolls in zip(b.problems, b.initial)]
        if call.continuation_batch is None:
            continue
        b = batches.pop(call.continuation_batch)
        state["finished_tokens"] += b.initial_tokens + sum(r.num_generated for r in rollouts if r.tag[0] == "cont")
        state["finished_prompts"] += len(b.problems)
        for r in rollouts:
            if r.tag[0] == "cont":
                _, i, j, o = r.tag
                b.continuations.setdefault((i, j, o), []).append(
                    Branch(r.generated_ids, r.logprobs, score(b.problems[i], r)))
        trees = _build_trees(b)
        kept = [t for t in trees if t.has_signal()] if cfg.ads.zero_advantage_filter else trees
        sequences = [s for t in kept for s in training_paths(t)]
        stats = ppo_update(policy, ref, optimizer, sequences, cfg, rng)
        scheduler.record_update()
        updates += 1
        leaves = [x for t in trees for x in t.leaf_rewards()]
        metrics = {"update": updates, "prompts": len(b.problems),
                   "mean_reward": sum(map(sum, b.rewards)) / (n * len(b.problems)),
                   "mean_leaf_reward": sum(leaves) / max(len(leaves), 1),
                   "valid_prompt_ratio": sum(t.has_signal() for t in trees) / len(trees),
                   "expanded_responses": sum(1 for offsets in b.branches.values() if offsets),
                   "continuations": sum(len(c) for c in b.continuations.values()),
                   "train_sequences": len(sequences), "train_tokens": sum(len(s.response_ids) for s in sequences),
                   "valid_train_tokens": _valid_tokens(sequences),
                   "call_tokens": tokens_this_call, "seconds": time.perf_counter() - t0}
        if cfg.ads.adaptive_batch:
            batch_size = adaptive_batch_size(batch_size, len(sequences), cfg.target_valid_paths, cfg.ads.lam,
                                             cfg.min_prompts_per_batch, cfg.max_prompts_per_batch)
        metrics["next_prompts_per_batch"] = batch_size
        record(metrics | stats)
