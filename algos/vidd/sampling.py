"""The reverse process of the masked diffusion model (:mod:`algos.vidd.mdlm`): ancestral sampling and its pieces.

Ancestral sampling with ``T`` steps walks ``t_i = i / T`` from 1 down to 0. From ``t`` to ``s < t`` each
still-masked position is unmasked with probability ``(c(s) - c(t)) / (1 - c(t))`` (``c``: the schedule's clean
probability) to a token drawn from ``p_theta(x0^l | z_t)``; at ``s = 0`` everything is unmasked.

Also here: finishing partial trajectories (:func:`complete`), the exact law of the sampler on tiny spaces, and the
denoised predictions ``x0hat(x_t)`` that VIDD's values score (:func:`denoise_one_step`, :func:`denoise_greedy`).

Devices: the denoiser passes run on the model's device (a GPU when the caller put the model there); random draws
come from a CPU ``torch.Generator`` and are moved (so a seed gives the same samples on every device), and the
functions that produce sequences return them on the CPU, where the oracles and the pool's messages want them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from algos.vidd.mdlm import LogLinearSchedule, x0_log_probs

def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s parameters (the CPU for a module without parameters)."""
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def uniform(shape: torch.Size | tuple, generator: torch.Generator | None, device: torch.device) -> Tensor:
    """``U(0, 1)`` draws from the (CPU) ``generator``, placed on ``device``."""
    return torch.rand(shape, generator=generator).to(device)


# --------------------------------------------------------------------------------------------------
# Denoised predictions x0hat(x_t)
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def denoise_one_step(model: nn.Module, x_t: Tensor) -> Tensor:
    """Greedy one-step prediction ``x0hat(x_t)``: argmax at masked positions, unmasked tokens kept ("subs").
    Returned on the device of ``x_t``."""
    mask_id = model.mask_id
    prediction = model(x_t.to(model_device(model))).argmax(dim=-1).to(x_t.device)
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
    x = x_t.to(model_device(model))
    while True:
        masked = x == mask_id
        if not masked.any():
            return x.to(x_t.device)
        confidence, prediction = x0_log_probs(model, x).max(dim=-1)
        confidence = confidence.masked_fill(~masked, -math.inf)
        k = min(tokens_per_step, x.shape[1])
        top = confidence.topk(k, dim=-1).indices
        reveal = torch.zeros_like(masked).scatter_(1, top, True) & masked
        x = torch.where(reveal, prediction, x)


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
    u = uniform(log_probs.shape, generator, log_probs.device).clamp_(1e-10, 1.0 - 1e-7)
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

    ``log_p_x0`` may pass in an already computed ``x0_log_probs(model, x_t)``. ``x_t`` is moved to the model's
    device; the next state comes back on the device of ``x_t``.
    """
    mask_id = model.mask_id
    device = model_device(model)
    x = x_t.to(device)
    if log_p_x0 is None:
        log_p_x0 = x0_log_probs(model, x)
    proposal = gumbel_argmax(log_p_x0.to(device), generator)
    q = schedule.unmask_probability(torch.as_tensor(t), torch.as_tensor(s)).reshape(-1, 1).to(device)
    unmask = uniform(x.shape, generator, device) < q
    return torch.where((x == mask_id) & unmask, proposal, x).to(x_t.device)


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
    """Ancestral sampling with ``T`` reverse steps from the all-mask prior, on the model's device; the samples (and
    trajectories) come back on the CPU."""
    if n < 1 or length < 1 or T < 1:
        raise ValueError(f"sample needs n, length, T >= 1, got n={n}, length={length}, T={T}")
    schedule = schedule or LogLinearSchedule()
    was_training = model.training
    model.eval()
    device = model_device(model)
    tokens, trajectories = [], []
    for start in range(0, n, batch_size):
        m = min(batch_size, n - start)
        x = torch.full((m, length), model.mask_id, dtype=torch.long, device=device)
        states = [x]
        for step in range(T):
            t, s = step_times(T, step)
            x = reverse_step(model, x, t, s, schedule, generator)
            states.append(x)
        tokens.append(x.cpu())
        if record_trajectory:
            trajectories.append(torch.stack(states).cpu())
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
    next_step = torch.as_tensor(next_step).reshape(-1).to(x.device)
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
