"""Masked (absorbing-state) discrete diffusion in the MDLM style (Sahoo et al., 2024).

Forward process: every token is independently replaced by the mask token ``m`` with probability
``1 - alpha(t)``, ``t in [0, 1]``; the log-linear schedule is ``alpha(t) = 1 - (1 - eps) t``.

"subs" parameterisation: the denoiser predicts ``p_theta(x0 | z_t)`` over the real vocabulary only
(the mask class has zero probability) and unmasked tokens are carried over unchanged. With this
parameterisation the optimal denoiser does not depend on ``t`` (the mask pattern already carries the
noise level), so :class:`MaskedDenoiser` takes no time input.

Continuous-time NELBO (MDLM eq. 10):
    NELBO(x0) = E_{t ~ U(0,1)} [ -alpha'(t) / (1 - alpha(t)) * sum_{l: z_t^l = m} -log p_theta(x0^l | z_t) ].

Ancestral sampling with ``T`` steps walks ``t_i = i / T`` from 1 down to 0. From ``t`` to ``s < t`` each
still-masked position is unmasked with probability ``(alpha(s) - alpha(t)) / (1 - alpha(t))`` to a token
drawn from ``p_theta(x0^l | z_t)``; at ``s = 0`` everything is unmasked.

Token convention: real tokens are ``0 .. vocab_size - 1``; the mask token is ``vocab_size``.
Denoiser protocol (what every function here relies on): an ``nn.Module`` with attributes
``vocab_size``, ``mask_id`` (= ``vocab_size``) and ``seq_len`` whose ``forward(x [B, L])`` returns
logits ``[B, L, vocab_size]`` of ``p_theta(x0 | x)``; :class:`MaskedDenoiser` is the default one.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# Noise schedule
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogLinearSchedule:
    """``alpha(t) = 1 - (1 - eps) t``: probability that a token is still clean at time ``t``.

    ``eps`` keeps ``alpha(1) > 0`` so the loss weight stays finite; the prior at ``t = 1`` is taken to be
    the all-mask sequence (its ``eps``-sized KL term is ignored, as in MDLM).
    """

    eps: float = 1e-3

    def __post_init__(self) -> None:
        if not 0.0 <= self.eps < 1.0:
            raise ValueError(f"LogLinearSchedule.eps must lie in [0, 1), got {self.eps}")

    def alpha(self, t: Tensor) -> Tensor:
        return 1.0 - (1.0 - self.eps) * t

    def mask_probability(self, t: Tensor) -> Tensor:
        return 1.0 - self.alpha(t)

    def loss_weight(self, t: Tensor) -> Tensor:
        """``-alpha'(t) / (1 - alpha(t))`` (= 1/t for the log-linear schedule)."""
        return (1.0 - self.eps) / self.mask_probability(t)

    def unmask_probability(self, t: Tensor, s: Tensor) -> Tensor:
        """Probability that a position masked at ``t`` is unmasked at ``s < t``."""
        return (self.alpha(s) - self.alpha(t)) / self.mask_probability(t)


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
    use_bf16: bool = False  # bf16 autocast on CPU; logits are returned in float32

    def __post_init__(self) -> None:
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
            torch.autocast("cpu", dtype=torch.bfloat16)
            if self.cfg.use_bf16 and x.device.type == "cpu"
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


@torch.no_grad()
def denoise_one_step(model: nn.Module, x_t: Tensor) -> Tensor:
    """Greedy one-step prediction ``x0hat(x_t)``: argmax at masked positions, unmasked tokens kept ("subs")."""
    mask_id = model.mask_id
    prediction = model(x_t).argmax(dim=-1)
    return torch.where(x_t == mask_id, prediction, x_t)


@torch.no_grad()
def denoise_greedy(model: nn.Module, x_t: Tensor, tokens_per_step: int = 4) -> Tensor:
    """Iterative greedy completion: reveal the ``tokens_per_step`` most confident masked positions
    (argmax token) per forward pass until nothing is masked.

    Unlike :func:`denoise_one_step`, later choices condition on earlier ones, so the completion is a
    coherent sequence rather than a position-wise mode (the released VIDD protein code's ``reward_step``).
    """
    if tokens_per_step < 1:
        raise ValueError(f"tokens_per_step must be >= 1, got {tokens_per_step}")
    mask_id = model.mask_id
    x = x_t.clone()
    while True:
        masked = x == mask_id
        if not masked.any():
            return x
        confidence, prediction = x0_log_probs(model, x).max(dim=-1)
        confidence = confidence.masked_fill(~masked, -math.inf)
        k = min(tokens_per_step, x.shape[1])
        top = confidence.topk(k, dim=-1).indices
        reveal = torch.zeros_like(masked).scatter_(1, top, True) & masked
        x = torch.where(reveal, prediction, x)


# --------------------------------------------------------------------------------------------------
# Forward process, training loss and NELBO
# --------------------------------------------------------------------------------------------------


def forward_mask(
    x0: Tensor, t: Tensor, mask_id: int, schedule: LogLinearSchedule, generator: torch.Generator | None = None
) -> Tensor:
    """Sample ``z_t ~ q(z_t | x0)``; ``t`` has shape ``[B]``."""
    u = torch.rand(x0.shape, generator=generator, device=x0.device)
    masked = u < schedule.mask_probability(t)[:, None]
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
    totals = torch.zeros(x0.shape[0])
    for start in range(0, x0.shape[0], batch_size):
        chunk = x0[start : start + batch_size]
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
        loss = diffusion_loss(model, data[idx], schedule, generator).mean() / data.shape[1]
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


# --------------------------------------------------------------------------------------------------
# Reverse process: kernel, log-probabilities, ancestral sampling
# --------------------------------------------------------------------------------------------------


def step_times(T: int, step: Tensor | int) -> tuple[Tensor, Tensor]:
    """Times ``(t, s)`` of reverse step ``step`` (0-based: step 0 goes from t=1 to s=(T-1)/T)."""
    step = torch.as_tensor(step, dtype=torch.float32)
    return (T - step) / T, (T - step - 1) / T


def newly_unmasked_log_prob(log_p_x0: Tensor, x_t: Tensor, x_s: Tensor, mask_id: int) -> Tensor:
    """``sum_{l: x_t^l = m, x_s^l != m} log p_theta(x0^l = x_s^l | x_t)`` per sequence, ``[B]``.

    This is the theta-dependent part of ``log p_theta(x_s | x_t)``; the unmasking probabilities of the
    schedule do not depend on theta.
    """
    newly = (x_t == mask_id) & (x_s != mask_id)
    safe = torch.where(newly, x_s, torch.zeros_like(x_s))
    token_logp = log_p_x0.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    return (token_logp * newly).sum(dim=-1)


def reverse_log_prob(
    model: nn.Module, x_t: Tensor, x_s: Tensor, t: Tensor, s: Tensor, schedule: LogLinearSchedule
) -> Tensor:
    """Full ``log p_theta(x_s | x_t)`` per sequence (``-inf`` for impossible transitions), ``[B]``."""
    mask_id = model.mask_id
    q = schedule.unmask_probability(torch.as_tensor(t), torch.as_tensor(s)).reshape(-1).expand(x_t.shape[0])
    was_masked = x_t == mask_id
    n_new = (was_masked & (x_s != mask_id)).sum(-1)
    n_stay = (was_masked & (x_s == mask_id)).sum(-1)
    impossible = ((~was_masked) & (x_s != x_t)).any(-1)
    logp = newly_unmasked_log_prob(x0_log_probs(model, x_t), x_t, x_s, mask_id)
    logp = logp + torch.where(n_new > 0, n_new * torch.log(q), 0.0)
    logp = logp + torch.where(n_stay > 0, n_stay * torch.log1p(-q), 0.0)
    return torch.where(impossible, torch.full_like(logp, -math.inf), logp)


def gumbel_argmax(log_probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Sample from a categorical given log-probabilities (Gumbel-max; uses ``generator``)."""
    u = torch.rand(log_probs.shape, generator=generator, device=log_probs.device).clamp_(1e-10, 1.0 - 1e-7)
    return (log_probs - torch.log(-torch.log(u))).argmax(dim=-1)


def reverse_step(
    model: nn.Module,
    x_t: Tensor,
    t: Tensor,
    s: Tensor,
    schedule: LogLinearSchedule,
    generator: torch.Generator | None = None,
    log_p_x0: Tensor | None = None,
) -> Tensor:
    """One ancestral step ``x_s ~ p_theta(. | x_t)``; ``t``, ``s`` scalars or ``[B]``.

    ``log_p_x0`` may pass in an already computed ``x0_log_probs(model, x_t)``.
    """
    mask_id = model.mask_id
    if log_p_x0 is None:
        log_p_x0 = x0_log_probs(model, x_t)
    proposal = gumbel_argmax(log_p_x0, generator)
    q = schedule.unmask_probability(torch.as_tensor(t), torch.as_tensor(s)).reshape(-1, 1)
    unmask = torch.rand(x_t.shape, generator=generator, device=x_t.device) < q
    return torch.where((x_t == mask_id) & unmask, proposal, x_t)


@dataclass
class SampleResult:
    """``tokens``: ``[n, L]`` final samples. ``states``: ``[T + 1, n, L]`` with ``states[0]`` all-mask
    (t = 1) and ``states[T] == tokens`` (t = 0), or ``None`` when not recorded."""

    tokens: Tensor
    states: Tensor | None = None


@torch.no_grad()
def sample(
    model: nn.Module,
    n: int,
    length: int,
    T: int,
    generator: torch.Generator | None = None,
    record_trajectory: bool = False,
    schedule: LogLinearSchedule | None = None,
    batch_size: int = 1024,
) -> SampleResult:
    """Ancestral sampling with ``T`` reverse steps from the all-mask prior."""
    if n < 1 or length < 1 or T < 1:
        raise ValueError(f"sample needs n, length, T >= 1, got n={n}, length={length}, T={T}")
    schedule = schedule or LogLinearSchedule()
    was_training = model.training
    model.eval()
    tokens, trajectories = [], []
    for start in range(0, n, batch_size):
        m = min(batch_size, n - start)
        x = torch.full((m, length), model.mask_id, dtype=torch.long)
        states = [x]
        for step in range(T):
            t, s = step_times(T, step)
            x = reverse_step(model, x, t, s, schedule, generator)
            states.append(x)
        tokens.append(x)
        if record_trajectory:
            trajectories.append(torch.stack(states))
    model.train(was_training)
    return SampleResult(
        tokens=torch.cat(tokens),
        states=torch.cat(trajectories, dim=1) if record_trajectory else None,
    )


@torch.no_grad()
def complete(
    model: nn.Module,
    x: Tensor,
    next_step: Tensor,
    T: int,
    generator: torch.Generator | None = None,
    schedule: LogLinearSchedule | None = None,
) -> Tensor:
    """Finish ancestral sampling: row ``i`` of ``x`` is a state after ``next_step[i]`` of ``T`` reverse steps
    (``next_step == T``: already clean); runs the remaining steps and returns clean sequences."""
    schedule = schedule or LogLinearSchedule()
    x = x.clone()
    next_step = torch.as_tensor(next_step).reshape(-1)
    for step in range(int(next_step.min()) if len(next_step) else T, T):
        rows = next_step <= step
        if not rows.any():
            continue
        t, s = step_times(T, step)
        x[rows] = reverse_step(model, x[rows], t, s, schedule, generator)
    return x


# --------------------------------------------------------------------------------------------------
# Exact sample distribution on tiny spaces (tests and toy studies)
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def exact_sample_distribution(
    model: nn.Module, length: int, T: int, schedule: LogLinearSchedule | None = None
) -> tuple[Tensor, Tensor]:
    """Exact distribution of :func:`sample` over all ``V**length`` sequences.

    Propagates the law of the partially masked state through the ``T`` reverse kernels over all
    ``(V+1)**length`` states. Only for tiny spaces (it refuses more than 4096 states).
    Returns ``(sequences [V**length, length], probabilities [V**length])``.
    """
    schedule = schedule or LogLinearSchedule()
    V, mask_id = model.vocab_size, model.mask_id
    n_states = (V + 1) ** length
    if n_states > 4096:
        raise ValueError(f"exact enumeration needs (V+1)**length <= 4096, got {n_states}")
    states = torch.tensor(list(itertools.product(range(V + 1), repeat=length)), dtype=torch.long)
    base = (V + 1) ** torch.arange(length - 1, -1, -1)
    was_training = model.training
    model.eval()
    p_x0 = x0_log_probs(model, states).exp()  # [S, L, V]
    probs = torch.zeros(n_states, dtype=torch.float64)
    probs[int((torch.full((length,), mask_id) * base).sum())] = 1.0
    for step in range(T):
        t, s = step_times(T, step)
        q = float(schedule.unmask_probability(t, s))
        # per-position kernel K[S, L, V+1]: carried tokens are deterministic, masked ones unmask w.p. q
        kernel = torch.zeros(n_states, length, V + 1, dtype=torch.float64)
        masked = states == mask_id
        kernel[..., :V] = torch.where(masked[..., None], q * p_x0.double(), 0.0)
        kernel[..., V] = torch.where(masked, 1.0 - q, 0.0)
        kernel.scatter_add_(-1, states.unsqueeze(-1), (~masked).double().unsqueeze(-1))
        transition = kernel[:, 0]
        for pos in range(1, length):
            transition = (transition.unsqueeze(-1) * kernel[:, pos].unsqueeze(1)).reshape(n_states, -1)
        probs = probs @ transition
    model.train(was_training)
    clean = ~(states == mask_id).any(-1)
    return states[clean], probs[clean].float()
