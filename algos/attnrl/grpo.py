"""GRPO, the outcome-reward baseline: n independent samples per prompt, each rewarded by exact match, advantages
normalized within the prompt's group, one PPO update per batch."""

from __future__ import annotations

import time

import torch

from algos.attnrl.lm import GenerationRequest
from algos.attnrl.ppo import TrainSequence
from algos.attnrl.training_run import TrainingRun, valid_tokens


def grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(r - mean_group) / (std_group + eps) for rewards (num_prompts, n); std is the unbiased one (as verl)."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be (num_prompts, n >= 2), got shape {tuple(rewards.shape)}")
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + eps)


def train_grpo(run: TrainingRun) -> None:
    cfg, codec = run.cfg, run.policy.codec
    n = cfg.samples_per_prompt
    update = 0
    while prompts := run.batch_prompts(update, cfg.prompts_per_batch):  # the last batches cut to what fits
        t0 = time.perf_counter()
        problems = run.task.sample(run.rng, prompts)
        requests = [GenerationRequest(tuple(codec.encode(p.prompt)), tag=(i, j))
                    for i, p in enumerate(problems) for j in range(n)]
        rollouts = run.sample(requests, update)
        rewards = torch.tensor([run.score(problems[r.tag[0]], r) for r in rollouts]).view(len(problems), n)
        adv = grpo_advantages(rewards)
        sequences = [TrainSequence(list(r.prompt_ids), r.response_ids, r.logprobs,
                                   [float(adv[r.tag])] * r.num_generated, float(rewards[r.tag]))
                     for r in rollouts]
        stats = run.update(sequences)
        update += 1
        valid = int((rewards.std(dim=1) > 0).sum())
        run.record({"update": update, "prompts": len(problems), "mean_reward": float(rewards.mean()),
                    "valid_prompt_ratio": valid / len(problems), "train_sequences": len(sequences),
                    "train_tokens": sum(len(s.response_ids) for s in sequences),
                    "valid_train_tokens": valid_tokens(sequences),
                    "seconds": time.perf_counter() - t0} | stats)
