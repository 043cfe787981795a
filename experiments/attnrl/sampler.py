"""Pool sampler for AttnRL: LM rollouts (initial samples and continuations) with FCI and exact-match rewards.

config:  task (envs.reasoning.task.ReasoningTaskConfig fields), seed, hf_model (local HF model dir or None),
         delimiter (step delimiter of an HF tokenizer), autocast_bf16 (true, false or "auto": by the device),
         max_batch_size, run (the run id: samplers of different runs are different samplers)
weights: experiments.attnrl.weights (the character GPT or a local Hugging Face causal LM)
request: items (list of {prompt_ids, prefix_ids, max_new_tokens, tag, problem}), max_new_tokens, temperature,
         fci (None, or {"delta", "zero_first_step"}: FCI from the attention rows of the decoding pass), seed
result:  rollouts (algos.attnrl.lm.Rollout, ``meta["reward"]`` = exact-match reward scored here,
         ``meta["weights_version"]``), generated_tokens, weights_version, num_samples

The worker holds one policy per (sampler config); a new weights version is loaded in place (a state dict), so an
HF model is read from disk once per worker. The model lives on the device Ray gave the worker (its GPU share in the
pool's ``gpu`` group, where memory is capped to that share; else the CPU), decoding in bf16 where that device runs it
natively.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from algos.attnrl.fci import fci_scores
from algos.attnrl.lm import GenerationRequest, Policy, generate
from algos.precision import use_bf16
from cluster.devices import assigned_device
from envs.reasoning.task import ReasoningTask, ReasoningTaskConfig
from experiments.attnrl.weights import build_policy


class LMSampler:
    KEYS = {"task", "seed", "hf_model", "delimiter", "autocast_bf16", "max_batch_size", "run"}

    def __init__(self, config: dict) -> None:
        unknown = sorted(set(config) - self.KEYS)
        if unknown:
            raise ValueError(f"lm sampler config: unknown keys {unknown} (valid: {sorted(self.KEYS)})")
        self.config = dict(config)
        self.task = ReasoningTask(ReasoningTaskConfig(**(config.get("task") or {})))
        self.policy: Policy | None = None
        self.version = 0
        self.device = assigned_device()
        _cap_gpu_memory(self.device)
        self.generator = torch.Generator(device=self.device).manual_seed(int(config.get("seed", 0)))

    def load_weights(self, weights: dict, version: int) -> None:
        same_model = self.policy is not None and weights.get("kind") == self._kind and \
            weights.get("gpt") == self._gpt and weights.get("path") == self._path
        if same_model and weights.get("state_dict") is not None:
            self.policy.model.load_state_dict(weights["state_dict"])  # new version of the same model: in place
        else:
            bf16 = use_bf16(self.config.get("autocast_bf16", "auto"), self.device)
            # a sampler never updates its weights: bf16 copies where it computes in bf16 (half the memory)
            self.policy = build_policy(weights, bf16, self.config.get("delimiter", "\n"),
                                       hf_dtype=torch.bfloat16 if bf16 else torch.float32)
            self.policy.model.to(self.device)
            self._kind, self._gpt, self._path = weights.get("kind"), weights.get("gpt"), weights.get("path")
        self.version = version

    def sample(self, request: dict) -> dict[str, Any]:
        if self.policy is None:
            raise RuntimeError("lm sampler: no weights loaded (publish the policy and pass weights=<key>)")
        if "seed" in request:  # reproducible per request, whichever worker runs it
            self.generator.manual_seed(int(request["seed"]))
        items = request["items"]
        requests = [GenerationRequest(tuple(it["prompt_ids"]), tuple(it.get("prefix_ids", ())),
                                      it.get("max_new_tokens"), tag=it.get("tag")) for it in items]
        fci = request.get("fci")
        step_score_fn = functools.partial(fci_scores, delta=int(fci["delta"]),
                                          zero_first_step=bool(fci.get("zero_first_step", False))) if fci else None
        rollouts = generate(self.policy, requests, int(request["max_new_tokens"]),
                            float(request.get("temperature", 1.0)), self.generator, step_score_fn,
                            self.config.get("max_batch_size"))
        decode = self.policy.codec.decode
        for it, r in zip(items, rollouts):
            # the reward oracle runs here, batched with generation (exact match of the final line)
            r.meta["reward"] = self.task.reward(it["problem"], decode(r.response_ids), r.finished) \
                if it.get("problem") is not None else None
            r.meta["weights_version"] = self.version
        return {"rollouts": rollouts, "generated_tokens": sum(r.num_generated for r in rollouts),
                "weights_version": self.version, "num_samples": len(rollouts)}


def _cap_gpu_memory(device: torch.device) -> None:
    """Ray shares a GPU between fractional workers by accounting only: hold this process to its fraction."""
    if device.type != "cuda":
        return
    import ray
    share = ray.get_runtime_context().get_assigned_resources().get("GPU", 1.0) if ray.is_initialized() else 1.0
    if 0.0 < share < 1.0:
        torch.cuda.set_per_process_memory_fraction(share, device)
