"""Supervised pretraining of the policy on reference solutions, and greedy accuracy by difficulty.

RL needs a policy that is good but not perfect: pretraining stops as soon as greedy accuracy on the shortest
problems reaches ``target_short_accuracy``; per-step errors then compound, so long problems stay mostly unsolved.
"""

from __future__ import annotations

import logging
import math
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from algos.lm import GenerationRequest, Policy, forward_scores, generate

log = logging.getLogger(__name__)


@dataclass
class SFTConfig:
    max_steps: int = 3000
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eval_every: int = 50
    eval_problems_per_difficulty: int = 32
    short_difficulty: int = 1  # problems with at most this many steps are "short"
    target_short_accuracy: float = 0.9  # stop once greedy accuracy on short problems reaches this
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("max_steps", "batch_size", "eval_every", "eval_problems_per_difficulty", "short_difficulty"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0.0 < self.target_short_accuracy <= 1.0:
            raise ValueError(f"target_short_accuracy must be in (0, 1], got {self.target_short_accuracy}")


@dataclass
class EvalResult:
    accuracy: float
    by_difficulty: dict[int, float] = field(default_factory=dict)
    generated_tokens: int = 0


def evaluate_accuracy(policy: Policy, task, problems: Sequence, max_new_tokens: int | None = None,
                      temperature: float = 0.0, generator: torch.Generator | None = None,
                      max_batch_size: int = 256) -> EvalResult:
    """Accuracy (greedy by default) of ``policy`` on ``problems``, overall and per difficulty."""
    requests = [GenerationRequest(tuple(policy.codec.encode(p.prompt))) for p in problems]
    rollouts = generate(policy, requests, max_new_tokens or task.max_response_chars(), temperature, generator,
                        max_batch_size=max_batch_size)
    per_difficulty = defaultdict(list)
    for p, r in zip(problems, rollouts):
        per_difficulty[p.difficulty].append(task.reward(p, policy.codec.decode(r.response_ids), r.finished))
    scores = [s for v in per_difficulty.values() for s in v]
    return EvalResult(accuracy=sum(scores) / max(len(scores), 1),
                      by_difficulty={d: sum(v) / len(v) for d, v in sorted(per_difficulty.items())},
                      generated_tokens=sum(r.num_generated for r in rollouts))


def sft_loss(policy: Policy, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> torch.Tensor:
    """Token-mean negative log-likelihood of the reference responses (prompt tokens are not trained)."""
    scores = forward_scores(policy, prompts, responses)
    return -(scores.logprobs.sum() / scores.mask.sum())


def pretrain(policy: Policy, task, cfg: SFTConfig | None = None,
             log_fn: Callable[[dict], None] | None = None) -> dict:
    """Adam on freshly sampled problems (all difficulties) until the short-problem accuracy target is met."""
    cfg = cfg or SFTConfig()
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    eval_rng = random.Random(cfg.seed + 1)
    eval_problems = [p for d in range(task.cfg.min_steps, task.cfg.max_steps + 1)
                     for p in task.sample(eval_rng, cfg.eval_problems_per_difficulty, difficulty=d)]
    short = [p for p in eval_problems if p.difficulty <= cfg.short_difficulty]
    model, codec = policy.model, policy.codec
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / cfg.warmup_steps) * 0.5 * (1 + math.cos(math.pi * min(s / cfg.max_steps, 1))))
    eos = [codec.eos_id]
    history = []
    step = 0
    for step in range(1, cfg.max_steps + 1):
        model.train()
        batch = task.sample(rng, cfg.batch_size)
        loss = sft_loss(policy, [codec.encode(p.prompt) for p in batch],
                        [codec.encode(p.solution) + eos for p in batch])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        if step % cfg.eval_every == 0:
            short_acc = evaluate_accuracy(policy, task, short).accuracy
            record = {"step": step, "loss": float(loss), "short_accuracy": short_acc}
            history.append(record)
            log.info("sft %s", record)
            if log_fn:
                log_fn(record)
            if short_acc >= cfg.target_short_accuracy:
                break
    model.eval()
    final = evaluate_accuracy(policy, task, eval_problems)
    return {"steps": step, "history": history, "accuracy": final.accuracy, "by_difficulty": final.by_difficulty}
