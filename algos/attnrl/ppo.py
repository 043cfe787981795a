"""The policy update shared by AttnRL and its baselines: PPO-clip on sequences with per-token advantages.

* :class:`TrainSequence`: one sampled response to train on (a GRPO sample or a root-to-leaf tree path).
* :func:`ppo_clip_loss`: PPO-clip with Clip-Higher (eps_low 0.2, eps_high 0.28, as in DAPO and the AttnRL recipe),
  token-mean aggregation over every response token of the mini-batch, plus a k3 ("low_var_kl") penalty to the
  frozen reference policy.
* :func:`ppo_update`: PPO-clip epochs over mini-batches of training sequences; with an :class:`UpdateContext` on
  the policy, on several data-parallel processes (:func:`follow_updates` on the ranks other than 0) and resumable.

Memory stays bounded by ``policy.max_tokens_per_forward``: the reference pass runs in chunks of that many padded
tokens, and each mini-batch is trained in micro-batches of that size whose gradients add up to the mini-batch's
(every micro-batch's loss is normalised by the token count of the whole mini-batch).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from algos.attnrl.config import RLConfig
from algos.attnrl.lm import Policy
from algos.attnrl.scoring import chunk_by_tokens, forward_scores


@dataclass
class TrainSequence:
    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    advantages: list[float]  # per response token
    reward: float


@dataclass
class UpdateContext:
    """How this process takes part in :func:`ppo_update` beyond computing a loss; set it as
    ``policy.update_context``.

    Data parallel (``world_size > 1``): rank 0 runs the training loop and, in every update, sends the sequences and
    the shuffled mini-batch orders over ``control_group`` to the other ranks, which wait in :func:`follow_updates`.
    Every rank trains on its share of each mini-batch, the gradients are summed over ``group`` before clipping and
    the optimizer step, so all ranks take the same step and keep identical parameters. A sum (not DDP's mean), as
    every share's loss is already divided by the token count of the whole mini-batch: the sum is the one-process
    gradient. No DDP wrapper: the model keeps its state-dict keys and call convention, and ranks may run different
    numbers of micro-batches (the only collective per mini-batch is the gradient sum, after backward).

    Resume (``replay_updates``): a resumed run replays the updates made before its checkpoint to rebuild the training
    loop's state (batches, pipelines, RNGs); those updates only advance the shuffling RNG. The checkpointed weights
    are loaded by the caller, ``optimizer_state`` into the run's optimizer right before its first real step.
    """

    rank: int = 0
    world_size: int = 1
    group: Any = None  # torch.distributed group of the gradient sum (None: the default group)
    control_group: Any = None  # group that carries the sequences (gloo: it waits while rank 0 samples)
    replay_updates: int = 0
    optimizer_state: dict | None = None
    optimizer: torch.optim.Optimizer | None = None  # the run's optimizer as of the last update (for checkpoints)
    bucket_elements: int = 1 << 24  # gradient elements summed per all-reduce call


def low_var_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): exp(r) - r - 1 with r = log pi_ref - log pi, clamped to
    [-10, 10] against the rare huge ratio; non-negative and unbiased for samples from pi."""
    r = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return (r.exp() - r - 1.0).clamp(-10.0, 10.0)


def ppo_clip_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, ref_logprobs: torch.Tensor | None = None, clip_low: float = 0.2,
                  clip_high: float = 0.28, kl_coef: float = 1e-3, token_count: int | None = None,
                  clip_ratio_c: float | None = 3.0) -> tuple[torch.Tensor, dict[str, float]]:
    """AttnRL Eq. 1: -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A), mean over masked tokens, + kl_coef KL;
    with ``clip_ratio_c`` verl's dual clip, which the released code runs (``core_algos.py:611-615``,
    ``clip_ratio_c: 3.0``): a negative advantage's token loss is at most -c A, so a stale sample whose ratio ran far
    up cannot drive the step.

    All tensors are (B, T); ``advantages`` are per token (a tree path carries each node's advantage on that
    node's tokens). ``token_count`` divides the sums instead of this batch's token count: a micro-batch of a larger
    mini-batch passes the mini-batch's count, so the micro-batches' losses (and gradients) add up to its token mean.
    Returns the loss and detached metrics.
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got clip_low={clip_low}, clip_high={clip_high}")
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (or None), got {clip_ratio_c}")
    mask = mask.to(logprobs.dtype)
    if token_count is None:
        n_tokens = mask.sum().clamp(min=1.0)
    else:
        n_tokens = torch.tensor(float(max(token_count, 1)), dtype=logprobs.dtype, device=logprobs.device)
    ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0).exp()
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    pg = -torch.minimum(unclipped, clipped)
    if clip_ratio_c is not None:
        pg = torch.where(advantages < 0, torch.minimum(pg, -advantages * clip_ratio_c), pg)
    pg_loss = (pg * mask).sum() / n_tokens
    loss = pg_loss
    metrics = {
        "pg_loss": float(pg_loss.detach()),
        "clip_fraction": float((((clipped != unclipped) & (mask > 0)).float().sum() / n_tokens).detach()),
        "approx_kl_old": float((((old_logprobs - logprobs) * mask).sum() / n_tokens).detach()),
    }
    if ref_logprobs is not None and kl_coef > 0:
        kl = (low_var_kl(logprobs, ref_logprobs) * mask).sum() / n_tokens
        loss = loss + kl_coef * kl
        metrics["kl_ref"] = float(kl.detach())
    metrics["loss"] = float(loss.detach())
    return loss, metrics


def ppo_update(policy: Policy, ref: Policy, optimizer: torch.optim.Optimizer, sequences: Sequence[TrainSequence],
               cfg: RLConfig, rng: random.Random) -> dict[str, float]:
    """PPO-clip epochs over mini-batches of training sequences (token-mean per mini-batch, KL to ``ref``).

    On rank 0 of a data-parallel group this is also where the other ranks get the update's sequences.
    """
    ctx = policy.update_context or UpdateContext()
    orders = []
    for _ in range(cfg.ppo_epochs if sequences else 0):
        order = list(range(len(sequences)))
        rng.shuffle(order)
        orders.append(order)
    if ctx.replay_updates > 0:  # done before the checkpoint being resumed: only the RNG moves on
        ctx.replay_updates -= 1
        return {}
    _adopt(optimizer, ctx)
    if ctx.world_size > 1:
        _send(ctx, sequences, orders, optimizer)
    elif not sequences:
        return {}
    return _train(policy, ref, optimizer, sequences, orders, cfg, ctx)


def follow_updates(policy: Policy, ref: Policy, cfg: RLConfig,
                   on_update: Callable[[dict[str, float]], None]) -> None:
    """The loop of a rank other than 0: take part in every update rank 0 makes until it sends the end; after each
    one ``on_update(metrics)``. Builds the same optimizer as rank 0's (its class and settings come with every
    update)."""
    ctx: UpdateContext = policy.update_context
    if ctx is None or ctx.rank == 0:
        raise ValueError("follow_updates runs on ranks > 0 of a data-parallel UpdateContext")
    ref.model.eval()
    for p in ref.model.parameters():
        p.requires_grad_(False)
    optimizer = None
    while True:
        message = _receive(ctx)
        if message is None:
            return
        sequences, orders, (name, defaults) = message
        if optimizer is None:
            optimizer = getattr(torch.optim, name)(policy.model.parameters(), **defaults)
        _adopt(optimizer, ctx)
        on_update(_train(policy, ref, optimizer, sequences, orders, cfg, ctx))


def stop_followers(ctx: UpdateContext | None) -> None:
    """Rank 0, after its last update: let the other ranks' :func:`follow_updates` return."""
    if ctx is not None and ctx.world_size > 1:
        _broadcast_object(ctx, None)


# --------------------------------------------------------------------------------------------------- training

def _train(policy: Policy, ref: Policy, optimizer: torch.optim.Optimizer, sequences: Sequence[TrainSequence],
           orders: list[list[int]], cfg: RLConfig, ctx: UpdateContext) -> dict[str, float]:
    """The epochs of one update, this rank's share of every mini-batch."""
    if not sequences:
        return {}
    shards = [[_shard(order[i:i + cfg.ppo_minibatch], ctx) for i in range(0, len(order), cfg.ppo_minibatch)]
              for order in orders]
    mine = sorted({j for epoch in shards for shard in epoch for j in shard})  # all of them on a single process
    prompts = [s.prompt_ids for s in sequences]
    responses = [s.response_ids for s in sequences]
    row = {j: k for k, j in enumerate(mine)}
    ref_lp = old_lp = adv = None
    if mine:
        with torch.no_grad():
            ref_lp = forward_scores(ref, [prompts[j] for j in mine], [responses[j] for j in mine],
                                    cfg.temperature).logprobs
        width = ref_lp.shape[1]

        def padded(rows: Sequence[Sequence[float]]) -> torch.Tensor:
            out = torch.zeros(len(rows), width)
            for i, r in enumerate(rows):
                out[i, :len(r)] = torch.tensor(r, dtype=torch.float32)
            return out

        old_lp = padded([sequences[j].old_logprobs for j in mine]).to(ref_lp.device)
        adv = padded([sequences[j].advantages for j in mine]).to(ref_lp.device)
    policy.model.train()
    sums: dict[str, float] = {}
    n_steps = 0
    for order, epoch in zip(orders, shards):
        for i, shard in zip(range(0, len(order), cfg.ppo_minibatch), epoch):
            minibatch_tokens = sum(len(responses[j]) for j in order[i:i + cfg.ppo_minibatch])
            optimizer.zero_grad(set_to_none=True)
            m: dict[str, float] = {}
            for micro in chunk_by_tokens([len(prompts[j]) + len(responses[j]) for j in shard],
                                         policy.max_tokens_per_forward):
                idx = [shard[k] for k in micro]
                rows = [row[j] for j in idx]
                scores = forward_scores(policy, [prompts[j] for j in idx], [responses[j] for j in idx],
                                        cfg.temperature)
                w = scores.logprobs.shape[1]
                loss, part = ppo_clip_loss(scores.logprobs, old_lp[rows, :w], adv[rows, :w], scores.mask,
                                           ref_lp[rows, :w], cfg.clip_low, cfg.clip_high, cfg.kl_coef,
                                           token_count=minibatch_tokens, clip_ratio_c=cfg.clip_ratio_c)
                loss.backward()
                for k, v in part.items():
                    m[k] = m.get(k, 0.0) + v
            if ctx.world_size > 1:
                m = _sum_gradients(policy.model, m, cfg.kl_coef > 0, ctx)
            m["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(policy.model.parameters(), cfg.grad_clip))
            optimizer.step()
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v
            n_steps += 1
    policy.model.eval()
    return {k: v / n_steps for k, v in sums.items()} | {"optimizer_steps": n_steps}


def _adopt(optimizer: torch.optim.Optimizer, ctx: UpdateContext) -> None:
    """Remember the run's optimizer; resumed, give it the checkpoint's moments before its first real step."""
    if ctx.optimizer_state is not None:
        optimizer.load_state_dict(ctx.optimizer_state)
        ctx.optimizer_state = None
    ctx.optimizer = optimizer


def _shard(minibatch: list[int], ctx: UpdateContext) -> list[int]:
    """This rank's consecutive share of a mini-batch (equal counts up to one; rank 0 first)."""
    if ctx.world_size == 1:
        return minibatch
    base, extra = divmod(len(minibatch), ctx.world_size)
    start = ctx.rank * base + min(ctx.rank, extra)
    return minibatch[start:start + base + (ctx.rank < extra)]


def _sum_gradients(model: torch.nn.Module, metrics: dict[str, float], kl: bool, ctx: UpdateContext
                   ) -> dict[str, float]:
    """Sum every parameter's gradient (a rank without sequences in this mini-batch adds zeros) and the metrics'
    token sums over the group, in buckets of at most ``ctx.bucket_elements`` elements."""
    import torch.distributed as dist
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[torch.Tensor] = []

    def flush() -> None:
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, group=ctx.group)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        bucket.clear()

    size = 0
    for p in params:
        if bucket and size + p.numel() > ctx.bucket_elements:
            flush()
            size = 0
        bucket.append(p.grad)
        size += p.numel()
    if bucket:
        flush()
    # the loss terms are token sums over the mini-batch's tokens: their totals are the single-process values
    keys = ["pg_loss", "clip_fraction", "approx_kl_old", "loss"] + (["kl_ref"] if kl else [])
    totals = torch.tensor([metrics.get(k, 0.0) for k in keys], dtype=torch.float64, device=params[0].grad.device)
    dist.all_reduce(totals, group=ctx.group)
    return dict(zip(keys, totals.tolist()))


# ------------------------------------------------------------------------------------------- rank 0 -> others

def _broadcast_object(ctx: UpdateContext, obj: Any) -> Any:
    import torch.distributed as dist
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=ctx.control_group)
    return box[0]


def _broadcast(ctx: UpdateContext, tensor: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist
    dist.broadcast(tensor, src=0, group=ctx.control_group)
    return tensor


def _send(ctx: UpdateContext, sequences: Sequence[TrainSequence], orders: list[list[int]],
          optimizer: torch.optim.Optimizer) -> None:
    """Rank 0: the update's sequences, packed into a few flat tensors, and the mini-batch orders."""
    header = {"n": len(sequences), "epochs": len(orders),
              "prompt_tokens": sum(len(s.prompt_ids) for s in sequences),
              "response_tokens": sum(len(s.response_ids) for s in sequences),
              "optimizer": (type(optimizer).__name__, dict(optimizer.defaults))}
    _broadcast_object(ctx, header)
    if not sequences:
        return
    _broadcast(ctx, torch.tensor([[len(s.prompt_ids), len(s.response_ids)] for s in sequences], dtype=torch.long))
    _broadcast(ctx, torch.tensor([t for s in sequences for t in s.prompt_ids], dtype=torch.long))
    _broadcast(ctx, torch.tensor([t for s in sequences for t in s.response_ids], dtype=torch.long))
    # float32, as ppo_update's padded tensors hold them on every rank
    _broadcast(ctx, torch.tensor([x for s in sequences for x in s.old_logprobs], dtype=torch.float32))
    _broadcast(ctx, torch.tensor([x for s in sequences for x in s.advantages], dtype=torch.float32))
    _broadcast(ctx, torch.tensor([s.reward for s in sequences], dtype=torch.float64))
    _broadcast(ctx, torch.tensor(orders, dtype=torch.long))


def _receive(ctx: UpdateContext):
    """Ranks > 0: (sequences, orders, optimizer spec) of the next update, or None when rank 0 is done."""
    header = _broadcast_object(ctx, None)
    if header is None:
        return None
    n, epochs = header["n"], header["epochs"]
    if n == 0:
        return [], [], header["optimizer"]
    lengths = _broadcast(ctx, torch.empty(n, 2, dtype=torch.long)).tolist()
    prompt_ids = _broadcast(ctx, torch.empty(header["prompt_tokens"], dtype=torch.long)).tolist()
    response_ids = _broadcast(ctx, torch.empty(header["response_tokens"], dtype=torch.long)).tolist()
    old_lp = _broadcast(ctx, torch.empty(header["response_tokens"], dtype=torch.float32)).tolist()
    adv = _broadcast(ctx, torch.empty(header["response_tokens"], dtype=torch.float32)).tolist()
    rewards = _broadcast(ctx, torch.empty(n, dtype=torch.float64)).tolist()
    orders = _broadcast(ctx, torch.empty(epochs, n, dtype=torch.long)).tolist()
    sequences, p, r = [], 0, 0
    for (lp, lr), reward in zip(lengths, rewards):
        sequences.append(TrainSequence(prompt_ids[p:p + lp], response_ids[r:r + lr], old_lp[r:r + lr],
                                       adv[r:r + lr], reward))
        p, r = p + lp, r + lr
    return sequences, orders, header["optimizer"]
