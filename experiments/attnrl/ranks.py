"""What the AttnRL learner's ranks share: the checkpoint they resume from, the update context that makes them one
data-parallel learner, their per-rank checkpoint shard, and the loop of the ranks other than 0.

Rank 0 runs the training loop (generation, trees, adaptive sampling: one sequential pipeline) and sends each update's
sequences to the others (``algos.attnrl.ppo``); every rank trains on its share of each mini-batch and the gradients
are summed, so every rank takes the same step. Hence rank 0's checkpoint file (``learner.pt``) is the learner's
whole state and every rank resumes from it (with any number of workers); each rank adds ``rank<r>.json`` with a
digest of its parameters, and a checkpoint is only written once all digests agree.

Every rank reports equally often (Ray Train's rule): once when it starts, once per live update, once at the end.
"""
from __future__ import annotations

import copy
import datetime
import hashlib
import json
import logging
from pathlib import Path

import torch

from algos.attnrl.ppo import UpdateContext, follow_updates
from algos.precision import use_bf16
from cluster import ddp
from experiments.attnrl.config import Config
from experiments.attnrl.learner_state import load_learner_state
from experiments.attnrl.sft_stage import load_sft
from experiments.attnrl.weights import build_policy

log = logging.getLogger(__name__)

STATE_FILE = "learner.pt"  # rank 0's whole learner state; see experiments.attnrl.learner.Learner.state
DONE_FILE = "done"
CONTROL_TIMEOUT = datetime.timedelta(days=1)  # ranks > 0 wait on rank 0 while it samples (and evaluates)


def saved_state(method: str) -> dict | None:
    """The last checkpoint's learner state (``done`` set when the method finished); None on a first attempt."""
    with ddp.latest_checkpoint() as ckpt:
        if ckpt is None:
            return None
        state = load_learner_state(ckpt / STATE_FILE)
        state["done"] = (ckpt / DONE_FILE).exists()
    if state["done"]:
        log.info("%s already finished in this run: nothing to do", method)
    else:
        log.warning("%s: resuming after update %d", method, state["updates"])
    return state


def update_context(saved: dict | None) -> UpdateContext:
    """This rank's part in the updates; a resumed rank 0 replays the checkpoint's updates, every rank loads its
    optimizer moments before the first real step."""
    rank, world = ddp.rank(), ddp.world_size()
    control = None
    if world > 1:
        import torch.distributed as dist
        # gloo with a long timeout: the sequences are small next to the gradients, and the other ranks wait here
        # for as long as rank 0 samples; gradients go over the default group (NCCL on GPUs).
        control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    return UpdateContext(rank=rank, world_size=world, control_group=control,
                         replay_updates=saved["updates"] if saved is not None and rank == 0 else 0,
                         optimizer_state=saved.get("optimizer") if saved is not None else None)


def load_policies(exp: Config, sft_path: str, saved: dict | None, context: UpdateContext):
    """(policy, reference, SFT weights) on this worker's device: the reference is the SFT model (frozen), the
    policy too until ``saved`` (a checkpoint's weights) is loaded; bf16 as the hardware decides."""
    device = ddp.device()
    sft_weights, _ = load_sft(sft_path)
    policy = build_policy(sft_weights, use_bf16(exp.autocast_bf16, device))
    policy.model.to(device)
    policy.max_tokens_per_forward = exp.max_tokens_per_forward
    ref = copy.deepcopy(policy)
    policy.update_context = context
    return policy, ref, sft_weights


def param_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().to("cpu").contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def write_rank_shard(d: Path, model: torch.nn.Module, updates: int, context: UpdateContext) -> None:
    """``rank<r>.json`` (updates, parameter digest); with several ranks, fail if their parameters differ."""
    digest = param_digest(model)
    if context.world_size > 1:
        import torch.distributed as dist
        digests: list = [None] * context.world_size
        dist.all_gather_object(digests, digest, group=context.control_group)
        if len(set(digests)) != 1:
            raise RuntimeError(f"AttnRL learner ranks diverged after update {updates}: parameter digests {digests}")
    (d / f"rank{context.rank}.json").write_text(json.dumps({"updates": updates, "param_digest": digest}))


class Follower:
    """A rank other than 0: the same policy and reference, trained on its share of every update rank 0 makes."""

    def __init__(self, config: dict, saved: dict | None, context: UpdateContext) -> None:
        self.exp = exp = Config(**config["experiment"])
        self.method = config["method"]
        self.context = context
        self.policy, self.ref, _ = load_policies(exp, config["sft_path"], saved, context)
        if saved is not None and saved.get("weights") is not None:
            self.policy.model.load_state_dict(saved["weights"]["state_dict"])
        self.updates = saved["updates"] if saved is not None else 0
        self.rl_cfg = exp.rl_config(self.method, config["seed"]).resolved(self.method)
        self.fresh = saved is None

    def run(self) -> None:
        if self.fresh:
            self.checkpoint()
        else:
            ddp.report({"update": float(self.updates)})
        follow_updates(self.policy, self.ref, self.rl_cfg, self.after_update)
        self.checkpoint()

    def after_update(self, metrics: dict) -> None:
        self.updates += 1
        if self.updates % self.exp.checkpoint_every_updates == 0:
            self.checkpoint()
        else:
            ddp.report({"update": float(self.updates)})

    def checkpoint(self) -> None:
        with ddp.checkpoint_dir() as d:
            write_rank_shard(d, self.policy.model, self.updates, self.context)
            ddp.report({"update": float(self.updates)}, checkpoint_dir=d)
