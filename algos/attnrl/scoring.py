"""Teacher-forced scoring, the learner's side of AttnRL: log-probs, entropies and step attention of given responses.

:func:`forward_scores` is what every learner calls (PPO's old/reference/new log-probs, SFT, diagnostics); it runs the
model over chunks of sequences (:func:`chunk_by_tokens`) and turns each chunk's logits into per-token log-probs at its
one call site, :func:`score_logits`, through :func:`token_logprobs`'s bounded temporaries (issue 39 #6;
``benchmarks/gpu/attnrl.py`` measures that call's peak memory on a GPU, ``tests/test_gpu_fixes.py`` on the CPU).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn as nn

from algos.attnrl.lm import Policy, _forward, aggregate_step_attention, response_step_ids


@dataclass
class SequenceScores:
    logprobs: torch.Tensor  # (B, R) log-prob of each response token (temperature-scaled), 0 at padding
    entropy: torch.Tensor  # (B, R)
    mask: torch.Tensor  # (B, R) 1 for response tokens
    step_attention: list[torch.Tensor] | None = None  # per sequence alpha (L, H, S, S)


def chunk_by_tokens(lengths: Sequence[int], max_tokens: int | None) -> list[list[int]]:
    """Consecutive positions of ``lengths`` grouped so that each group's padded size (count x longest) is at most
    ``max_tokens``; a longer sequence forms a group of its own. ``None``: one group."""
    if not lengths:
        return []
    if max_tokens is None:
        return [list(range(len(lengths)))]
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        if current and (len(current) + 1) * max(longest, n) > max_tokens:
            groups.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    groups.append(current)
    return groups


def forward_scores(policy: Policy, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                   temperature: float = 1.0, output_step_attention: bool = False,
                   max_tokens: int | None = None) -> SequenceScores:
    """Teacher-forced log-probs of ``responses`` given ``prompts`` (right padding; gradients flow).

    With ``output_step_attention`` the same forward pass also returns each sequence's step-to-step attention,
    as in the paper, where FCI comes from the forward pass that recomputes old log-probs.

    The sequences go through the model in chunks of at most ``max_tokens`` padded tokens (default
    ``policy.max_tokens_per_forward``; None: all at once), so the (chunk, T, vocab) logits are never those of all
    sequences at once: at the paper's sizes (1,920 paths, 8k tokens, 152k vocabulary) one pass would need hundreds
    of GB. Chunks change only the padding, hence the results only up to float rounding. Under gradients each
    chunk's graph lives until backward: bound training memory with micro-batches (algos.attnrl.ppo.ppo_update).
    """
    limit = max_tokens if max_tokens is not None else policy.max_tokens_per_forward
    chunks = chunk_by_tokens([len(p) + len(r) for p, r in zip(prompts, responses)], limit)
    if len(chunks) == 1:
        return _forward_scores(policy, prompts, responses, temperature, output_step_attention)
    parts = [_forward_scores(policy, [prompts[i] for i in c], [responses[i] for i in c], temperature,
                             output_step_attention) for c in chunks]
    width = max(max(len(r) for r in responses), 1)

    def joined(name: str) -> torch.Tensor:
        return torch.cat([nn.functional.pad(getattr(s, name), (0, width - getattr(s, name).shape[1]))
                          for s in parts])

    step_attention = [a for s in parts for a in s.step_attention] if output_step_attention else None
    return SequenceScores(joined("logprobs"), joined("entropy"), joined("mask"), step_attention)


LOGPROB_CHUNK_ROWS = 1024  # positions per chunk of token_logprobs: 1024 x 151,936 x 4 B = 0.6 GB per fp32 temporary


def _chunk_scores(flat: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor,
                  temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets`` and entropy at the ``rows`` of ``flat`` logits (N, V), through fp32 temporaries of
    (len(rows), V)."""
    x = flat.index_select(0, rows).float()
    if temperature > 0:
        x = x / temperature
    lse = x.logsumexp(-1)
    token = x.gather(-1, targets[:, None]).squeeze(-1) - lse
    # H = lse - sum_v p_v x_v with p = softmax(x): no full log-prob row is kept
    entropy = lse - (x.softmax(-1) * x).sum(-1)
    return token, entropy


def token_logprobs(logits: torch.Tensor, gather_pos: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                   temperature: float, chunk_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets`` (B, R) read at positions ``gather_pos`` (B, R) of ``logits`` (B, T, V), and the
    entropy there, 0 where ``mask`` is 0; gradients flow to ``logits``.

    Logsumexp and gather over chunks of ``chunk_rows`` response positions (padding skipped): every temporary is at
    most ``chunk_rows x V``. Gathering all positions first and taking a full log-softmax kept ~4 fp32 copies of
    (B, R, V) beside the model's logits: ~33 GB per rank at 16k tokens and a 152k vocabulary. Under gradients each
    chunk is recomputed in backward (checkpointed), so what stays saved is the model's logits alone.
    """
    B, T, V = logits.shape
    R = gather_pos.shape[1]
    chunk_rows = chunk_rows or LOGPROB_CHUNK_ROWS  # read at each call: a rehearsal on a small vocabulary sets it
    flat = logits.reshape(B * T, V)
    rows = (torch.arange(B, device=logits.device)[:, None] * T + gather_pos).reshape(-1)
    flat_targets = targets.reshape(-1)
    valid = (mask.reshape(-1) > 0).nonzero().squeeze(-1)
    grad = torch.is_grad_enabled() and logits.requires_grad
    token_logp = torch.zeros(B * R, device=logits.device)
    entropy = torch.zeros(B * R, device=logits.device)
    for part in valid.split(max(1, chunk_rows)):
        args = (flat, rows[part], flat_targets[part], temperature)
        if grad:
            from torch.utils.checkpoint import checkpoint
            token, ent = checkpoint(_chunk_scores, *args, use_reentrant=False)
        else:
            token, ent = _chunk_scores(*args)
        token_logp = token_logp.index_copy(0, part, token)
        entropy = entropy.index_copy(0, part, ent)
    if grad and valid.numel() == 0:  # no response token: zeros that still belong to the graph, as before
        token_logp = token_logp + flat[:0].sum()
    return token_logp.reshape(B, R), entropy.reshape(B, R)


def score_logits(logits: torch.Tensor, gather_pos: torch.Tensor, targets: torch.Tensor, resp_mask: torch.Tensor,
                 temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The learner's log-prob call: the model's logits (B, T, V) to response-token log-probs and entropies (B, R),
    never through a (B, R, V) copy. A test or a GPU check wraps this one function to see what the learner holds."""
    return token_logprobs(logits, gather_pos, targets, resp_mask, temperature)


def _forward_scores(policy: Policy, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                    temperature: float, output_step_attention: bool) -> SequenceScores:
    codec = policy.codec
    B = len(prompts)
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    T, R = max(lengths), max(max(len(r) for r in responses), 1)
    ids = torch.full((B, T), codec.pad_id, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    gather_pos = torch.zeros(B, R, dtype=torch.long)
    targets = torch.full((B, R), codec.pad_id, dtype=torch.long)
    resp_mask = torch.zeros(B, R)
    for b, (p, r) in enumerate(zip(prompts, responses)):
        ids[b, :lengths[b]] = torch.tensor(list(p) + list(r))
        mask[b, :lengths[b]] = 1
        if r:
            gather_pos[b, :len(r)] = torch.arange(len(p) - 1, len(p) + len(r) - 1)
            targets[b, :len(r)] = torch.tensor(list(r))
            resp_mask[b, :len(r)] = 1
    device = next(policy.model.parameters()).device
    ids, mask, gather_pos, targets, resp_mask = (x.to(device) for x in (ids, mask, gather_pos, targets, resp_mask))
    with policy.autocast():
        all_logits, _, attentions = _forward(policy.model, ids, mask, (mask.cumsum(1) - 1).clamp(min=0), None, False,
                                             output_step_attention)
    token_logp, entropy = score_logits(all_logits, gather_pos, targets, resp_mask, temperature)
    step_attention = None
    if output_step_attention:
        step_attention = []
        for b, (p, r) in enumerate(zip(prompts, responses)):
            steps = [0] * len(p) + response_step_ids(r, codec.delimiter_ids, codec.eos_id)
            n = lengths[b]
            step_attention.append(aggregate_step_attention([a[b, :, :n, :n] for a in attentions], steps))
    return SequenceScores(token_logp, entropy, resp_mask, step_attention)
