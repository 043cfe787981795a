"""Language-model plumbing shared by SFT, AttnRL and the baselines: steps, KV-cached sampling, teacher forcing.

Everything here works for any model with the Hugging Face causal-LM call convention (``algos.attnrl.gpt.GPT`` or a local
``transformers`` checkpoint loaded with :func:`load_hf_policy`, eager attention).

Steps (AttnRL Sec. 3.1.1): the prompt is step 0; a response step ends right after a delimiter token; the end token
never opens a step of its own. Step-to-step attention ``alpha[l, h, j, k]`` is the mean, over query tokens of step
``j`` and key tokens of step ``k``, of the softmax attention of layer ``l``, head ``h``. :func:`generate` accumulates
it from the attention rows that the KV-cached decoding pass produces anyway, so a rollout worker returns FCI (or any
``step_score_fn`` of ``alpha``) without a second forward pass; ``forward_scores`` (:mod:`algos.attnrl.scoring`,
re-exported here) gives the same quantities by teacher forcing on the learner side, in chunks of at most
``Policy.max_tokens_per_forward`` padded tokens.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import torch
import torch.nn as nn

StepScoreFn = Callable[[torch.Tensor], torch.Tensor]  # alpha (L, H, S, S) -> per-step scores (S,)


class TokenCodec(Protocol):
    pad_id: int
    eos_id: int
    delimiter_ids: frozenset[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass
class Policy:
    """A causal LM (HF call convention) plus the codec that turns text into its tokens and marks step ends."""

    model: nn.Module
    codec: TokenCodec
    autocast_bf16: bool = False  # resolve ``bf16: auto`` with algos.precision.use_bf16 before building a Policy
    # Teacher-forced passes without gradients (reference and old-policy log-probs) run over chunks of at most this
    # many padded tokens, so the (chunk, T, vocab) logits stay bounded; None: one pass over all sequences.
    max_tokens_per_forward: int | None = None
    # How this process takes part in PPO updates (algos.attnrl.ppo.UpdateContext: data-parallel ranks, resume);
    # None: a single process.
    update_context: Any = None

    def autocast(self):
        device = next(self.model.parameters()).device.type
        return torch.autocast(device, dtype=torch.bfloat16) if self.autocast_bf16 else contextlib.nullcontext()


@dataclass(frozen=True)
class GenerationRequest:
    """Sample a response to ``prompt_ids``; a continuation fixes the first response tokens to ``prefix_ids``."""

    prompt_ids: tuple[int, ...]
    prefix_ids: tuple[int, ...] = ()
    max_new_tokens: int | None = None  # per-request cap, at most the call's max_new_tokens
    tag: Any = None  # caller bookkeeping, returned untouched


@dataclass
class Rollout:
    prompt_ids: tuple[int, ...]
    prefix_ids: tuple[int, ...]
    generated_ids: list[int]  # sampled tokens, ending with EOS if finished
    logprobs: list[float]  # log-prob of each sampled token under the (temperature-scaled) sampling policy
    entropies: list[float]  # entropy of the sampling distribution at each sampled token
    finished: bool
    step_starts: list[int]  # response offset where each response step (1, 2, ...) begins
    step_scores: list[float] | None = None  # step_score_fn(alpha); index 0 is the prompt
    tag: Any = None
    policy_version: int | None = None  # set by the caller: number of updates applied to the sampling weights
    meta: dict = field(default_factory=dict)  # per-rollout extras from the sampler (reward, weights version)

    @property
    def response_ids(self) -> list[int]:
        return list(self.prefix_ids) + self.generated_ids

    @property
    def num_generated(self) -> int:
        return len(self.generated_ids)


def response_step_ids(response_ids: Sequence[int], delimiter_ids: frozenset[int], eos_id: int,
                      starts_new_step: bool = True, first_step: int = 1) -> list[int]:
    """Step index of every response token: the first response token opens step ``first_step``; later a token
    opens a new step iff the previous token is a delimiter, unless it is the end token (which stays with the
    step it closes)."""
    steps, current, new_next = [], first_step - 1, starts_new_step
    for tok in response_ids:
        if new_next and (tok != eos_id or not steps):
            current += 1
        steps.append(current)
        new_next = tok in delimiter_ids
    return steps


def step_starts_from_ids(step_ids: Sequence[int], first_step: int = 1) -> list[int]:
    starts, last = [], first_step - 1
    for i, s in enumerate(step_ids):
        if s != last:
            starts.append(i)
            last = s
    return starts


class StepAttentionAccumulator:
    """Running sums ``sum_{t in j, u in k} A[l, h, t, u]`` per sequence, fed with chunks of attention rows."""

    def __init__(self, batch: int, num_layers: int, num_heads: int, num_steps: int = 8,
                 device: torch.device | str = "cpu") -> None:
        self.sums = torch.zeros(batch, num_layers, num_heads, num_steps, num_steps, device=device)

    def _grow(self, needed: int) -> None:
        S = self.sums.shape[-1]
        if needed > S:
            new = max(needed, 2 * S)
            self.sums = nn.functional.pad(self.sums, (0, new - S, 0, new - S))

    def add(self, attentions: Sequence[torch.Tensor], query_steps: torch.Tensor, key_steps: torch.Tensor) -> None:
        """``attentions``: per layer (B, H, Tq, Tk); ``query_steps`` (B, Tq), ``key_steps`` (B, Tk); -1 = ignore."""
        self._grow(int(max(query_steps.max(), key_steps.max())) + 1)
        S = self.sums.shape[-1]
        wq = nn.functional.one_hot(query_steps + 1, S + 1)[..., 1:].float()  # (B, Tq, S); ignored rows are 0
        wk = nn.functional.one_hot(key_steps + 1, S + 1)[..., 1:].float()
        wq_t = wq.transpose(1, 2)[:, None]  # (B, 1, S, Tq)
        for layer, a in enumerate(attentions):
            # HF eager attention may leave NaN rows for padding queries; those rows carry zero weight anyway.
            per_key_step = a.float().nan_to_num(0.0) @ wk[:, None]  # (B, H, Tq, S)
            self.sums[:, layer] += wq_t @ per_key_step

    def step_attention(self, b: int, step_ids: Sequence[int]) -> torch.Tensor:
        """alpha (L, H, S, S) of sequence ``b`` whose tokens (prompt included) have ``step_ids``."""
        counts = torch.bincount(torch.as_tensor(step_ids)).float().to(self.sums.device)
        S = counts.numel()
        return self.sums[b, :, :, :S, :S] / (counts[:, None] * counts[None, :]).clamp(min=1.0)


def aggregate_step_attention(attentions: Sequence[torch.Tensor], step_ids: Sequence[int]) -> torch.Tensor:
    """alpha (L, H, S, S) from full token attention (per layer (H, T, T) or (1, H, T, T)) of one sequence."""
    attn = [a if a.dim() == 4 else a[None] for a in attentions]
    ids = torch.as_tensor(step_ids, device=attn[0].device)[None]
    acc = StepAttentionAccumulator(1, len(attn), attn[0].shape[1], int(ids.max()) + 1, attn[0].device)
    acc.add(attn, ids, ids)
    return acc.step_attention(0, step_ids)


def _cache_kwarg(model: nn.Module) -> str:
    """Name of the KV-cache argument: ``cache`` in transformers >= 5.x, ``past_key_values`` before (and here)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _accepts(model: nn.Module, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters


def _forward(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
             cache=None, use_cache: bool = False, output_attentions: bool = False, last_logits_only: bool = False):
    """One forward pass under the HF calling convention; returns (logits, cache, attentions).

    ``last_logits_only``: the caller reads the last position's logits only; an HF model that takes
    ``logits_to_keep`` then skips the (B, T, vocab) projection of the rest (at a 152k vocabulary, the prefill of a
    batch of long prompts would otherwise be the largest tensor of a decoding call).
    """
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                  use_cache=use_cache, output_attentions=output_attentions)
    if cache is not None:
        kwargs[_cache_kwarg(model)] = cache
    if last_logits_only and _accepts(model, "logits_to_keep"):
        kwargs["logits_to_keep"] = 1
    out = model(**kwargs)
    new_cache = getattr(out, "cache", None) if "cache" in getattr(out, "__dataclass_fields__", {}) else \
        getattr(out, "past_key_values", None)
    return out.logits, new_cache, out.attentions if output_attentions else None


def _sample(logits: torch.Tensor, temperature: float, generator: torch.Generator | None):
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    logp = logits.log_softmax(-1)
    if temperature > 0:
        tokens = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    else:
        tokens = logits.argmax(-1)
    entropy = -(logp.exp() * logp).nan_to_num().sum(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1), entropy


@torch.no_grad()
def generate(policy: Policy, requests: Sequence[GenerationRequest], max_new_tokens: int, temperature: float = 1.0,
             generator: torch.Generator | None = None, step_score_fn: StepScoreFn | None = None,
             max_batch_size: int | None = None) -> list[Rollout]:
    """Sample responses (initial samples and continuations alike) with a KV cache, on the model's device
    (``generator`` must live there too).

    ``temperature=0`` decodes greedily. With ``step_score_fn`` (e.g. ``functools.partial(attnrl.fci_scores,
    delta=1)``) the attention rows of every context and sampled token are aggregated into step-to-step attention
    during decoding and each rollout gets ``step_scores = step_score_fn(alpha)``. Everything a remote worker needs
    is the policy weights, the requests and this function; the result is plain Python data.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    chunk = max_batch_size or len(requests) or 1
    out: list[Rollout] = []
    for i in range(0, len(requests), chunk):
        out += _generate_batch(policy, list(requests[i:i + chunk]), max_new_tokens, temperature, generator,
                               step_score_fn)
    return out


def _generate_batch(policy: Policy, requests: list[GenerationRequest], max_new_tokens: int, temperature: float,
                    generator: torch.Generator | None, step_score_fn: StepScoreFn | None) -> list[Rollout]:
    model, codec = policy.model, policy.codec
    was_training = model.training
    model.eval()
    B = len(requests)
    delim = torch.tensor(sorted(codec.delimiter_ids), dtype=torch.long)
    contexts = [list(r.prompt_ids) + list(r.prefix_ids) for r in requests]
    width = max(len(c) for c in contexts)
    ids = torch.full((B, width), codec.pad_id, dtype=torch.long)
    mask = torch.zeros(B, width, dtype=torch.long)
    token_steps = torch.full((B, width), -1, dtype=torch.long)  # step index of every position, -1 for padding
    for b, (r, ctx) in enumerate(zip(requests, contexts)):
        ids[b, width - len(ctx):] = torch.tensor(ctx)
        mask[b, width - len(ctx):] = 1
        steps = [0] * len(r.prompt_ids) + response_step_ids(r.prefix_ids, codec.delimiter_ids, codec.eos_id)
        token_steps[b, width - len(ctx):] = torch.tensor(steps)
    caps = torch.tensor([min(max_new_tokens, r.max_new_tokens or max_new_tokens) for r in requests])
    if (caps < 1).any():
        raise ValueError("every request needs max_new_tokens >= 1")
    device = next(model.parameters()).device
    ids, mask, token_steps, caps, delim = (x.to(device) for x in (ids, mask, token_steps, caps, delim))
    current_step = token_steps[:, -1].clone()
    empty_response = torch.tensor([len(r.prefix_ids) == 0 for r in requests], device=device)
    opens_step = empty_response | torch.tensor([bool(r.prefix_ids) and r.prefix_ids[-1] in codec.delimiter_ids
                                                for r in requests], device=device)
    positions = mask.sum(1)  # position id of the next token

    need_attn = step_score_fn is not None
    acc = None
    with policy.autocast():
        logits, past, attentions = _forward(model, ids, mask, (mask.cumsum(1) - 1).clamp(min=0), None, True,
                                            need_attn, last_logits_only=True)
    if need_attn:
        acc = StepAttentionAccumulator(B, len(attentions), attentions[0].shape[1], int(token_steps.max()) + 8,
                                       device)
        acc.add(attentions, token_steps, token_steps)
    logits = logits[:, -1]
    sampled, sampled_lp, sampled_ent, alive = [], [], [], []  # per decoding step, (B,) each
    done = torch.zeros(B, dtype=torch.bool, device=device)
    ended_with_eos = torch.zeros(B, dtype=torch.bool, device=device)
    for t in range(int(caps.max())):
        tokens, lp, ent = _sample(logits, temperature, generator)
        tokens = torch.where(done, torch.full_like(tokens, codec.pad_id), tokens)
        sampled.append(tokens), sampled_lp.append(lp), sampled_ent.append(ent), alive.append(~done)
        current_step = current_step + (opens_step & ((tokens != codec.eos_id) | empty_response) & ~done).long()
        empty_response = torch.zeros_like(empty_response)
        new_steps = torch.where(done, -1, current_step)
        opens_step = torch.isin(tokens, delim)
        eos = (tokens == codec.eos_id) & ~done
        ended_with_eos |= eos
        finishing = eos | (t + 1 >= caps)
        all_done = bool((done | finishing).all())
        token_steps = torch.cat([token_steps, new_steps[:, None]], dim=1)
        if all_done and not need_attn:
            break
        # Feed the sampled token: its logits give the next sample and its attention row is FCI input, so the
        # final token of every sequence is fed once too (attention only) before stopping.
        mask = torch.cat([mask, (~done).long()[:, None]], dim=1)
        with policy.autocast():
            logits, past, attentions = _forward(model, tokens[:, None], mask, positions[:, None], past, True,
                                                need_attn)
        positions = positions + (~done).long()  # finished rows keep feeding padding at a frozen position
        if need_attn:
            acc.add(attentions, new_steps[:, None], token_steps)
        done |= finishing
        if all_done:
            break
        logits = logits[:, -1]

    n_generated = torch.stack(alive, 1).sum(1).tolist()
    tokens_all, lp_all, ent_all = (torch.stack(x, 1).tolist() for x in (sampled, sampled_lp, sampled_ent))
    rollouts = []
    for b, r in enumerate(requests):
        n = n_generated[b]
        steps = token_steps[b, width - len(contexts[b]):width + n].tolist()
        scores = step_score_fn(acc.step_attention(b, steps)).tolist() if acc is not None else None
        rollouts.append(Rollout(prompt_ids=tuple(r.prompt_ids), prefix_ids=tuple(r.prefix_ids),
                                generated_ids=tokens_all[b][:n], logprobs=lp_all[b][:n], entropies=ent_all[b][:n],
                                finished=bool(ended_with_eos[b]),
                                step_starts=step_starts_from_ids(steps[len(r.prompt_ids):]), step_scores=scores,
                                tag=r.tag))
    model.train(was_training)
    return rollouts

class HFCodec:
    """:class:`TokenCodec` over a Hugging Face tokenizer: every token whose text contains the delimiter ends a
    step (the reference code treats all vocabulary entries containing ``"\\n\\n"`` as separators)."""

    def __init__(self, tokenizer, delimiter: str = "\n") -> None:
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        vocab = tokenizer.get_vocab()
        self.delimiter_ids = frozenset(i for i in vocab.values() if delimiter in tokenizer.decode([i]))
        if not self.delimiter_ids:
            raise ValueError(f"no vocabulary token contains the step delimiter {delimiter!r}")

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def load_hf_policy(path: str, delimiter: str = "\n", autocast_bf16: bool = False,
                   dtype: torch.dtype = torch.float32) -> Policy:
    """A local HF causal-LM directory as a :class:`Policy`, with eager attention so attention weights exist.

    The weights are loaded as ``dtype``, fp32 by default whatever the checkpoint holds: transformers 5 otherwise
    keeps a checkpoint's own dtype (DeepSeek-R1-Distill-Qwen-1.5B is stored in bf16), and a bf16 parameter does
    not move under an update of lr 1e-6 (its spacing near 0.02 is ~1e-4), so RL would silently stop learning.
    bf16 belongs to the matmuls, under ``autocast_bf16``. A sampler that never updates may pass bf16 to halve its
    copy.
    """
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    dtype_kwarg = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"  # renamed in transformers 4.56
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", **{dtype_kwarg: dtype})
    tokenizer = AutoTokenizer.from_pretrained(path)
    return Policy(model=model, codec=HFCodec(tokenizer, delimiter), autocast_bf16=autocast_bf16)


# Teacher-forced scoring (the learner's log-probs) lives in algos.attnrl.scoring, which uses this module's forward
# pass.
