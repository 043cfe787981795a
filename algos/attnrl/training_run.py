"""What the GRPO and tree training loops share: token-counted sampling, scoring, the PPO update, one metrics
record per update, and the rule that cuts a batch to the prompts whose worst case fits in what is left of the budget."""

from __future__ import annotations

import logging
import random
from typing import Callable, Sequence

import torch

from algos.attnrl.budget import budget_error, prompts_that_fit
from algos.attnrl.config import RLConfig
from algos.attnrl.lm import GenerationRequest, Policy, Rollout, generate
from algos.attnrl.ppo import TrainSequence, ppo_update

log = logging.getLogger(__name__)

GenerateFn = Callable[..., list[Rollout]]


class TrainingRun:
    """One RL run of ``method``: the policy and its optimizer, the frozen reference, the task and the budget.

    ``generate_fn(policy, requests, max_new_tokens, temperature, generator, step_score_fn)`` samples rollouts
    (default :func:`algos.attnrl.lm.generate`; a pool of remote samplers can stand in). Every sampled token counts
    against ``cfg.token_budget``: initial samples, continuations, and samples never trained on. A budget below
    one batch's worst case is refused (ValueError).
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
        error = budget_error(method, cfg, self.max_tokens)
        if error:
            raise ValueError(error)
        self.tokens = 0  # generated so far, every call counted
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

    def update(self, sequences: Sequence[TrainSequence]) -> dict[str, float]:
        return ppo_update(self.policy, self.ref, self.optimizer, sequences, self.cfg, self.rng)

    def record(self, metrics: dict) -> None:
        metrics |= {"method": self.method, "generated_tokens": self.tokens}
        self.history.append(metrics)
        log.info("%s", metrics)
        if self.log_fn:
            self.log_fn(metrics)

    def batch_prompts(self, updates: int, wanted: int, owed_tokens: int | None = None) -> int:
        """How many of the ``wanted`` prompts the next batch may have: all of them while its worst case fits in
        what is left of the token budget, then the most whose worst case fits, so the run ends at or below the
        budget and less than one prompt's worst case short of it; 0: stop. ``owed_tokens``: the most the pending
        off-policy batch's continuations (sampled in the same call, owed either way) can still generate; None: no
        batch pending. Only the size is cut: the batches before are drawn exactly as without a budget."""
        cfg = self.cfg
        if updates >= cfg.max_updates - (0 if owed_tokens is None else 1):
            return 0
        left = cfg.token_budget - self.tokens - (owed_tokens or 0)
        return prompts_that_fit(self.method, cfg, self.max_tokens, left, wanted)


def valid_tokens(sequences: Sequence[TrainSequence]) -> int:
    """Trained tokens that carry a learning signal: those of sequences with a nonzero advantage somewhere (the
    "valid tokens" of the paper's Table 3; zero-advantage sequences only contribute the KL term)."""
    return sum(len(s.response_ids) for s in sequences if any(a != 0.0 for a in s.advantages))
