"""The single-process reference driver: VIDD and its baselines at one reward-query budget, in one process.

    result = finetune("vidd", pretrained, reward_fn, VIDDConfig(query_budget=8192))

Methods (:data:`algos.vidd.config.METHODS`): ``vidd`` (Algorithm 1, :mod:`algos.vidd.vidd`; with
``distill_target="final_sample"`` the released protein code's variant, :mod:`algos.vidd.x0_losses`), ``standard_ft``
(the same with roll-ins from p_pre and a teacher that stays p_pre: one-shot distillation of p_pre's soft-optimal
policy), ``ddpo`` (clipped policy gradient over the denoising chain, :mod:`algos.vidd.ddpo`), ``ddpp`` and ``rw_mle``
(:mod:`algos.vidd.x0_losses`) and ``best_of_n`` (test-time selection from p_pre). The cluster experiment
(``experiments/vidd``) distributes the same steps over a sampler pool and a Ray Train learner; tests and benchmarks use
this driver.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from algos.vidd import ddpo
from algos.vidd.config import Method, VIDDConfig
from algos.vidd.oracle import RewardCounter, RewardFn
from algos.vidd.sampling import sample
from algos.vidd.x0_losses import collect_x0_batch, value_model_role, x0_update
from algos.vidd.vidd import (
    SampleFn,
    collect_vidd_batch,
    refresh_due,
    refresh_teacher,
    rollin,
    rollin_is_teacher_sample,
    select_steps,
    vidd_update,
)


@dataclass
class FinetuneResult:
    """``model``: the fine-tuned policy (the pretrained one for best-of-N). ``samples``/``sample_rewards``:
    the selected outputs of best-of-N (``None`` otherwise). ``reward_queries``: distinct oracle calls;
    ``trajectories``: roll-in (or sampled) trajectories the method drew."""

    method: str
    model: nn.Module
    reward_queries: int
    iterations: int
    history: list[dict] = field(default_factory=list)
    reward_info: dict = field(default_factory=dict)
    samples: Tensor | None = None
    sample_rewards: Tensor | None = None
    trajectories: int = 0


@torch.no_grad()
def best_of_n(
    model: nn.Module,
    reward_fn: RewardFn,
    n_outputs: int,
    n_candidates: int,
    length: int,
    T: int,
    generator: torch.Generator | None = None,
    sample_fn: SampleFn = sample,
) -> tuple[Tensor, Tensor]:
    """For each of ``n_outputs`` outputs keep the best of ``n_candidates`` samples; ``(tokens, rewards)``. A candidate
    whose reward is NaN (non-finite oracle answer) is never selected unless all of its output's are."""
    if n_outputs < 1 or n_candidates < 1:
        raise ValueError(f"best_of_n needs n_outputs, n_candidates >= 1, got {n_outputs}, {n_candidates}")
    tokens = sample_fn(model, n_outputs * n_candidates, length, T, generator, record_trajectory=False).tokens
    rewards, _ = reward_fn(tokens)
    rewards = torch.as_tensor(rewards).reshape(n_outputs, n_candidates)
    best = rewards.nan_to_num(-math.inf).argmax(dim=1)
    tokens = tokens.reshape(n_outputs, n_candidates, -1)[torch.arange(n_outputs), best]
    return tokens, rewards[torch.arange(n_outputs), best]


def frozen_copy(model: nn.Module) -> nn.Module:
    clone = copy.deepcopy(model).eval()
    for p in clone.parameters():
        p.requires_grad_(False)
    return clone


def finetune(
    method: Method,
    pretrained: nn.Module,
    reward_fn: RewardFn,
    cfg: VIDDConfig,
    sample_fn: SampleFn | None = None,
    log_fn: Callable[[int, dict], None] | None = None,
    eval_fn: Callable[[nn.Module], dict] | None = None,
    seed: int = 0,
    eval_at_queries: Sequence[int] = (),
    final_eval: bool = True,
    stop_fn: Callable[[int, dict], bool] | None = None,
) -> FinetuneResult:
    """Run ``method`` in one process; ``sample_fn`` (signature of :func:`algos.vidd.sampling.sample`) may be remote.

    ``reward_fn`` is queried only through a :class:`RewardCounter`, so ``reward_queries`` is exact and
    never exceeds ``cfg.query_budget``. ``pretrained`` is never modified. ``seed`` seeds every random draw.
    ``eval_fn`` runs every ``cfg.eval_every`` iterations, after the first iteration that reaches each of
    ``eval_at_queries`` oracle queries, and at the end (unless ``final_eval`` is False: a caller that evaluates the
    returned model itself, on a larger sample, skips the duplicate). ``stop_fn(iteration, metrics)``, called after
    ``log_fn``, ends the run when it returns True (a caller's own stopping rule: a CPU-time cap, a plateau).
    """
    cfg = cfg.for_method(method)
    sample_fn = sample_fn or sample
    generator = torch.Generator().manual_seed(seed)
    counter = RewardCounter(reward_fn, cfg.query_budget)
    length = pretrained.seq_len
    pre = frozen_copy(pretrained)

    if method == "best_of_n":
        if cfg.query_budget is None:
            raise ValueError("best_of_n needs VIDDConfig.query_budget (its N is budget // outputs)")
        n_candidates = cfg.query_budget // cfg.best_of_n_outputs
        if n_candidates < 1:
            raise ValueError("VIDDConfig.query_budget is smaller than best_of_n_outputs")
        tokens, rewards = best_of_n(
            pre, counter, cfg.best_of_n_outputs, n_candidates, length, cfg.num_sampling_steps, generator, sample_fn
        )
        return FinetuneResult(method, pre, counter.n_queries, 0, reward_info=dict(counter.info),
                              samples=tokens, sample_rewards=rewards,
                              trajectories=cfg.best_of_n_outputs * n_candidates)

    student = copy.deepcopy(pretrained).train()
    for p in student.parameters():
        p.requires_grad_(True)
    teacher = frozen_copy(pretrained)
    optimizer = torch.optim.Adam(student.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
    history: list[dict] = []
    milestones = sorted(eval_at_queries)
    trajectories = iteration = 0
    since_refresh = 0.0  # distilled transitions since the last teacher refresh (a diagnostic, issue 37)
    for iteration in range(1, cfg.max_iterations + 1):
        # an iteration needs one query (DDPO: a sample; RW_MLE: a final sample) or a value pair
        if counter.remaining < (1 if method in ("ddpo", "rw_mle") else 2):
            iteration -= 1
            break
        if method == "ddpo":
            old = ddpo.previous_iterate(teacher, student) if cfg.ddpo_variant == "official" else None
            metrics = ddpo_iteration(student, optimizer, counter, cfg, generator, sample_fn, old)
        elif method in ("ddpp", "rw_mle") or cfg.distill_target == "final_sample":
            metrics = x0_iteration(method, student, pre, teacher, optimizer, counter, cfg, generator, sample_fn)
        else:
            metrics = vidd_iteration(student, pre, teacher, optimizer, counter, cfg, generator, sample_fn)
        # transitions that carried a loss this iteration (DDPO: sampled trajectory steps)
        metrics["transitions_per_iteration"] = float(metrics.get("transitions", 0.0))
        since_refresh += metrics["transitions_per_iteration"]
        if method != "ddpo" and refresh_due(cfg, iteration):
            refresh_teacher(teacher, student)
            metrics["teacher_refreshed"] = 1.0
            metrics["transitions_per_refresh"] = since_refresh
            since_refresh = 0.0
        trajectories += int(metrics.pop("trajectories"))
        metrics.update(reward_queries=counter.n_queries, trajectories=trajectories)
        due = bool(cfg.eval_every and iteration % cfg.eval_every == 0)
        while milestones and counter.n_queries >= milestones[0]:
            milestones.pop(0)
            due = True
        if eval_fn is not None and due:
            metrics.update({f"eval/{k}": v for k, v in eval_fn(student).items()})
        history.append({"iteration": iteration} | metrics)
        if log_fn is not None:
            log_fn(iteration, metrics)
        if stop_fn is not None and stop_fn(iteration, metrics):
            break
    student.eval()
    if eval_fn is not None and final_eval:
        last = history[-1] if history else {}
        evaluated = {k: v for k, v in last.items() if k.startswith("eval/")}  # the last iteration's, if any
        if not evaluated:
            evaluated = {f"eval/{k}": v for k, v in eval_fn(student).items()}
        history.append({"iteration": iteration, "final": 1.0, "reward_queries": counter.n_queries,
                        "trajectories": trajectories} | evaluated)
    return FinetuneResult(method, student, counter.n_queries, iteration, history, dict(counter.info),
                          trajectories=trajectories)


def vidd_iteration(
    student: nn.Module,
    pretrained: nn.Module,
    teacher: nn.Module,
    optimizer: torch.optim.Optimizer,
    reward_fn: RewardCounter,
    cfg: VIDDConfig,
    generator: torch.Generator,
    sample_fn: SampleFn,
) -> dict:
    """Roll-in, roll-out with values, distillation (Alg. 1 lines 4-9)."""
    states, with_teacher = rollin(pretrained, teacher, cfg.batch_size, student.seq_len, cfg, generator, sample_fn)
    steps = select_steps(cfg.batch_size, cfg.num_sampling_steps, cfg.timesteps_per_trajectory, generator)
    value_model = teacher if cfg.value_model == "teacher" else frozen_copy(student)
    batch, info = collect_vidd_batch(
        teacher, value_model, states, steps, reward_fn, generator, max_queries=reward_fn.remaining,
        value_estimator=cfg.value_estimator, greedy_tokens_per_step=cfg.greedy_tokens_per_step,
        next_value=cfg.next_value, states_from_teacher=rollin_is_teacher_sample(with_teacher, cfg),
        keep_teacher_log_probs=cfg.exact_teacher_term, value_denominator=cfg.value_denominator,
    )
    student.train()
    metrics = vidd_update(student, optimizer, batch, cfg)
    metrics["rollin_from_teacher"] = float(with_teacher)
    metrics["value_next_mean"] = batch.v_next[batch.changed].mean().item() if batch.changed.any() else float("nan")
    metrics["nonfinite_skipped"] = float(info.get("n_nonfinite_skipped", 0))
    metrics["trajectories"] = float(cfg.batch_size)
    return metrics


def x0_iteration(
    method: str,
    student: nn.Module,
    pretrained: nn.Module,
    teacher: nn.Module,
    optimizer: torch.optim.Optimizer,
    reward_fn: RewardCounter,
    cfg: VIDDConfig,
    generator: torch.Generator,
    sample_fn: SampleFn,
) -> dict:
    """DDPP, RW_MLE or the released VIDD variant: roll-in (teacher w.p. beta, else p_pre; DDPP's teacher is the
    previous iteration's policy), final samples and values, one loss on log p_theta(x0 | x_t)."""
    states, with_teacher = rollin(pretrained, teacher, cfg.batch_size, student.seq_len, cfg, generator, sample_fn)
    steps = select_steps(cfg.batch_size, cfg.num_sampling_steps, cfg.timesteps_per_trajectory, generator)
    role = value_model_role(method, cfg)
    value_model = (None if role is None else pretrained if role == "pretrained" else teacher if role == "teacher"
                   else frozen_copy(student))
    batch, info = collect_x0_batch(
        value_model, student.mask_id, states, steps, reward_fn,
        max_queries=reward_fn.remaining, value_estimator="one_step" if method == "ddpp" else cfg.value_estimator,
        greedy_tokens_per_step=cfg.greedy_tokens_per_step, generator=generator)
    student.train()
    metrics = x0_update(student, optimizer, batch, cfg, pretrained if method == "ddpp" else None)
    metrics["rollin_from_teacher"] = float(with_teacher)
    metrics["reward_mean"] = batch.r_final[batch.valid].mean().item() if batch.valid.any() else float("nan")
    metrics["nonfinite_skipped"] = float(info.get("n_nonfinite_skipped", 0))
    metrics["trajectories"] = float(cfg.batch_size)
    return metrics


def ddpo_iteration(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    reward_fn: RewardCounter,
    cfg: VIDDConfig,
    generator: torch.Generator,
    sample_fn: SampleFn,
    old_policy: nn.Module | None = None,
) -> dict:
    """Sample from the current policy, score ``x_0`` (one query per distinct sample), PPO-clip updates
    (``old_policy``: the official variant's theta_old)."""
    n = int(min(cfg.batch_size, reward_fn.remaining))
    states = sample_fn(policy, n, policy.seq_len, cfg.num_sampling_steps, generator, record_trajectory=True).states
    rewards, _ = reward_fn(states[-1])
    finite = rewards[torch.isfinite(rewards)]
    metrics: dict = {"reward_mean": finite.mean().item() if len(finite) else float("nan"),
                     "reward_max": finite.max().item() if len(finite) else float("nan"), "trajectories": float(n)}
    metrics.update(ddpo.ddpo_update(policy, optimizer, states, ddpo.normalized_advantages(rewards), cfg, generator,
                                    old_policy))
    metrics.setdefault("transitions", float(n * cfg.steps_per_trajectory))
    return metrics
