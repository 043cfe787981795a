"""Losses on ``log p_theta(x0 | x_t)`` of a roll-in's own final sample: the released VIDD code's protein variant,
reward-weighted MLE and DDPP, the paper's other baselines.

Each roll-in trajectory ``x_T .. x_0`` gives its final sample ``x0`` (one oracle query: ``r(x0)``) and, at
``timesteps_per_trajectory`` random reverse steps, a partly masked state ``x_t``. The student is fitted on
``ll_theta(x0 | x_t) = sum_{l masked in x_t} log p_theta(x0^l | x_t)`` (the mean-field posterior of the masked
denoiser), weighted or regressed:

* **VIDD, released protein code** (``method="vidd"``, ``distill_target="final_sample"``; ``losses/rl_loss.py``,
  ``--loss_func RW_MLE --use_value_xt``): ``w = clamp(exp((r(x0) - v(x_t)) / alpha), 1e-6, 1e6)``, standardised over
  the batch (weights can be negative), ``loss = -mean_b w_b ll_theta / L``. ``v(x_t)``: one more query per state.
* **RW_MLE** (the same scripts without ``--use_value_xt``): ``w = exp(standardise(r(x0)) / alpha)``; no value queries.
* **DDPP** (Rector-Brooks et al. 2024, the released code's baseline): the posterior of the tilted model
  ``p*(x0 | x_t) ∝ p_pre(x0 | x_t) exp(r(x0) / alpha)`` matched by regression,
  ``loss = mean_b (ll_theta - ll_pre - r(x0) / alpha + v(x_t) / alpha)^2``, with ``log Z(x_t) ≈ v(x_t) / alpha`` and
  ``v(x_t) = r(x0hat(x_t; p_pre))`` (one query per state, as the released code). Sums over masked positions (the
  released code averages over ``L``, which rescales alpha by ``L``).

The collection returns plain tensors (:class:`X0Batch`), so a pool worker can collect and a learner update.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from algos.vidd.config import VIDDConfig
from algos.vidd.mdlm import x0_log_probs
from algos.vidd.oracle import RewardFn, distinct_rows, largest_prefix_within
from algos.vidd.sampling import step_times
from algos.vidd.vidd import denoised_prediction, gradient_steps, normalized_weights, weight_metrics

LOG_CLAMP = math.log(1e6)  # the released code clamps the value ratio to [1e-6, 1e6]


@dataclass
class X0Batch:
    """Selected roll-in states with their trajectory's final sample and values; plain CPU tensors."""

    x_t: Tensor  # [N, L] roll-in states (some position masked)
    x0: Tensor  # [N, L] the trajectory's final sample
    t: Tensor  # [N] time of x_t
    trajectory: Tensor  # [N] index of the trajectory in the roll-in batch
    r_final: Tensor  # [N] r(x0)
    v_current: Tensor  # [N] v(x_t) (0 when not queried)
    valid: Tensor  # [N] bool: finite values and something masked in x_t

    def __len__(self) -> int:
        return self.x_t.shape[0]

    def to(self, device: torch.device | str) -> "X0Batch":
        return X0Batch(**{f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)})


@torch.no_grad()
def collect_x0_batch(
    value_model: nn.Module | None,
    mask_id: int,
    states: Tensor,
    steps: Tensor,
    reward_fn: RewardFn,
    max_queries: int | float = math.inf,
    value_estimator: Literal["one_step", "greedy"] = "one_step",
    greedy_tokens_per_step: int = 4,
    generator: torch.Generator | None = None,
) -> tuple[X0Batch, dict]:
    """Final samples of roll-in ``states`` ``[T+1, B, L]`` scored once per distinct sequence, and the states at
    ``steps`` ``[B, k]``; ``v(x_t) = r(x0hat(x_t; value_model))`` when ``value_model`` is given. Fully unmasked states
    carry no loss and are dropped; whole trajectories (random order) are dropped until the queries fit
    ``max_queries``; non-finite values mark their rows invalid (``info["n_nonfinite_skipped"]``)."""
    states, steps = states.cpu(), steps.cpu()
    T, B = states.shape[0] - 1, states.shape[1]
    rows = torch.arange(B).unsqueeze(1).expand_as(steps).reshape(-1)
    flat = steps.reshape(-1)
    x_t, x0 = states[flat, rows], states[T, rows]
    keep = (x_t == mask_id).any(-1)
    x_t, x0, rows, flat = x_t[keep], x0[keep], rows[keep], flat[keep]
    scored_states = (denoised_prediction(value_model, x_t, value_estimator, greedy_tokens_per_step)
                     if value_model is not None and len(x_t) else None)
    if len(x_t) and distinct_rows(x0, *([] if scored_states is None else [scored_states])) > max_queries:
        rank = torch.randperm(B, generator=generator)[rows]
        order = torch.argsort(rank * (T + 1) + flat)
        x_t, x0, rows, flat = x_t[order], x0[order], rows[order], flat[order]
        scored_states = scored_states[order] if scored_states is not None else None
        n_fit = largest_prefix_within(x0, x0 if scored_states is None else scored_states, int(max_queries))
        x_t, x0, rows, flat = x_t[:n_fit], x0[:n_fit], rows[:n_fit], flat[:n_fit]
        scored_states = scored_states[:n_fit] if scored_states is not None else None
    n = len(x_t)
    v_current, r_final, info = torch.zeros(n), torch.zeros(n), {}
    if n:
        queries = x0 if scored_states is None else torch.cat([x0, scored_states])
        values, info = reward_fn(queries)
        values = torch.as_tensor(values, dtype=torch.float32).cpu()
        r_final = values[:n]
        if scored_states is not None:
            v_current = values[n:]
    valid = torch.isfinite(r_final) & torch.isfinite(v_current)
    info = {**info, "n_nonfinite_skipped": int((~valid).sum())}
    t, _ = step_times(T, flat)
    return X0Batch(x_t=x_t, x0=x0, t=t, trajectory=rows, r_final=r_final.nan_to_num(0.0, 0.0, 0.0),
                   v_current=v_current.nan_to_num(0.0, 0.0, 0.0), valid=valid), info


def x0_log_likelihood(model: nn.Module, x_t: Tensor, x0: Tensor) -> Tensor:
    """``sum_{l: x_t^l = m} log p_theta(x0^l | x_t)`` per row, ``[N]``."""
    token_logp = x0_log_probs(model, x_t).gather(-1, x0.unsqueeze(-1)).squeeze(-1)
    return (token_logp * (x_t == model.mask_id)).sum(-1)


def standardized(x: Tensor, selected: Tensor) -> Tensor:
    """``(x - mean) / (std + 1e-8)`` over the selected entries (the released code's ``reward_norm normal``)."""
    out = torch.zeros_like(x)
    if selected.sum() > 1:
        v = x[selected]
        out[selected] = (v - v.mean()) / (v.std() + 1e-8)
    return out


def final_sample_weights(batch: X0Batch, cfg: VIDDConfig) -> tuple[Tensor, Tensor]:
    """``(weights, log weights)`` of the final-sample distillation: the released VIDD variant (value ratio, clamped,
    standardised) or, without the denominator, RW_MLE (exp of the standardised reward over alpha)."""
    sel = batch.valid
    if cfg.value_denominator:
        log_w = ((batch.r_final - batch.v_current) / cfg.alpha).clamp(-LOG_CLAMP, LOG_CLAMP)
        weights = standardized(log_w.exp(), sel) if cfg.standardize_weights else normalized_weights(log_w, sel)
    else:
        reward = standardized(batch.r_final, sel) if cfg.standardize_weights else batch.r_final
        log_w = reward / cfg.alpha
        weights = normalized_weights(log_w, sel)
    return torch.where(sel, weights, torch.zeros_like(weights)), log_w


def final_sample_loss(student: nn.Module, batch: X0Batch, cfg: VIDDConfig) -> tuple[Tensor, dict]:
    """Weighted MLE of the final samples: ``-mean_b w_b ll_theta(x0 | x_t) / L``."""
    weights, log_w = final_sample_weights(batch, cfg)
    ll = x0_log_likelihood(student, batch.x_t, batch.x0) / batch.x_t.shape[1]
    loss = -(weights * ll).mean()
    return loss, weight_metrics(weights.clamp_min(0), log_w, batch.valid, batch.t) | {
        "loss": loss.item(), "log_prob_mean": ll[batch.valid].mean().item() if batch.valid.any() else float("nan")}


def ddpp_loss(student: nn.Module, pretrained: nn.Module, batch: X0Batch, cfg: VIDDConfig) -> tuple[Tensor, dict]:
    """DDPP's posterior matching: ``mean_b (ll_theta - ll_pre - r(x0) / alpha + v(x_t) / alpha)^2`` over valid rows."""
    ll = x0_log_likelihood(student, batch.x_t, batch.x0)
    with torch.no_grad():
        ll_pre = x0_log_likelihood(pretrained, batch.x_t, batch.x0)
    residual = ll - ll_pre - (batch.r_final - batch.v_current) / cfg.alpha
    loss = torch.where(batch.valid, residual.pow(2), torch.zeros_like(residual)).sum() / max(1, int(batch.valid.sum()))
    sel = batch.valid
    return loss, {"loss": loss.item(), "transitions": float(sel.sum().item()),
                  "log_ratio_mean": (ll - ll_pre)[sel].mean().item() if sel.any() else float("nan"),
                  "residual_abs_mean": residual[sel].abs().mean().item() if sel.any() else float("nan")}


def x0_update(student: nn.Module, optimizer: torch.optim.Optimizer, batch: X0Batch, cfg: VIDDConfig,
              pretrained: nn.Module | None = None) -> dict:
    """``updates_per_batch`` clipped gradient steps on DDPP's loss (when ``pretrained`` is given) or the final-sample
    weighted MLE; an empty batch takes zero-gradient steps (DDP ranks step together). Metrics of the last step."""
    def loss_fn() -> tuple[Tensor, dict]:
        return (ddpp_loss(student, pretrained, batch, cfg) if pretrained is not None
                else final_sample_loss(student, batch, cfg))
    return gradient_steps(student, optimizer, cfg, loss_fn if len(batch) and batch.valid.any() else None)


def value_model_role(method: str, cfg: VIDDConfig) -> str | None:
    """Whose denoiser scores ``v(x_t)``: p_pre for DDPP (the released code), ``cfg.value_model`` for the VIDD
    variant, nobody for RW_MLE (no value queries)."""
    if method == "ddpp":
        return "pretrained"
    if not cfg.value_denominator:
        return None
    return cfg.value_model
