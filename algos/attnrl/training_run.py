"""What the GRPO and tree training loops share: token-counted sampling, scoring, the PPO update, one metrics
record per update, and the rule that decides whether another batch fits the token budget."""

from __future__ import annotations

import logging
import random
from typing import Callable, Protocol, Sequence

import torch

from algos.attnrl.config import RLConfig
from algos.attnrl.lm import GenerationRequest, Policy, Rollout, generate
from algos.attnrl.ppo import TrainSequence, ppo_update

log = logging.getLogger(__name__)

GenerateFn = Callable[..., list[Rollout]]


class PendingBatch(Protocol):
    """A batch whose initial samples are drawn but whose continuations are still to come."""

    problems: list
    initial_tokens: int


class TrainingRun:
    """One RL run of ``method``: the policy and its optimizer, the frozen reference, the task and the budget.

    ``generate_fn(policy, requests, max_new_tokens, temperature, generator, step_score_fn)`` samples rollouts
    (default :func:`algos.attnrl.lm.generate`; a pool of remote samplers can stand in). Every sampled token counts
    against ``cfg.token_budget``: initial samples, continuations, and samples never trained on.
    """

    def __init__(self, method: str, policy: Policy, ref: Policy, task, cfg: RLConfig,
                 generate_fn: GenerateFn | None = None, log_fn: Callable[[dict], None] | None = None) -> None:
        self.method, self.policy, self.ref, self.task, self.cfg = method, policy, ref, task, cfg
        self.generate_fn = generate_fn or generate
        self.log_fn = log_fn
        self.rng = random.Random(cfg.seed)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.optimizer = torch.optim.Adam(policy.model.parameters(), lr=cfg.lr)
        self.max_tokens = cfg.max_response_tokens or task.max_response_chars()
        self.tokens = 0  # generated so far, every call counted
        self.finished_tokens = 0  # generated for batches sampled completely (their per-prompt cost)
        self.finished_prompts = 0
        self.history: list[dict] = []

    def sample(self, requests: list[GenerationRequest], version: int, step_score_fn=None) -> list[Rollout]:
        """Rollouts for ``requests``, sampled by the weights after ``version`` updates."""
        rollouts = self.generate_fn(self.policy, requests, self.max_tokens, self.cfg.temperature, self.generator,
                                    step_score_fn)
        for r in rollouts:
            r.policy_version = version
        self.tokens += sum(r.num_generated for r in rollouts)
        return rollouts

    def score(self, problem, rollout: Rollout) -> float:
        return self.task.reward(problem, self.policy.codec.decode(rollout.response_ids), rollout.finished)

    def finish_batch(self, num_prompts: int, tokens: int) -> None:
        """A batch is sampled completely: its cost teaches the budget rule what one prompt costs."""
        self.finished_tokens += tokens
        self.finished_prompts += num_prompts

    def update(self, sequences: Sequence[TrainSequence]) -> dict[str, float]:
        return ppo_update(self.policy, self.ref, self.optimizer, sequences, self.cfg, self.rng)

    def record(self, metrics: dict) -> None:
        metrics |= {"method": self.method, "generated_tokens": self.tokens}
        self.history.append(metrics)
        log.info("%s", metrics)
        if self.log_fn:
            self.log_fn(metrics)

    def may_start_batch(self, updates: int, next_prompts: int, pending: PendingBatch | None = None) -> bool:
        """Start a batch of ``next_prompts`` prompts only if the run is then expected to end closer to the token
        budget than by stopping. A batch's cost is estimated per prompt from the batches finished so far (initial
        samples and continuations); a ``pending`` off-policy batch still has its continuations to sample: they
        are owed either way."""
        cfg = self.cfg
        if updates >= cfg.max_updates - (1 if pending is not None else 0):
            return False
        if self.finished_prompts:
            per_prompt = self.finished_tokens / self.finished_prompts
        elif pending is not None:  # nothing finished yet: continuations cost about as much as initial samples
            per_prompt = 2.0 * pending.initial_tokens / len(pending.problems)
        else:
            return self.tokens < cfg.token_budget
        owed = 0.0 if pending is None else max(0.0, per_prompt * len(pending.problems) - pending.initial_tokens)
        return self.tokens + owed + 0.5 * per_prompt * next_prompts < cfg.token_budget


def valid_tokens(sequences: Sequence[TrainSequence]) -> int:
    """Trained tokens that carry a learning signal: those of sequences with a nonzero advantage somewhere (the
    "valid tokens" of the paper's Table 3; zero-advantage sequences only contribute the KL term)."""
    return sum(len(s.response_ids) for s in sequences if any(a != 0.0 for a in s.advantages))
