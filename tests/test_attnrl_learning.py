"""Smoke-scale learning: AttnRL on top of the pretrained tiny GPT raises accuracy (fixed seeds, fixed budget).

Measured with the defaults (3 seeds, 30k generated tokens, same 400 problems): avg@4 at temperature 0.6 goes from
0.466 (SFT) to 0.501 / 0.501 / 0.486; the test runs seed 0 and asks for +2 points.
"""

import copy
import random

import pytest
import torch

from algos.attnrl.attnrl import RLConfig, train
from algos.attnrl.gpt import GPTConfig
from algos.attnrl.sft import SFTConfig, default_cache_dir, evaluate_accuracy, pretrained_policy
from envs.reasoning.task import ReasoningTask

torch.set_num_threads(1)

TOKEN_BUDGET = 30_000
SAMPLES_PER_PROBLEM = 4
MIN_GAIN = 0.02


@pytest.fixture(scope="module")
def sft_policy():
    """The default (laptop-scale) task, model and SFT run; cached on disk (algos.attnrl.sft.default_cache_dir) and
    shared with test_gpt_lm."""
    task = ReasoningTask()
    policy, info = pretrained_policy(task, GPTConfig(vocab_size=task.tokenizer.vocab_size), SFTConfig(),
                                     cache_dir=default_cache_dir())
    return policy, task, info


def _avg_at_k(policy, task, problems) -> float:
    """avg@k at temperature 0.6 (the paper's evaluation protocol, scaled down), with a fixed sampling seed."""
    return evaluate_accuracy(policy, task, problems * SAMPLES_PER_PROBLEM, temperature=0.6,
                             generator=torch.Generator().manual_seed(0)).accuracy


def test_attnrl_improves_accuracy_over_sft(sft_policy):
    sft, task, _ = sft_policy
    problems = [p for d in range(task.cfg.min_steps, task.cfg.max_steps + 1)
                for p in task.sample(random.Random(31337), 100, difficulty=d)]
    before = _avg_at_k(sft, task, problems)
    policy, ref = copy.deepcopy(sft), copy.deepcopy(sft)
    out = train("attnrl", policy, ref, task, RLConfig(token_budget=TOKEN_BUDGET, seed=0))
    after = _avg_at_k(policy, task, problems)
    assert abs(out["generated_tokens"] - TOKEN_BUDGET) < 0.25 * TOKEN_BUDGET and out["updates"] >= 3
    assert all(0.0 < h["valid_prompt_ratio"] <= 1.0 for h in out["history"])
    assert after >= before + MIN_GAIN, (before, after, out["history"][-1])
