"""Smoke-scale learning: AttnRL on top of the pretrained tiny GPT raises accuracy (fixed seeds, fixed budget)."""

import copy
import random

import pytest
import torch

from algos.attnrl import RLConfig, train
from algos.gpt import GPTConfig
from algos.sft import SFTConfig, default_cache_dir, evaluate_accuracy, pretrained_policy
from envs.reasoning import ReasoningTask

torch.set_num_threads(1)

TOKEN_BUDGET = 30_000
MIN_GAIN = 0.05


@pytest.fixture(scope="module")
def sft_policy():
    """The default (laptop-scale) task, model and SFT run; cached on disk (algos.sft.default_cache_dir) and
    shared with test_gpt_lm."""
    task = ReasoningTask()
    policy, info = pretrained_policy(task, GPTConfig(vocab_size=task.tokenizer.vocab_size), SFTConfig(),
                                     cache_dir=default_cache_dir())
    return policy, task, info


def test_attnrl_improves_accuracy_over_sft(sft_policy):
    sft, task, _ = sft_policy
    problems = [p for d in range(task.cfg.min_steps, task.cfg.max_steps + 1)
                for p in task.sample(random.Random(2024), 40, difficulty=d)]
    before = evaluate_accuracy(sft, task, problems)
    policy, ref = copy.deepcopy(sft), copy.deepcopy(sft)
    out = train("attnrl", policy, ref, task, RLConfig(token_budget=TOKEN_BUDGET, seed=0))
    after = evaluate_accuracy(policy, task, problems)
    assert out["generated_tokens"] >= TOKEN_BUDGET and out["updates"] >= 3
    assert all(0.0 < h["valid_prompt_ratio"] <= 1.0 for h in out["history"][:1])
    assert after.accuracy >= before.accuracy + MIN_GAIN, (before, after, out["history"][-1])
