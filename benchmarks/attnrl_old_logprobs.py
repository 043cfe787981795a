"""AttnRL's old log-probs: the sampler's own (orrery) against the learner's recompute (the released code).

The released trainer recomputes every token's old log-prob with the training actor before the update
(``attnrl_ray_trainer_off.py:672``, ``:725``); orrery takes the log-probs its sampler computed while decoding
(``algos.attnrl.lm.generate``, KV cache, one token at a time). Where the two differ, the PPO ratio of the first
mini-batch is not 1 and the clip sees a difference no update made. This script measures that difference on this
machine for the task's GPT at the study's size and at a wider one: the same weights decode a batch, then the
learner's teacher-forced pass (``forward_scores``) scores the same tokens, in fp32 and under bf16 autocast (what
``autocast_bf16: auto`` picks where the CPU runs bf16 natively). The peer is the recompute itself.

    .venv/bin/python -m benchmarks.attnrl_old_logprobs [--prompts 32] [--new-tokens 60]
"""
from __future__ import annotations

import argparse

import torch

from algos.attnrl.gpt import GPT, GPTConfig
from algos.attnrl.lm import GenerationRequest, Policy, generate
from algos.attnrl.scoring import forward_scores
from algos.precision import bf16_native
from envs.reasoning.task import CharTokenizer

SIZES = {"2 layers x 64 (the attnrl study's)": dict(n_layer=2, n_embd=64, n_head=4),
         "4 layers x 256": dict(n_layer=4, n_embd=256, n_head=8)}


def old_logprob_gap(model: torch.nn.Module, codec: CharTokenizer, bf16: bool, prompts: int, new_tokens: int,
                    seed: int = 1) -> dict[str, float]:
    """Per generated token: |sampler log-prob - recomputed log-prob| (mean, max) and the first ratio's largest
    distance from 1."""
    policy = Policy(model, codec, bf16)
    requests = [GenerationRequest(tuple(codec.encode(f"{i % 50}+{(7 * i) % 40}="))) for i in range(prompts)]
    rollouts = generate(policy, requests, max_new_tokens=new_tokens, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        scores = forward_scores(policy, [r.prompt_ids for r in rollouts], [r.response_ids for r in rollouts])
    gaps = torch.cat([torch.tensor(r.logprobs) - scores.logprobs[i, :r.num_generated].float()
                      for i, r in enumerate(rollouts)])
    return {"tokens": float(gaps.numel()), "mean_abs": float(gaps.abs().mean()), "max_abs": float(gaps.abs().max()),
            "max_ratio_gap": float((gaps.exp() - 1).abs().max())}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=60)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    codec = CharTokenizer()
    native = bf16_native("cpu")
    print(f"bf16 native on this CPU: {native} (autocast_bf16: auto picks {'bf16' if native else 'fp32'})")
    print("| model | compute | tokens | mean abs gap (nats) | max abs gap | max abs(ratio - 1) | PPO clip |")
    print("|---|---|---|---|---|---|---|")
    for name, size in SIZES.items():
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=codec.vocab_size, **size)).eval()
        for bf16 in (False, True):
            gap = old_logprob_gap(model, codec, bf16, args.prompts, args.new_tokens)
            print(f"| {name} | {'bf16 autocast' if bf16 else 'fp32'} | {gap['tokens']:.0f} | {gap['mean_abs']:.1e} "
                  f"| {gap['max_abs']:.1e} | {gap['max_ratio_gap']:.1e} | 0.2 |")


if __name__ == "__main__":
    main()
