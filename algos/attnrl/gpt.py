"""A nanoGPT-sized causal transformer whose attention weights come out of the same forward pass as its logits.

The call convention mirrors Hugging Face causal LMs (``input_ids, attention_mask, position_ids, past_key_values,
use_cache, output_attentions`` -> object with ``logits, past_key_values, attentions``), so :mod:`algos.attnrl.lm` drives
this model and a local HF checkpoint through one code path. Attention is computed explicitly (softmax of
``QK^T/sqrt(d)``) when weights are requested, because FCI needs the full token-to-token matrix; otherwise the fused
``scaled_dot_product_attention`` kernel is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

KVCache = tuple[tuple[torch.Tensor, torch.Tensor], ...]


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int = 256
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    rope: bool = True  # rotary position embedding (relative offsets are learned much faster); else learned absolute
    rope_base: float = 100.0  # short contexts: faster rotations make fixed-offset heads sharper
    tie_embeddings: bool = False  # untied output embeddings learn the digit arithmetic about twice as fast

    def __post_init__(self) -> None:
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {self.vocab_size}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.n_layer < 1 or self.block_size < 1:
            raise ValueError("n_layer and block_size must be >= 1")
        if self.rope and (self.n_embd // self.n_head) % 2:
            raise ValueError("rotary embeddings need an even head size (n_embd / n_head)")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


@dataclass
class GPTOutput:
    logits: torch.Tensor  # (B, T, V)
    past_key_values: KVCache | None  # per layer (K, V), each (B, H, T_past + T, d_head)
    attentions: tuple[torch.Tensor, ...] | None  # per layer (B, H, T, T_past + T), rows sum to 1


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (RoFormer) of (B, H, T, d) with per-position cos/sin of shape (B, 1, T, d/2)."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None,
                need_weights: bool, rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if rotary is not None:  # cached keys are stored already rotated
            q, k = rotate(q, *rotary), rotate(k, *rotary)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        weights = None
        if need_weights:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])
            weights = scores.float().masked_fill(~allowed, float("-inf")).softmax(dim=-1)
            y = F.dropout(weights, self.dropout, self.training).to(v.dtype) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed,
                                               dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.proj(y), (k, v), weights


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd), nn.Dropout(cfg.dropout))

    def forward(self, x, allowed, past, need_weights, rotary=None):
        a, present, weights = self.attn(self.ln1(x), allowed, past, need_weights, rotary)
        x = x + a
        return x + self.mlp(self.ln2(x)), present, weights


class GPT(nn.Module):
    """Decoder-only transformer (pre-LayerNorm, GELU MLP, tied input/output embeddings) with rotary or learned
    absolute positions."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = None if cfg.rope else nn.Embedding(cfg.block_size, cfg.n_embd)
        head = cfg.n_embd // cfg.n_head
        self.register_buffer("inv_freq", cfg.rope_base ** (-torch.arange(0, head, 2).float() / head),
                             persistent=False)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("attn.proj.weight") or name.endswith("mlp.2.weight"):
                # GPT-2 scaling: residual branches shrink with depth so the residual stream starts near identity.
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    @property
    def num_layers(self) -> int:
        return self.cfg.n_layer

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values: KVCache | None = None,
                use_cache: bool = False, output_attentions: bool = False) -> GPTOutput:
        """``attention_mask`` (B, T_past + T) marks real tokens (1) vs padding (0) over all keys, as in HF."""
        B, T = input_ids.shape
        past_len = past_key_values[0][0].shape[2] if past_key_values else 0
        total = past_len + T
        device = input_ids.device
        if attention_mask is None:
            attention_mask = torch.ones(B, total, dtype=torch.long, device=device)
        if position_ids is None:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past_len:]
        if int(position_ids.max()) >= self.cfg.block_size:  # padding may make the cache longer; positions count
            raise ValueError(f"position {int(position_ids.max())} exceeds block_size {self.cfg.block_size}")
        q_pos = torch.arange(past_len, total, device=device)[:, None]
        k_pos = torch.arange(total, device=device)[None, :]
        # A padding query sees only padding; letting every query see itself keeps its softmax finite.
        allowed = (k_pos <= q_pos) & (attention_mask.bool()[:, None, None, :] | (k_pos == q_pos))
        x = self.wte(input_ids)
        rotary = None
        if self.wpe is not None:
            x = x + self.wpe(position_ids)
        else:
            angles = position_ids[:, None, :, None].float() * self.inv_freq  # (B, 1, T, d/2)
            rotary = (angles.cos(), angles.sin())
        presents, attentions = [], []
        for i, block in enumerate(self.blocks):
            x, present, weights = block(x, allowed, past_key_values[i] if past_key_values else None,
                                        output_attentions, rotary)
            presents.append(present)
            attentions.append(weights)
        logits = self.lm_head(self.ln_f(x))
        return GPTOutput(logits=logits, past_key_values=tuple(presents) if use_cache else None,
                         attentions=tuple(attentions) if output_attentions else None)
