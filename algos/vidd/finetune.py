"""The single-process reference driver: VIDD and its baselines at one reward-query budget, in one process.

    result = finetune("vidd", pretrained, reward_fn, VIDDConfig(query_budget=8192))

Methods (:data:`algos.vidd.config.METHODS`): ``vidd`` (Algorithm 1, :mod:`algos.vidd.vidd`), ``standard_ft`` (the
same with roll-ins from p_pre and a teacher that stays p_pre: one-shot distillation of p_pre's soft-optimal policy),
``ddpo`` (clipped policy gradient over the denoising chain, :mod:`algos.vidd.ddpo`) and ``best_of_n`` (test-time
selection from p_pre). The cluster experiment (``experiments/vidd``) distributes the same steps over a sampler pool
and a Ray Train learner; tests and benchmarks use this driver.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor, nn

from algos.vidd import ddpo
from algos.vidd.config import Method, VIDDConfig
from algos.vidd.oracle import RewardCounter, RewardFn
from algos.vidd.sampling import sample
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
    the selected outputs of best-of-N (``None`` otherwise). ``reward_queries``: distinct oracle calls."""

    method: str
    model: nn.Module
    reward_queries: int
    iterations: int
    history: list[dict] = field(default_factory=list)
    reward_info: dict = field(default_factory=dict)
    samples: Tensor | None = None
    sample_rewards: Tensor | None = None


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
    """For each of ``n_outputs`` outputs keep the best of ``n_candidates`` samples; ``(tokens, rewards)``."""
    if n_outputs < 1 or n_candidates < 1:
        raise ValueError(f"best_of_n needs n_outputs, n_candidates >= 1, got {n_outputs}, {n_candidates}")
    tokens = sample_fn(model, n_outputs * n_candidates, length, T, generator, record_trajectory=False).tokens
    rewards, _ = reward_fn(tokens)
    rewards = rewards.reshape(n_outputs, n_candidates)
    best = rewards.argmax(dim=1)
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
) -> FinetuneResult:
    """Run ``method`` in one process; ``sample_fn`` (signature of :func:`algos.vidd.sampling.sample`) may be remote.

    ``reward_fn`` is queried only through a :class:`RewardCounter`, so ``reward_queries`` is exact and
    never exceeds ``cfg.query_budget``. ``pretrained`` is never modified. ``seed`` seeds every random draw.
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
                              samples=tokens, sample_rewards=rewards)

    student = copy.deepcopy(pretrained).train()
    for p in student.parameters():
        p.requires_grad_(True)
    teacher = frozen_copy(pretrained)
    optimizer = torch.optim.Adam(student.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
    history: list[dict] = []
    iteration = 0
    for iteration in range(1, cfg.max_iterations + 1):
        if method == "ddpo":
            if counter.remaining < 1:
                iteration -= 1
                break
            metrics = ddpo_iteration(student, optimizer, counter, cfg, generator, sample_fn)
        else:
            if counter.remaining < 2:
                iteration -= 1
                break
            metrics = vidd_iteration(student, pre, teacher, optimizer, counter, cfg, generator, sample_fn)
            if refresh_due(cfg, iteration):
                refresh_teacher(teacher, student)
                metrics["teacher_refreshed"] = 1.0
        metrics["reward_queries"] = counter.n_queries
        if eval_fn is not None and cfg.eval_every and iteration % cfg.eval_every == 0:
            metrics.update({f"eval/{k}": v for k, v in eval_fn(student).items()})
        history.append({"iteration": iteration} | metrics)
        if log_fn is not None:
            log_fn(iteration, metrics)
    student.eval()
    if eval_fn is not None:
        history.append({"iteration": iteration, "final": 1.0} | {f"eval/{k}": v for k, v in eval_fn(student).items()})
    return FinetuneResult(method, student, counter.n_queries, iteration, history, dict(counter.info))


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
    batch, _ = collect_vidd_batch(
        teacher, value_model, states, steps, reward_fn, generator, max_queries=reward_fn.remaining,
        value_estimator=cfg.value_estimator, greedy_tokens_per_step=cfg.greedy_tokens_per_step,
        next_value=cfg.next_value, states_from_teacher=rollin_is_teacher_sample(with_teacher, cfg),
        keep_teacher_log_probs=cfg.exact_teacher_term,
    )
    student.train()
    metrics = vidd_update(student, optimizer, batch, cfg)
    metrics["rollin_from_teacher"] = float(with_teacher)
    metrics["value_next_mean"] = batch.v_next[batch.changed].mean().item() if batch.changed.any() else float("nan")
    return metrics


def ddpo_iteration(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    reward_fn: RewardCounter,
    cfg: VIDDConfig,
    generator: torch.Generator,
    sample_fn: SampleFn,
) -> dict:
    """Sample from the current policy, score ``x_0`` (one query per distinct sample), PPO-clip updates."""
    n = int(min(cfg.batch_size, reward_fn.remaining))
    states = sample_fn(policy, n, policy.seq_len, cfg.num_sampling_steps, generator, record_trajectory=True).states
    rewards, _ = reward_fn(states[-1])
    metrics: dict = {"reward_mean": rewards.mean().item(), "reward_max": rewards.max().item()}
    metrics.update(ddpo.ddpo_update(policy, optimizer, states, ddpo.normalized_advantages(rewards), cfg, generator))
    return metrics
