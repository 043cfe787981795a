"""Settings of one RL run: the methods, the RL hyper-parameters and which Adaptive Sampling parts are on."""

from __future__ import annotations

import copy
from dataclasses import dataclass

# Appended, never reordered: experiments/attnrl stores a method as its index in this tuple.
METHODS = ("attnrl", "grpo", "entropy_tree", "attn_tree", "earliest_tree", "random_tree", "oracle_tree")

# Where each tree method branches (algos.attnrl.branching). ``attnrl`` adds Adaptive Sampling and the one-step
# off-policy pipeline; the other tree methods sample and train as TreeRL does (every response branched, on-policy,
# no filters), so they differ from ``entropy_tree`` only in the branch points: ``attn_tree`` is ATB alone, and
# ``earliest_tree`` / ``random_tree`` / ``oracle_tree`` are its controls (the two earliest steps after the first,
# random steps, the earliest steps of the answer's true dependency cone, which only a synthetic task knows).
BRANCHING_OF_METHOD = {"attnrl": "fci", "entropy_tree": "entropy", "attn_tree": "fci", "earliest_tree": "earliest",
                       "random_tree": "random", "oracle_tree": "oracle"}
BRANCHING_RULES = ("fci", "entropy", "earliest", "random", "oracle")


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
    rho: float = 0.2  # ATB: fraction of response steps (top FCI) that are branching candidates
    delta: int = 1  # paper 4 (long traces); the laptop task has 2-5 steps
    zero_first_step: bool = True  # the released code zeroes the first response step's FCI (process_attn_type set)
    min_branch_distance: int = 1  # tokens; paper 512
    branching: str | None = None  # None -> the method's rule (BRANCHING_OF_METHOD); one of BRANCHING_RULES
    temperature: float = 1.0
    max_response_tokens: int | None = None  # None -> task.max_response_chars()
    lr: float = 1e-4  # paper 1e-6 for a 1.5B model
    ppo_minibatch: int = 64  # sequences per gradient step (verl counts prompts: its 32 x n = 6 is 192 sequences)
    ppo_epochs: int = 1
    clip_low: float = 0.2
    clip_high: float = 0.28
    clip_ratio_c: float | None = 3.0  # verl's dual clip (the released code's 3.0); None: off
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
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1 (or null: no dual clip), got {self.clip_ratio_c}")
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
        if self.branching is not None and self.branching not in BRANCHING_RULES:
            raise ValueError(f"branching must be one of {BRANCHING_RULES} or None, got {self.branching!r}")

    def resolved(self, method: str) -> RLConfig:
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
        if cfg.branching is None:
            cfg.branching = BRANCHING_OF_METHOD.get(method)
        if cfg.target_valid_paths is None:
            cfg.target_valid_paths = 5 * cfg.samples_per_prompt * cfg.prompts_per_batch
        return cfg
