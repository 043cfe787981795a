"""Issue 39's GPU-path bugs, each checked on a CPU-only machine with a test that fails when its bug is put back:
device placement through ``meta`` tensors (an op mixing a cpu and a meta tensor raises, as cpu with cuda does),
fp32 master weights of a bf16-saved Hugging Face model, bounded log-prob temporaries, the deploy files and the
GPU nodes' pinned environment."""
from __future__ import annotations

import torch

from algos.attnrl.fci import fci_scores, later_attention
from algos.attnrl.lm import StepAttentionAccumulator


# ------------------------------------------------------------------------- 1. FCI's mask on the sums' device

def test_fci_runs_where_the_attention_sums_are():
    """The sampler accumulates step attention on its GPU; FCI's comparison mask must be built there too (a cpu mask
    times cuda sums raises on a GPU; meta stands in for cuda here)."""
    alpha = torch.zeros(2, 3, 5, 5, device="meta")
    assert later_attention(alpha, 1).device.type == "meta"
    assert fci_scores(alpha, 1, zero_first_step=True).device.type == "meta"


def test_fci_of_the_samplers_accumulator_on_its_device():
    """The path of ``generate(..., step_score_fn=fci)``: the accumulator's sums live on the model's device, and
    ``step_score_fn(acc.step_attention(b, steps))`` must not leave it."""
    from algos.attnrl.tree_rl import fci_step_score_fn
    from algos.attnrl.config import RLConfig
    acc = StepAttentionAccumulator(batch=2, num_layers=2, num_heads=2, num_steps=8, device="meta")
    alpha = acc.step_attention(1, [0, 0, 0, 1, 1, 2, 3, 3])
    assert fci_step_score_fn(RLConfig().resolved("attnrl"))(alpha).shape == (4,)
