"""VIDD: value-guided iterative distillation for reward fine-tuning of masked diffusion models.

Su, Li, Uehara et al., "Iterative Distillation for Reward-Guided Fine-Tuning of Diffusion Models in
Biomolecular Design" (ICLR 2026), Algorithm 1. Per iteration ``s``:

1. **Roll-in** (:func:`rollin`). With probability ``beta`` a batch of full trajectories ``x_T .. x_0`` comes from
   the teacher ``p_out``, otherwise from the pretrained model ``p_pre`` (off-policy exploration).
2. **Roll-out** (:func:`collect_vidd_batch`). For each selected roll-in state ``x_t`` the teacher draws
   ``xbar_{t-1} ~ p_out(. | x_t)``.
3. **Soft values** from the one-step denoised prediction: ``v(x) = r(x0hat(x))`` (:func:`soft_values`).
4. **Distillation** (eq. 7, :func:`vidd_loss`, :func:`vidd_update`): minimise ``-w * log p_theta(xbar_{t-1} | x_t)``
   with ``w = exp((v(xbar_{t-1}) - v(x_t)) / alpha)`` (:func:`soft_optimal_weights`), a sample estimate of the
   per-step forward KL ``KL(p*_{t-1}(. | x_t) || p_theta(. | x_t))`` to the soft-optimal policy
   ``p*_{t-1} ∝ p_out_{t-1} exp(v_{t-1} / alpha)``. Only positions unmasked in that step carry theta.
5. **Lazy update** (:func:`refresh_teacher`). Every ``K`` iterations ``p_out <- p_theta`` (hard copy, no EMA).

The sampler (:func:`algos.vidd.sampling.sample`) and the reward oracle are separate callables so that a
distributed driver can run roll-ins and reward queries on pool workers (:func:`collect_vidd_batch`
returns plain tensors) and the loss/update on a learner; :mod:`algos.vidd.finetune` runs it all in one process.

Weights are computed in log space and normalised to mean 1 by log-sum-exp (:func:`normalized_weights`), over the
batch or within each reverse step: the raw ratio overflows float32 once ``|v' - v| / alpha > ~88``.

Variants beyond Alg. 1 (off by default; see :class:`algos.vidd.config.VIDDConfig`): ``value_estimator="greedy"``
(iterative decoding for x0hat), ``next_value="completion"`` (numerator ``exp(r(x0)/alpha)`` from one
completion of ``xbar`` under ``p_out``, as the released protein code does; unbiased for the soft value),
``exact_teacher_term`` (a control variate), ``updates_per_batch``, weight clipping, per-step normalisation,
``value_denominator=False`` (the ablation without ``v(x_t)``) and ``distill_target="final_sample"`` (the released
protein code's loss on ``log p(x0 | x_t)``, in :mod:`algos.vidd.x0_losses` with DDPP and RW_MLE).
With a weak (smoke-scale) denoiser the one-step values r(x0hat) barely move QED while the student
drifts, whereas ``next_value="completion"`` learns quickly without drift (tests/test_vidd_molecule.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np
import torch
from torch import Tensor, nn

from algos.vidd.config import VIDDConfig
from algos.vidd.mdlm import LogLinearSchedule, x0_log_probs
from algos.vidd.oracle import RewardFn, distinct_rows, largest_prefix_within
from algos.vidd.sampling import (
    SampleResult,
    complete,
    denoise_greedy,
    denoise_one_step,
    model_device,
    newly_unmasked_log_prob,
    reverse_step,
    sample,
    step_times,
)

SampleFn = Callable[..., SampleResult]


# --------------------------------------------------------------------------------------------------
# Soft values and weights
# --------------------------------------------------------------------------------------------------


def log_soft_optimal_weights(
    v_next: Tensor, v_current: Tensor | float, alpha: float, max_log_weight: float | None = None
) -> Tensor:
    """Log of eq. 7's ratio ``exp(v(xbar_{t-1}) / alpha) / exp(v(x_t) / alpha)``, optionally clamped from above."""
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    log_w = (v_next - v_current) / alpha
    if max_log_weight is not None:
        log_w = log_w.clamp(max=max_log_weight)
    return log_w


def soft_optimal_weights(
    v_next: Tensor, v_current: Tensor, alpha: float, max_log_weight: float | None = None
) -> Tensor:
    """Eq. 7's raw ratio (overflows to inf once ``(v' - v) / alpha > ~88``; the loss uses :func:`normalized_weights`)"""
    return log_soft_optimal_weights(v_next, v_current, alpha, max_log_weight).exp()


def normalized_weights(log_w: Tensor, selected: Tensor, groups: Tensor | None = None) -> Tensor:
    """``exp(log_w)`` scaled to mean 1 over the ``selected`` entries of each group (all of them when ``groups`` is
    None), by log-sum-exp: finite for any finite ``log_w``. Entries not selected get 0."""
    out = torch.zeros_like(log_w)
    keys = [None] if groups is None else groups[selected].unique()
    for key in keys:
        member = selected if key is None else selected & (groups == key)
        lw = log_w[member]
        if len(lw):
            out[member] = torch.exp(lw - torch.logsumexp(lw, 0) + math.log(len(lw)))
    return out


def per_step_normalized(weights: Tensor, t: Tensor, changed: Tensor) -> Tensor:
    """``weights`` divided by their mean over the changed transitions of the same reverse step ``t`` (in log space);
    unchanged transitions keep their value."""
    out = weights.clone()
    out[changed] = normalized_weights(weights.log(), changed, t)[changed]
    return out


def denoised_prediction(
    model: nn.Module, states: Tensor, estimator: Literal["one_step", "greedy"] = "one_step", tokens_per_step: int = 4
) -> Tensor:
    """The clean sequence ``x0hat(x)`` that the value ``v(x) = r(x0hat(x))`` scores.

    ``one_step``: the position-wise argmax of one denoiser pass (Alg. 1). On weak denoisers its early-step
    completions are atypical (runs of the most frequent token), which biases value differences;
    ``greedy`` decodes iteratively (released protein code), which keeps completions in-distribution.
    """
    if estimator == "one_step":
        return denoise_one_step(model, states)
    if estimator == "greedy":
        return denoise_greedy(model, states, tokens_per_step)
    raise ValueError(f"estimator must be 'one_step' or 'greedy', got {estimator!r}")


@torch.no_grad()
def soft_values(
    value_model: nn.Module,
    states: Tensor,
    reward_fn: RewardFn,
    estimator: Literal["one_step", "greedy"] = "one_step",
    tokens_per_step: int = 4,
) -> tuple[Tensor, dict]:
    """``v(x) = r(x0hat(x))`` (Alg. 1, roll-out): one reward query per state, no Monte Carlo, no critic."""
    rewards, info = reward_fn(denoised_prediction(value_model, states, estimator, tokens_per_step))
    return torch.as_tensor(np.asarray(rewards), dtype=torch.float32), info


# --------------------------------------------------------------------------------------------------
# Roll-in and roll-out
# --------------------------------------------------------------------------------------------------


def select_steps(
    n_trajectories: int, T: int, k: int | None, generator: torch.Generator | None = None
) -> Tensor:
    """``[n_trajectories, k]`` reverse-step indices, distinct within a trajectory (all ``T`` when ``k`` is None)."""
    if k is None or k >= T:
        return torch.arange(T).expand(n_trajectories, T)
    scores = torch.rand(n_trajectories, T, generator=generator)
    return scores.argsort(dim=1)[:, :k]


def rollin_with_teacher(beta: float, generator: torch.Generator | None = None) -> bool:
    """The roll-in coin, flipped once per batch as in the released code: True (probability ``beta``) = roll in
    with the teacher ``p_out``, False = with ``p_pre``."""
    return bool(torch.rand((), generator=generator) < beta)


def rollin_is_teacher_sample(with_teacher: bool, cfg: VIDDConfig) -> bool:
    """Whether the roll-out reuses the roll-in's next states as its teacher draws: only when they are draws of the
    teacher (rolled in with it, or any roll-in when the teacher is never refreshed and stays p_pre), and never under
    ``value_scheme="official"``, whose roll-out draws a fresh teacher step at every t (losses/rl_loss.py:126)."""
    return (with_teacher or cfg.refresh_interval is None) and not cfg.fresh_rollout


def rollin(
    pretrained: nn.Module,
    teacher: nn.Module,
    n: int,
    length: int,
    cfg: VIDDConfig,
    generator: torch.Generator | None = None,
    sample_fn: SampleFn = sample,
) -> tuple[Tensor, bool]:
    """Roll-in trajectories ``[T + 1, n, L]`` from the teacher with probability ``beta``, else from ``p_pre``.

    Returns ``(states, with_teacher)``.
    """
    with_teacher = rollin_with_teacher(cfg.beta, generator)
    policy = teacher if with_teacher else pretrained
    result = sample_fn(policy, n, length, cfg.num_sampling_steps, generator, record_trajectory=True)
    return result.states, with_teacher


@dataclass
class VIDDBatch:
    """Roll-out transitions with their soft values; plain tensors, so it can cross process boundaries."""

    x_t: Tensor  # [N, L] roll-in states
    x_next: Tensor  # [N, L] xbar_{t-1} ~ p_out(. | x_t)
    t: Tensor  # [N]
    s: Tensor  # [N]
    v_current: Tensor  # [N] v(x_t)
    v_next: Tensor  # [N] v(xbar_{t-1})
    changed: Tensor  # [N] bool: some token was unmasked (others have zero loss and no value queries)
    teacher_log_probs: Tensor | None = None  # [N, L, V] log p_out(x0 | x_t), only for exact_teacher_term

    def __len__(self) -> int:
        return self.x_t.shape[0]

    def to(self, device: torch.device | str) -> "VIDDBatch":
        """The batch on ``device`` (the learner's)."""
        return VIDDBatch(**{f.name: None if (v := getattr(self, f.name)) is None else v.to(device)
                            for f in dataclasses.fields(self)})


@torch.no_grad()
def collect_vidd_batch(
    teacher: nn.Module,
    value_model: nn.Module,
    states: Tensor,
    steps: Tensor,
    reward_fn: RewardFn,
    generator: torch.Generator | None = None,
    schedule: LogLinearSchedule | None = None,
    max_queries: int | float = math.inf,
    value_estimator: Literal["one_step", "greedy"] = "one_step",
    greedy_tokens_per_step: int = 4,
    next_value: Literal["denoised", "completion"] = "denoised",
    states_from_teacher: bool = False,
    keep_teacher_log_probs: bool = False,
    value_denominator: bool = True,
) -> tuple[VIDDBatch, dict]:
    """Roll-out and soft values for roll-in ``states`` ``[T+1, B, L]`` at reverse steps ``steps`` ``[B, k]``.

    ``v(x_t)`` is always ``r(x0hat(x_t))``. ``v(xbar_{t-1})`` is either the same estimator
    (``next_value="denoised"``, Alg. 1) or ``r(x0)`` of one completion ``x0 ~ p_out(. | xbar_{t-1})``
    (``"completion"``, the released protein code): ``exp(r(x0) / alpha)`` is then an unbiased estimate of
    ``exp(v*(xbar) / alpha)``, the numerator of the soft-optimal weight. ``value_denominator=False`` (the ablation)
    never queries ``v(x_t)`` (``v_current`` stays 0).

    When the roll-in came from the teacher (``states_from_teacher``) the trajectory's own next state
    ``x_{t-1}`` is exactly a draw ``xbar_{t-1} ~ p_out(. | x_t)`` and is reused (and so is its final sample
    for ``"completion"``). With ``"denoised"`` values, ``v(xbar_{t-1})`` of step ``t`` is then the same
    oracle call as ``v(x_{t-1})`` of step ``t - 1``: one oracle call is made per batch on the distinct
    denoised states, so distilling all ``T`` steps of a trajectory costs about ``T + 1`` queries, not ``2 T``
    (the released DNA code draws a fresh ``xbar`` per step and pays two).

    Transitions in which nothing is unmasked have zero loss and are not sent to the oracle; transitions whose
    values came back non-finite are skipped (``changed`` False, counted in ``info["n_nonfinite_skipped"]``). If the
    distinct denoised states do not fit in ``max_queries``, whole trajectories (in random order) are dropped from
    the end until they do. The batch comes back on the CPU (models may sit on a GPU).
    """
    if next_value not in ("denoised", "completion"):
        raise ValueError(f"next_value must be 'denoised' or 'completion', got {next_value!r}")
    schedule = schedule or LogLinearSchedule()
    states, steps = states.cpu(), steps.cpu()
    T = states.shape[0] - 1
    batch_index = torch.arange(states.shape[1]).unsqueeze(1).expand_as(steps)
    steps, batch_index = steps.reshape(-1), batch_index.reshape(-1)
    x_t = states[steps, batch_index]
    t, s = step_times(T, steps)
    reuse = states_from_teacher
    teacher_log_probs = (x0_log_probs(teacher, x_t.to(model_device(teacher))).cpu()
                         if keep_teacher_log_probs or not reuse else None)
    if reuse:
        x_next = states[steps + 1, batch_index]
        finals = states[T, batch_index] if next_value == "completion" else None
    else:
        x_next = reverse_step(teacher, x_t, t, s, schedule, generator, log_p_x0=teacher_log_probs)
        finals = complete(teacher, x_next, steps + 1, T, generator, schedule) if next_value == "completion" else None
    changed = (x_next != x_t).any(dim=-1)
    idx = changed.nonzero().squeeze(1)
    if not len(idx):  # nothing to score (the denoiser is not called on an empty batch)
        scored_current = scored_next = x_t[idx]
    else:
        scored_next = (finals[idx] if next_value == "completion"
                       else denoised_prediction(value_model, x_next[idx], value_estimator, greedy_tokens_per_step))
        # without the denominator only the next states are scored (the prefix arithmetic below counts them once)
        scored_current = (denoised_prediction(value_model, x_t[idx], value_estimator, greedy_tokens_per_step)
                          if value_denominator else scored_next)
    if distinct_rows(scored_current, scored_next) > max_queries:
        trajectory_rank = torch.randperm(states.shape[1], generator=generator)[batch_index[idx]]
        order = torch.argsort(trajectory_rank * (T + 1) + steps[idx])
        idx, scored_current, scored_next = idx[order], scored_current[order], scored_next[order]
        n_fit = largest_prefix_within(scored_current, scored_next, int(max_queries))
        idx, scored_current, scored_next = idx[:n_fit], scored_current[:n_fit], scored_next[:n_fit]
        selected = ~changed
        selected[idx] = True
        position = torch.cumsum(selected.long(), 0) - 1  # kept transitions keep their original order
        idx = position[idx]
        x_t, x_next, t, s, changed = x_t[selected], x_next[selected], t[selected], s[selected], changed[selected]
        teacher_log_probs = teacher_log_probs[selected] if teacher_log_probs is not None else None
    v_current = torch.zeros(len(x_t))
    v_next = torch.zeros(len(x_t))
    info: dict = {}
    if len(idx):
        if value_denominator:  # one oracle call per batch
            values, info = reward_fn(torch.cat([scored_current, scored_next]))
            values = torch.as_tensor(values, dtype=torch.float32).cpu()
            v_current[idx], v_next[idx] = values[: len(idx)], values[len(idx):]
        else:
            values, info = reward_fn(scored_next)
            v_next[idx] = torch.as_tensor(values, dtype=torch.float32).cpu()
        bad = ~(torch.isfinite(v_current) & torch.isfinite(v_next))
        info = {**info, "n_nonfinite_skipped": int((bad & changed).sum())}
        changed = changed & ~bad
        v_current, v_next = v_current.nan_to_num(0.0, 0.0, 0.0), v_next.nan_to_num(0.0, 0.0, 0.0)
    batch = VIDDBatch(
        x_t=x_t, x_next=x_next, t=t, s=s, v_current=v_current, v_next=v_next, changed=changed,
        teacher_log_probs=teacher_log_probs if keep_teacher_log_probs else None,
    )
    return batch, info


# --------------------------------------------------------------------------------------------------
# Distillation and lazy update
# --------------------------------------------------------------------------------------------------


def vidd_loss(student: nn.Module, batch: VIDDBatch, cfg: VIDDConfig) -> tuple[Tensor, dict]:
    """Value-weighted NLL of eq. 7: ``-mean_i w_i log p_theta(xbar_{t-1}^i | x_t^i)``.

    The log-likelihood sums over positions unmasked in the step (the only theta-dependent part of the
    reverse kernel); the mean runs over all (trajectory, step) pairs, as in the released code. The weights are
    normalised to mean 1 in log space (:func:`normalized_weights`): over the batch, or per reverse step with
    ``self_normalize_weights``; ``value_denominator=False`` drops ``v(x_t)`` (the ablation).
    """
    v_current = batch.v_current if cfg.value_denominator else torch.zeros_like(batch.v_current)
    log_w = log_soft_optimal_weights(batch.v_next, v_current, cfg.alpha, cfg.max_log_weight)
    weights = normalized_weights(log_w, batch.changed, batch.t if cfg.self_normalize_weights else None)
    log_p_x0 = x0_log_probs(student, batch.x_t)
    log_p = newly_unmasked_log_prob(log_p_x0, batch.x_t, batch.x_next, student.mask_id)
    if cfg.exact_teacher_term:
        if batch.teacher_log_probs is None:
            raise ValueError("exact_teacher_term needs a batch collected with keep_teacher_log_probs=True")
        q = LogLinearSchedule().unmask_probability(batch.t, batch.s)
        masked = batch.x_t == student.mask_id
        cross_entropy = -(batch.teacher_log_probs.exp() * log_p_x0).sum(-1)
        expected_nll = q * (cross_entropy * masked).sum(-1)
        loss = (expected_nll - (weights - 1.0) * torch.where(batch.changed, log_p, 0.0)).mean()
    else:
        loss = -(weights * log_p).mean()
    return loss, weight_metrics(weights, log_w, batch.changed, batch.t) | {
        "loss": loss.item(),
        "value_gain_mean": (batch.v_next - v_current)[batch.changed].mean().item() if batch.changed.any() else 0.0,
        "log_prob_mean": log_p[batch.changed].mean().item() if batch.changed.any() else float("nan"),
    }


def weight_metrics(weights: Tensor, log_w: Tensor, selected: Tensor, groups: Tensor | None = None) -> dict:
    """Diagnostics of the (normalised) weights over the ``selected`` transitions: how many there are, the raw
    log-weight spread, the Kish effective sample size (absolute and as a fraction), the mean ``|w - 1|`` (0 = plain
    MLE on the teacher's draws) and the sizes of the reverse-step groups (``groups``: each transition's step)."""
    w, lw = weights[selected], log_w[selected]
    out = {"transitions": float(len(w))}
    if groups is not None:
        sizes = groups[selected].unique(return_counts=True)[1].float()
        out |= {"group_size_min": sizes.min().item() if len(sizes) else float("nan"),
                "group_size_mean": sizes.mean().item() if len(sizes) else float("nan"),
                "group_singletons": float((sizes == 1).sum().item())}
    if not len(w):
        return out | {"weight_max": float("nan"), "log_weight_std": float("nan"), "weight_ess": float("nan"),
                      "weight_ess_fraction": float("nan"), "weight_abs_dev_mean": float("nan")}
    # Kish effective sample size: how many roll-outs really drive the update
    ess = (w.sum() ** 2 / w.pow(2).sum()).item() if w.pow(2).sum() > 0 else 0.0
    return out | {"weight_max": w.max().item(), "log_weight_std": lw.std().item() if len(lw) > 1 else 0.0,
                  "weight_ess": ess, "weight_ess_fraction": ess / len(w),
                  "weight_abs_dev_mean": (w - 1.0).abs().mean().item()}


def vidd_update(student: nn.Module, optimizer: torch.optim.Optimizer, batch: VIDDBatch, cfg: VIDDConfig) -> dict:
    """Alg. 1's distillation step: ``updates_per_batch`` clipped gradient steps on :func:`vidd_loss` of one batch.

    An empty batch (a DDP rank whose share of the budget fitted nothing) takes zero-gradient steps, so that every
    rank steps as often as the others. Returns the metrics of the last step.
    """
    return gradient_steps(student, optimizer, cfg, (lambda: vidd_loss(student, batch, cfg)) if len(batch) else None)


def gradient_steps(student: nn.Module, optimizer: torch.optim.Optimizer, cfg: VIDDConfig,
                   loss_fn: Callable[[], tuple[Tensor, dict]] | None) -> dict:
    """``cfg.updates_per_batch`` clipped gradient steps on ``loss_fn()``; with no data (``loss_fn`` None) steps of
    zero gradient through the student, so every DDP rank runs as many backward passes as the others."""
    metrics: dict = {}
    for _ in range(cfg.updates_per_batch):
        if loss_fn is not None:
            loss, metrics = loss_fn()
        else:
            empty = torch.full((1, student.seq_len), student.mask_id, device=model_device(student))
            loss, metrics = student(empty).sum() * 0.0, {}
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        metrics["grad_norm"] = float(nn.utils.clip_grad_norm_(student.parameters(), cfg.grad_clip))
        optimizer.step()
    return metrics


@torch.no_grad()
def refresh_teacher(teacher: nn.Module, student: nn.Module) -> None:
    """Lazy update ``p_out <- p_theta`` (hard copy; Alg. 1, every K iterations)."""
    teacher.load_state_dict(student.state_dict())


def refresh_due(cfg: VIDDConfig, iteration: int) -> bool:
    """Whether the teacher is refreshed after ``iteration`` (1-based): every ``refresh_interval`` iterations."""
    return cfg.refresh_interval is not None and iteration % cfg.refresh_interval == 0
