"""The token budget is a cap: what one batch can cost at most, per method family, known from the config alone.

Only generated tokens count (prompt tokens are not sampled). A batch starts only if its worst case fits in what is
left of the budget; when the next batch's does not, the batch is cut to the most prompts whose worst case fits
(:func:`prompts_that_fit`, called by :meth:`algos.attnrl.training_run.TrainingRun.batch_prompts`), and the run stops
only when not even one prompt fits. A run so ends at or below its budget and less than one prompt's worst case short
of it, whatever the method; a budget below one full batch's worst case is refused up front (:func:`budget_error`).
"""

from __future__ import annotations

from algos.attnrl.config import RLConfig


def grpo_worst_case_tokens(cfg: RLConfig, max_tokens: int, prompts: int | None = None) -> int:
    """GRPO: ``prompts`` x n samples, each at most ``max_tokens`` long."""
    return (prompts or cfg.prompts_per_batch) * cfg.samples_per_prompt * max_tokens


def tree_continuation_worst_case_tokens(cfg: RLConfig, max_tokens: int, prompts: int | None = None) -> int:
    """Tree methods' second call: at most every initial response branched (ADS expands at most n per prompt), at
    most ``branch_points`` points each, ``continuations_per_point`` continuations per point, each at most
    ``max_tokens`` long (a continuation's cap is ``max_tokens`` minus its prefix)."""
    return grpo_worst_case_tokens(cfg, max_tokens, prompts) * cfg.branch_points * cfg.continuations_per_point


def tree_worst_case_tokens(cfg: RLConfig, max_tokens: int, prompts: int | None = None) -> int:
    """Tree methods (attnrl, entropy_tree, ...): n initial samples per prompt plus every continuation the tree can
    make."""
    return grpo_worst_case_tokens(cfg, max_tokens, prompts) + tree_continuation_worst_case_tokens(cfg, max_tokens,
                                                                                                  prompts)


def worst_case_batch_tokens(method: str, cfg: RLConfig, max_tokens: int, prompts: int | None = None) -> int:
    """Most tokens one batch of ``prompts`` prompts (default ``cfg.prompts_per_batch``) of ``method`` can generate."""
    if method == "grpo":
        return grpo_worst_case_tokens(cfg, max_tokens, prompts)
    return tree_worst_case_tokens(cfg, max_tokens, prompts)


def prompts_that_fit(method: str, cfg: RLConfig, max_tokens: int, tokens_left: int, wanted: int) -> int:
    """The most prompts, at most ``wanted``, whose batch's worst case fits in ``tokens_left`` (0: not even one).
    The worst case is linear in the prompts, so this is ``tokens_left`` over one prompt's worst case."""
    per_prompt = worst_case_batch_tokens(method, cfg, max_tokens, prompts=1)
    return max(0, min(wanted, tokens_left // per_prompt))


def budget_error(method: str, cfg: RLConfig, max_tokens: int, prefix: str = "") -> str | None:
    """One line refusing a ``token_budget`` below one batch's worst case (None when a batch fits), naming both
    numbers and the two ways out. ``prefix`` is the config path of the RL keys (``experiment.rl.``)."""
    worst = worst_case_batch_tokens(method, cfg, max_tokens)
    if cfg.token_budget >= worst:
        return None
    how = f"{cfg.prompts_per_batch} prompts x {cfg.samples_per_prompt} samples x {max_tokens} tokens"
    if method != "grpo":
        how += f" x (1 + {cfg.branch_points} branch points x {cfg.continuations_per_point} continuations)"
    return (f"{prefix}token_budget={cfg.token_budget} is below the worst case of one {method} batch, {worst} "
            f"generated tokens ({how}), and a batch that could cross the budget never starts: raise "
            f"{prefix}token_budget to >= {worst}, or shrink {prefix}prompts_per_batch, samples_per_prompt or "
            f"max_response_tokens")
