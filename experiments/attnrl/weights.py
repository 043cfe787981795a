"""The published-weights format of AttnRL's policies, written by the driver and learner, read by the samplers.

    {"kind": "gpt", "gpt": GPTConfig fields, "state_dict": ...}         the character GPT
    {"kind": "hf", "path": <local HF model dir>, "state_dict": ... | None}   a Hugging Face causal LM

Plain dicts of tensors, numbers and strings, so ``torch.load(..., weights_only=True)`` reads every saved copy.
"""
from __future__ import annotations

import dataclasses

import torch

from algos.attnrl.lm import Policy


def gpt_weights(policy: Policy, gpt_cfg) -> dict:
    return {"kind": "gpt", "gpt": dataclasses.asdict(gpt_cfg), "state_dict": cpu_state(policy.model)}


def hf_weights(policy: Policy, path: str) -> dict:
    return {"kind": "hf", "path": path, "state_dict": cpu_state(policy.model)}


def with_state(weights: dict, policy: Policy) -> dict:
    """A new version of the same model: ``weights`` with ``policy``'s current parameters."""
    return {**weights, "state_dict": cpu_state(policy.model)}


def cpu_state(model) -> dict:
    return {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}


def build_policy(weights: dict, autocast_bf16: bool = False, delimiter: str = "\n",
                 hf_dtype: torch.dtype = torch.float32) -> Policy:
    """A policy (on the CPU, in eval mode) from published weights; ``delimiter`` ends a step for an HF tokenizer.
    An HF model's weights are ``hf_dtype``: fp32 master weights for a learner (``load_hf_policy``), bf16 for a
    sampler that computes in bf16 anyway and holds several models (``pool.max_samplers_per_worker``)."""
    kind = weights.get("kind")
    if kind == "gpt":
        from algos.attnrl.gpt import GPT, GPTConfig
        from envs.reasoning.task import CharTokenizer
        policy = Policy(GPT(GPTConfig(**weights["gpt"])), CharTokenizer(), autocast_bf16)
    elif kind == "hf":
        from algos.attnrl.lm import load_hf_policy
        policy = load_hf_policy(weights["path"], delimiter, autocast_bf16, dtype=hf_dtype)
    else:
        raise ValueError(f"lm sampler: weights['kind'] must be 'gpt' or 'hf', got {kind!r}")
    if weights.get("state_dict") is not None:
        policy.model.load_state_dict(weights["state_dict"])
    policy.model.eval()
    return policy
