"""Hyper-parameters of VIDD and of the baselines it is compared with at one reward-query budget.

Plain dataclasses and no torch, so a driver can validate a config before it imports anything heavy. The cluster
experiment's config (``experiments/vidd/config.py``) extends :class:`VIDDConfig`: every field here is also an
``experiment.<field>`` key, checked by the same ``__post_init__``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Literal

# the reward fine-tuning methods; a method's index here is its ``method_id`` in the cluster experiment's metrics
# (append only: stored metrics keep their ids). The paper's baselines: best-of-N (inference time), standard
# fine-tuning, DDPO, DDPP (Rector-Brooks et al. 2024) and the reward-weighted MLE of the released protein scripts.
METHODS: tuple[str, ...] = ("vidd", "best_of_n", "standard_ft", "ddpo", "ddpp", "rw_mle")
Method = Literal["vidd", "best_of_n", "standard_ft", "ddpo", "ddpp", "rw_mle"]
# the methods that distill x0 given x_t (algos.vidd.x0_losses) rather than one reverse step (eq. 7)
X0_METHODS: tuple[str, ...] = ("ddpp", "rw_mle")
# value_scheme -> (next_value, value_model) it sets; "custom" keeps the fields as given
VALUE_SCHEMES: dict[str, tuple[str, str]] = {"official": ("denoised", "student"), "alg1": ("denoised", "teacher"),
                                             "hybrid": ("completion", "teacher")}
VALUE_SCHEMES_ALL: tuple[str, ...] = (*VALUE_SCHEMES, "custom")


@dataclass
class VIDDConfig:
    """VIDD (Algorithm 1) and its baselines (laptop-sized defaults).

    Roles of the three denoisers: ``p_pre`` the pretrained model (frozen), the student ``p_theta`` (trained) and the
    teacher ``p_out`` (Alg. 1's roll-out policy: draws the next states whose values weight the distillation; a copy
    of the student refreshed every ``refresh_interval`` iterations).
    """

    key_prefix: ClassVar[str] = "VIDDConfig."  # how error messages name a field (the experiment: "experiment.")

    alpha: float = 0.1  # temperature of the soft-optimal policy (reward units)
    beta: float = 1.0  # probability that a roll-in batch comes from the teacher (else from p_pre)
    refresh_interval: int | None = 5  # K: copy the student into the teacher every K iterations; None = never
    # roll-in steps distilled per trajectory; None = all T (the official DNA code, finetune_reward.py:250-257)
    timesteps_per_trajectory: int | None = None
    batch_size: int = 32  # roll-in trajectories (VIDD) / sampled trajectories (DDPO) per iteration
    max_iterations: int = 100  # cap; runs normally stop when the budget is spent
    query_budget: int | None = None  # distinct sequences sent to the oracle; training stops before exceeding it
    lr: float = 1e-4
    updates_per_batch: int = 1  # gradient steps per collected batch; the weights do not depend on theta,
    # so re-using a batch needs no importance correction (1 = the paper)
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    num_sampling_steps: int = 32  # T of the ancestral sampler used for roll-ins
    # Alg. 1 values with p_out; the DNA code with the student. None: as value_scheme sets it
    value_model: Literal["teacher", "student"] | None = None
    # the value estimator by name (algos/vidd/README.md); a named scheme sets next_value, value_model and whether the
    # roll-out draws a fresh teacher step, "custom" leaves those three fields as given:
    # "official": a fresh xbar ~ p_out(. | x_t) at every step, both values r(x0hat) of the student's one-step
    #   prediction (losses/rl_loss.py:126,171-211; scripts/dna.sh:14 --rs_gen_model new)
    # "alg1": Algorithm 1 as written: values r(x0hat) of p_out; a teacher roll-in's own next state is the draw
    # "hybrid": numerator r of the trajectory's own final sample, denominator the one-step r(x0hat(x_t))
    value_scheme: Literal["official", "alg1", "hybrid", "custom"] = "official"
    # bookkeeping, not a setting: the scheme that filled next_value/value_model, so that dataclasses.replace with
    # another scheme can tell them from values a user gave
    scheme_resolved: str | None = field(default=None, repr=False, compare=False)
    # x0hat for v(x) = r(x0hat(x)): "one_step" argmax (Alg. 1, DNA code) or "greedy" iterative decoding
    # with greedy_tokens_per_step tokens per pass (protein code); both cost one reward query per state
    value_estimator: Literal["one_step", "greedy"] = "one_step"
    greedy_tokens_per_step: int = 4
    # v(xbar_{t-1}): "denoised" = same estimator as v(x_t) (Alg. 1); "completion" = r(x0) of one completion
    # x0 ~ p_out(. | xbar_{t-1}), unbiased for exp(v*/alpha) (released protein code)
    next_value: Literal["denoised", "completion"] | None = None  # None: as value_scheme sets it
    max_log_weight: float | None = None  # clamp (v_next - v_cur) / alpha from above; None = exact weights
    # Weights are computed in log space and normalised by log-sum-exp to mean 1 over the batch's transitions (with
    # exact soft values E[w | x_t] = 1, so this is the self-normalised estimate of eq. 7 and never overflows; one
    # batch-wide constant changes the step little under Adam). True: normalise within each reverse step t instead
    # (a per-step self-normalised estimate: estimated values are biased per step)
    self_normalize_weights: bool = False
    # ablation: w = exp(v(xbar_{t-1}) / alpha) without the denominator exp(v(x_t) / alpha); v(x_t) is then never
    # queried (with next_value="completion": one oracle call per trajectory instead of about T + 1)
    value_denominator: bool = True
    # what the student distills: "next_state" = log p_theta(xbar_{t-1} | x_t) (eq. 7); "final_sample" = log
    # p_theta(x0 | x_t) of the roll-in's own final sample x0 at the selected steps (the released protein code's
    # RW_MLE loss with use_value_xt: weight r(x0) over v(x_t), clamped to [1e-6, 1e6] and standardised)
    distill_target: Literal["next_state", "final_sample"] = "next_state"
    # standardise the final-sample weights ((w - mean) / std, as the released code's reward_norm=normal; weights
    # can then be negative): used by distill_target="final_sample" and rw_mle
    standardize_weights: bool = True
    # control variate (not in the paper): write w = 1 + (w - 1) and replace the "1" part, plain MLE on
    # p_out's samples, by its exact expectation q * sum_masked CE(p_out(x0|x_t), p_theta(x0|x_t)); the
    # expected gradient is unchanged, the sampling noise that makes the student drift is removed. Exact when the
    # weights average 1 per state (per-step normalisation); with batch-wide weights (mean 1 over the batch) it is an
    # approximation, no longer tied to self_normalize_weights (issue 37: forcing it made groups of one)
    exact_teacher_term: bool = False
    # per-step normalisation is refused unless every step's group has >= this many transitions
    min_step_group: ClassVar[int] = 8
    # True only to rebuild the issue-24 studies' hybrid (per-step weights over one random step per trajectory), whose
    # records were made that way; never for new runs
    legacy_small_step_groups: bool = False
    # DDPO baseline (the released code: ratio clip 1e-4, one step per batch, old policy = the previous iteration's
    # model; here theta_old = theta at one inner step: see algos/vidd/README.md)
    ddpo_clip: float = 0.2
    ddpo_inner_steps: int = 2
    ddpo_lr: float | None = None  # None = lr
    ddpo_variant: str = "orrery"  # "official": theta_old = the previous iteration's policy, x0 log-probs (ddpo.py)
    # DDPP baseline: roll-ins from the current policy with probability beta, else p_pre (the DNA script: 0, p_pre only);
    # log Z(x_t) estimated by v(x_t) / alpha with v = r(x0hat(x_t; p_pre)) as in the released code
    # best-of-N baseline: number of selected outputs; N = query_budget // best_of_n_outputs
    best_of_n_outputs: int = 64
    eval_every: int = 0  # evaluate every this many iterations (0: only at the end)

    def __post_init__(self) -> None:
        check = self._check
        check(self.alpha > 0, "alpha", "must be > 0")
        check(0.0 <= self.beta <= 1.0, "beta", "must lie in [0, 1]")
        check(self.refresh_interval is None or self.refresh_interval >= 1, "refresh_interval", "must be >= 1 or None")
        for name in ("batch_size", "max_iterations", "num_sampling_steps", "updates_per_batch", "ddpo_inner_steps",
                     "best_of_n_outputs", "greedy_tokens_per_step"):
            check(getattr(self, name) >= 1, name, "must be >= 1")
        check(self.timesteps_per_trajectory is None or 1 <= self.timesteps_per_trajectory <= self.num_sampling_steps,
              "timesteps_per_trajectory", f"must lie in [1, num_sampling_steps={self.num_sampling_steps}] or be None")
        check(self.query_budget is None or self.query_budget >= 1, "query_budget", "must be >= 1 or None")
        for name in ("lr", "grad_clip", "ddpo_clip"):
            check(getattr(self, name) > 0, name, "must be > 0")
        check(self.ddpo_lr is None or self.ddpo_lr > 0, "ddpo_lr", "must be > 0 or None")
        check(self.ddpo_variant in ("orrery", "official"), "ddpo_variant", "must be 'orrery' or 'official'")
        check(self.ddpo_variant != "official" or self.ddpo_inner_steps == 1, "ddpo_variant",
              f"'official' takes ddpo_inner_steps=1 (its theta_old is the previous iteration's; ddpo_inner_steps "
              f"is {self.ddpo_inner_steps})")
        check(self.value_estimator in ("one_step", "greedy"), "value_estimator", "must be 'one_step' or 'greedy'")
        check(self.value_scheme in VALUE_SCHEMES_ALL, "value_scheme", f"must be one of {VALUE_SCHEMES_ALL}")
        if self.value_scheme == "custom":
            for name in ("next_value", "value_model"):
                check(getattr(self, name) is not None, name, "value_scheme='custom' needs it set")
        else:  # a named scheme sets both; a value given that contradicts it is refused, never silently replaced
            if self.scheme_resolved is not None and (self.next_value, self.value_model) == VALUE_SCHEMES.get(
                    self.scheme_resolved):  # set by an earlier scheme (dataclasses.replace of a resolved config)
                self.next_value = self.value_model = None
            for name, wanted in zip(("next_value", "value_model"), VALUE_SCHEMES[self.value_scheme]):
                check(getattr(self, name) in (None, wanted), name,
                      f"{getattr(self, name)!r} contradicts value_scheme={self.value_scheme!r}, which sets {wanted!r} "
                      f"(value_scheme='custom' to choose it)")
            self.next_value, self.value_model = VALUE_SCHEMES[self.value_scheme]
        self.scheme_resolved = self.value_scheme if self.value_scheme != "custom" else None
        check(self.next_value in ("denoised", "completion"), "next_value", "must be 'denoised' or 'completion'")
        check(self.value_model in ("teacher", "student"), "value_model", "must be 'teacher' or 'student'")
        # a step's group is the trajectories distilled at that step: all of them only when every step is distilled
        # (with k < T random steps, groups of ~batch_size * k / T, often 1, whose weight is forced to 1)
        if self.self_normalize_weights and not self.legacy_small_step_groups and (self.batch_size < self.min_step_group or (
                self.timesteps_per_trajectory not in (None, self.num_sampling_steps))):
            raise ValueError(f"{self.key_prefix}self_normalize_weights: per-step groups need >= {self.min_step_group} "
                             f"members: set {self.key_prefix}timesteps_per_trajectory=None (got "
                             f"{self.timesteps_per_trajectory}) and {self.key_prefix}batch_size >= "
                             f"{self.min_step_group} (got {self.batch_size}), or self_normalize_weights=False")
        check(self.eval_every >= 0, "eval_every", "must be >= 0 (0 = only at the end)")
        check(self.distill_target in ("next_state", "final_sample"), "distill_target",
              "must be 'next_state' or 'final_sample'")
        check(self.distill_target == "next_state" or not self.exact_teacher_term, "exact_teacher_term",
              "applies to distill_target='next_state' only")

    def _check(self, ok: bool, key: str, rule: str) -> None:
        if not ok:
            raise ValueError(f"{self.key_prefix}{key}: {rule}, got {getattr(self, key)!r}")

    @property
    def steps_per_trajectory(self) -> int:
        return self.timesteps_per_trajectory or self.num_sampling_steps

    @property
    def fresh_rollout(self) -> bool:
        """Whether every distilled step draws a fresh teacher step, even from a teacher roll-in (the official code)."""
        return self.value_scheme == "official"

    @property
    def queries_value_states(self) -> bool:
        """Whether the roll-in states x_t are sent to the oracle (for v(x_t)); not in the no-denominator ablation."""
        return self.value_denominator

    def for_method(self, method: str) -> "VIDDConfig":
        """The settings ``method`` runs with: standard fine-tuning is VIDD with roll-ins from p_pre and a teacher that
        stays p_pre (one-shot distillation of p_pre's soft-optimal policy); DDPO trains at ``ddpo_lr``; DDPP rolls in
        with the current policy (the teacher refreshed every iteration) or p_pre; RW_MLE distills the roll-in's final
        samples weighted by their reward alone."""
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if method == "standard_ft":
            return dataclasses.replace(self, beta=0.0, refresh_interval=None)
        if method == "ddpo":
            return dataclasses.replace(self, lr=self.ddpo_lr or self.lr)
        if method == "ddpp":
            return dataclasses.replace(self, refresh_interval=1, distill_target="final_sample",
                                       exact_teacher_term=False)
        if method == "rw_mle":
            return dataclasses.replace(self, distill_target="final_sample", value_denominator=False,
                                       exact_teacher_term=False)
        return self
