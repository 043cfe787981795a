"""Masked (absorbing-state) discrete diffusion in the MDLM style (Sahoo et al., 2024): schedule, denoiser, NELBO.

Forward process: every token is independently replaced by the mask token ``m`` with probability ``1 - c(t)``,
``t in [0, 1]``, where ``c(t)`` is the probability that a token is still clean (MDLM's ``alpha_t``); the log-linear
schedule is ``c(t) = 1 - (1 - eps) t``.

"subs" parameterisation: the denoiser predicts ``p_theta(x0 | z_t)`` over the real vocabulary only
(the mask class has zero probability) and unmasked tokens are carried over unchanged. With this
parameterisation the optimal denoiser does not depend on ``t`` (the mask pattern already carries the
noise level), so :class:`MaskedDenoiser` takes no time input.

Continuous-time NELBO (MDLM eq. 10):
    NELBO(x0) = E_{t ~ U(0,1)} [ -c'(t) / (1 - c(t)) * sum_{l: z_t^l = m} -log p_theta(x0^l | z_t) ].

The reverse process (ancestral sampling, completions, exact sample law) is in :mod:`algos.vidd.sampling`.

Token convention: real tokens are ``0 .. vocab_size - 1``; the mask token is ``vocab_size``.
Denoiser protocol (what every function here relies on): an ``nn.Module`` with attributes
``vocab_size``, ``mask_id`` (= ``vocab_size``) and ``seq_len`` whose ``forward(x [B, L])`` returns
logits ``[B, L, vocab_size]`` of ``p_theta(x0 | x)``; :class:`MaskedDenoiser` is the default one.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from algos.precision import use_bf16

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# Noise schedule
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogLinearSchedule:
    """``c(t) = 1 - (1 - eps) t``: probability that a token is still clean at time ``t``.

    ``eps`` keeps ``c(1) > 0`` so the loss weight stays finite; the prior at ``t = 1`` is taken to be
    the all-mask sequence (its ``eps``-sized KL term is ignored, as in MDLM).
    """

    eps: float = 1e-3

    def __post_init__(self) -> None:
        if not 0.0 <= self.eps < 1.0:
            raise ValueError(f"LogLinearSchedule.eps must lie in [0, 1), got {self.eps}")

    def clean_probability(self, t: Tensor) -> Tensor:
        return 1.0 - (1.0 - self.eps) * t

    def mask_probability(self, t: Tensor) -> Tensor:
        return 1.0 - self.clean_probability(t)

    def loss_weight(self, t: Tensor) -> Tensor:
        """``-c'(t) / (1 - c(t))`` (= 1/t for the log-linear schedule)."""
        return (1.0 - self.eps) / self.mask_probability(t)

    def unmask_probability(self, t: Tensor, s: Tensor) -> Tensor:
        """Probability that a position masked at ``t`` is unmasked at ``s < t``."""
        return (self.clean_probability(s) - self.clean_probability(t)) / self.mask_probability(t)


# --------------------------------------------------------------------------------------------------
# Denoiser
# --------------------------------------------------------------------------------------------------


@dataclass
class DenoiserConfig:
    """A small bidirectional transformer; defaults train in minutes on a laptop CPU."""

    vocab_size: int
    seq_len: int
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    ff_mult: int = 4
    dropout: float = 0.0
    # bf16 autocast: "auto" = where the hardware multiplies bf16 natively (algos.precision.use_bf16, decided per
    # device type at the first forward pass); true/false force it. Logits are returned in float32 either way
    bf16: bool | str = "auto"

    def __post_init__(self) -> None:
        if self.bf16 not in (True, False, "auto"):
            raise ValueError(f"DenoiserConfig.bf16 must be true, false or 'auto', got {self.bf16!r}")
        for name in ("vocab_size", "seq_len", "d_model", "n_layers", "n_heads", "ff_mult"):
            if getattr(self, name) < 1:
                raise ValueError(f"DenoiserConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.vocab_size < 2:
            raise ValueError(f"DenoiserConfig.vocab_size must be >= 2, got {self.vocab_size}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"DenoiserConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"DenoiserConfig.dropout must lie in [0, 1), got {self.dropout}")

    @classmethod
    def from_dict(cls, fields: dict) -> "DenoiserConfig":
        """From saved fields; bundles written before ``bf16`` replaced ``use_bf16`` still load (as ``bf16``)."""
        fields = dict(fields)
        if "use_bf16" in fields:
            fields.setdefault("bf16", fields.pop("use_bf16"))
        return cls(**fields)


class MaskedDenoiser(nn.Module):
    """``x_t -> logits of p_theta(x0 | x_t)`` over the real vocabulary, shape ``[B, L, vocab_size]``."""

    def __init__(self, cfg: DenoiserConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = cfg.vocab_size
        self.mask_id = cfg.vocab_size
        self.seq_len = cfg.seq_len
        self.token_embedding = nn.Embedding(cfg.vocab_size + 1, cfg.d_model)
        self.position_embedding = nn.Parameter(torch.randn(cfg.seq_len, cfg.d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(
            d_model=cfg.d_model,
            nhead=cfg.n_heads,
            dim_feedforward=cfg.ff_mult * cfg.d_model,
            dropout=cfg.dropout,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, cfg.n_layers, enable_nested_tensor=False)
        self.final_norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] > self.seq_len:
            raise ValueError(f"sequence length {x.shape[-1]} exceeds the model's seq_len {self.seq_len}")
        autocast = (
            torch.autocast(x.device.type, dtype=torch.bfloat16)
            if use_bf16(self.cfg.bf16, x.device)
            else contextlib.nullcontext()
        )
        with autocast:
            h = self.token_embedding(x) + self.position_embedding[: x.shape[-1]]
            h = self.final_norm(self.encoder(h))
            logits = self.head(h)
        return logits.float()


def x0_log_probs(model: nn.Module, x_t: Tensor) -> Tensor:
    """``log p_theta(x0 | x_t)`` for every position, ``[B, L, V]`` (meaningful at masked positions)."""
    return F.log_softmax(model(x_t).float(), dim=-1)


# --------------------------------------------------------------------------------------------------
# Forward process, training loss and NELBO
# --------------------------------------------------------------------------------------------------


def forward_mask(
    x0: Tensor, t: Tensor, mask_id: int, schedule: LogLinearSchedule, generator: torch.Generator | None = None
) -> Tensor:
    """Sample ``z_t ~ q(z_t | x0)``; ``t`` has shape ``[B]``. Draws from the (CPU) ``generator``."""
    u = torch.rand(x0.shape, generator=generator).to(x0.device)
    masked = u < schedule.mask_probability(t.to(x0.device))[:, None]
    return torch.where(masked, torch.full_like(x0, mask_id), x0)


def stratified_times(n: int, generator: torch.Generator | None = None, t_min: float = 1e-4) -> Tensor:
    """``n`` times in ``[t_min, 1]``, one per stratum (MDLM's low-discrepancy sampler; lowers loss variance)."""
    u = torch.rand((), generator=generator)
    t = (u + torch.arange(n) / n) % 1.0
    return t_min + (1.0 - t_min) * t


def masked_nll_terms(model: nn.Module, x0: Tensor, z_t: Tensor) -> Tensor:
    """``sum_{l: z_t^l = m} -log p_theta(x0^l | z_t)`` per sequence, ``[B]``."""
    logp = x0_log_probs(model, z_t)
    token_logp = logp.gather(-1, x0.unsqueeze(-1)).squeeze(-1)
    return -(token_logp * (z_t == model.mask_id)).sum(dim=-1)


def diffusion_loss(
    model: nn.Module,
    x0: Tensor,
    schedule: LogLinearSchedule,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Single-sample continuous-time NELBO estimate per sequence (MDLM eq. 10), ``[B]`` in nats."""
    t = stratified_times(x0.shape[0], generator).to(x0.device)
    z_t = forward_mask(x0, t, model.mask_id, schedule, generator)
    return schedule.loss_weight(t) * masked_nll_terms(model, x0, z_t)


@torch.no_grad()
def nelbo(
    model: nn.Module,
    x0: Tensor,
    schedule: LogLinearSchedule | None = None,
    n_time_samples: int = 16,
    generator: torch.Generator | None = None,
    batch_size: int = 512,
) -> Tensor:
    """Per-sequence NELBO (an upper bound on -log p_theta(x0)) in nats, ``[B]``.

    Averages ``n_time_samples`` stratified draws of ``t`` per sequence, which makes the Monte-Carlo error
    small next to differences between models; the estimate is unbiased for the continuous-time bound.
    """
    if n_time_samples < 1:
        raise ValueError(f"n_time_samples must be >= 1, got {n_time_samples}")
    schedule = schedule or LogLinearSchedule()
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    totals = torch.zeros(x0.shape[0])
    for start in range(0, x0.shape[0], batch_size):
        chunk = x0[start : start + batch_size].to(device)
        for _ in range(n_time_samples):
            totals[start : start + chunk.shape[0]] += diffusion_loss(model, chunk, schedule, generator).cpu()
    model.train(was_training)
    return totals / n_time_samples


@dataclass
class PretrainConfig:
    steps: int = 2000
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    warmup_steps: int = 50
    log_every: int = 100

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"PretrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"PretrainConfig.lr must be > 0, got {self.lr}")
        if self.warmup_steps < 0:
            raise ValueError(f"PretrainConfig.warmup_steps must be >= 0, got {self.warmup_steps}")


def pretrain(
    model: nn.Module,
    data: Tensor,
    cfg: PretrainConfig,
    generator: torch.Generator | None = None,
    schedule: LogLinearSchedule | None = None,
    log_fn: Callable[[int, dict], None] | None = None,
) -> dict:
    """Maximum-likelihood pretraining (minimise the NELBO) on token data ``[N, L]``; returns metrics."""
    schedule = schedule or LogLinearSchedule()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    warmup = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / max(1, cfg.warmup_steps))
    )
    model.train()
    running, losses = 0.0, []
    for step in range(1, cfg.steps + 1):
        idx = torch.randint(0, data.shape[0], (cfg.batch_size,), generator=generator)
        batch = data[idx].to(next(model.parameters()).device)
        loss = diffusion_loss(model, batch, schedule, generator).mean() / data.shape[1]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        warmup.step()
        running += loss.item()
        if step % cfg.log_every == 0 or step == cfg.steps:
            n = (step - 1) % cfg.log_every + 1
            losses.append(running / n)
            if log_fn is not None:
                log_fn(step, {"pretrain/nelbo_per_token": running / n})
            log.debug("pretrain step %d nelbo/token %.4f", step, running / n)
            running = 0.0
    model.eval()
    return {"pretrain/final_nelbo_per_token": losses[-1], "pretrain/steps": cfg.steps}
