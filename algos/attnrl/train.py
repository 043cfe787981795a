"""The single-process reference driver for ``attnrl``, ``grpo`` and ``entropy_tree``.

The driver only talks to the sampler through ``generate_fn`` (default :func:`algos.attnrl.lm.generate`), whose
inputs are the policy and a list of :class:`~algos.attnrl.lm.GenerationRequest` and whose output is plain
:class:`~algos.attnrl.lm.Rollout` data, so a pool of remote samplers can replace it without touching the algorithm.
"""

from __future__ import annotations

from typing import Callable

from algos.attnrl.config import RLConfig
from algos.attnrl.grpo import train_grpo
from algos.attnrl.lm import Policy
from algos.attnrl.training_run import GenerateFn, TrainingRun
from algos.attnrl.tree_rl import train_tree


def train(method: str, policy: Policy, ref: Policy, task, cfg: RLConfig | None = None,
          generate_fn: GenerateFn | None = None, log_fn: Callable[[dict], None] | None = None) -> dict:
    """Train ``policy`` with ``method`` for at most ``cfg.token_budget`` generated tokens (or ``max_updates``).

    Every sampled token counts (initial samples, continuations, and samples never trained on); a batch starts only
    if its worst case fits in what is left of the budget, so the run ends at or below it
    (:mod:`algos.attnrl.budget`); a budget below one batch's worst case is refused (ValueError).

    ``task`` provides ``sample(rng, n)``, ``reward(problem, text, finished)`` and ``max_response_chars()``
    (:class:`envs.reasoning.task.ReasoningTask`). ``generate_fn(policy, requests, max_new_tokens, temperature,
    generator, step_score_fn)`` samples rollouts; swap it for a remote sampler. ``log_fn`` receives one metrics
    dict per update. Returns ``{"history", "generated_tokens", "updates"}``.
    """
    cfg = (cfg or RLConfig()).resolved(method)
    ref.model.eval()
    for p in ref.model.parameters():
        p.requires_grad_(False)
    run = TrainingRun(method, policy, ref, task, cfg, generate_fn, log_fn)
    if method == "grpo":
        train_grpo(run)
    else:
        train_tree(run)
    return {"history": run.history, "generated_tokens": run.tokens, "updates": len(run.history)}
