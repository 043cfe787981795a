"""AttnRL's token budget is a cap (issue 48): a batch starts only if its worst case, known from the config, fits in
what is left, and the last batches are cut to the prompts whose worst case still fits, so a run ends at or below its
budget and stops only when not even one prompt fits; a budget below one batch's worst case is refused in one line."""
from __future__ import annotations

import pytest
import torch

from algos.attnrl.budget import budget_error, prompts_that_fit, worst_case_batch_tokens
from algos.attnrl.config import RLConfig
from algos.attnrl.gpt import GPT, GPTConfig
from algos.attnrl.lm import Policy, generate
from algos.attnrl.train import train
from envs.reasoning.task import ReasoningTask, ReasoningTaskConfig

TASK = ReasoningTask(ReasoningTaskConfig(max_steps=2))
MAX_TOKENS = 10


def test_worst_case_by_hand():
    cfg = RLConfig(prompts_per_batch=4, samples_per_prompt=6, branch_points=2, continuations_per_point=2)
    assert worst_case_batch_tokens("grpo", cfg, 70) == 4 * 6 * 70
    for method in ("attnrl", "entropy_tree", "random_tree"):
        assert worst_case_batch_tokens(method, cfg, 70) == 4 * 6 * 70 * (1 + 2 * 2) == 8400
    assert worst_case_batch_tokens("attnrl", cfg, 70, prompts=1) == 6 * 70 * 5


def test_prompts_that_fit_cuts_to_whole_prompts_and_never_above_the_wanted_size():
    cfg = RLConfig(prompts_per_batch=4, samples_per_prompt=6, branch_points=2, continuations_per_point=2)
    one = 6 * 70 * 5  # one tree prompt's worst case
    assert prompts_that_fit("attnrl", cfg, 70, 10 * one, wanted=4) == 4
    assert prompts_that_fit("attnrl", cfg, 70, 3 * one - 1, wanted=4) == 2
    assert prompts_that_fit("attnrl", cfg, 70, one, wanted=4) == 1
    assert prompts_that_fit("attnrl", cfg, 70, one - 1, wanted=4) == 0
    assert prompts_that_fit("attnrl", cfg, 70, -5, wanted=4) == 0  # owed continuations can exceed what is left
    assert prompts_that_fit("grpo", cfg, 70, 6 * 70 * 3, wanted=4) == 3


def _policies(seed: int = 0) -> tuple[Policy, Policy]:
    # untrained: responses run long and never solve, so every response is branched (the worst case's own path)
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=TASK.tokenizer.vocab_size, n_layer=1, n_head=2, n_embd=16, block_size=64)
    policy, ref = Policy(GPT(cfg), TASK.tokenizer), Policy(GPT(cfg), TASK.tokenizer)
    ref.model.load_state_dict(policy.model.state_dict())
    return policy, ref


def _batch_tokens(calls: list[list]) -> list[tuple[int, int]]:
    """(prompts, generated tokens) per batch from the rollouts of each generation call: a call's initial samples
    open a batch, its continuations belong to the oldest open one (GRPO: a call is a batch)."""
    batches: list[list[int]] = []
    open_batches: list[list[int]] = []
    for rollouts in calls:
        if rollouts and not isinstance(rollouts[0].tag[0], str):  # GRPO's tags are (problem, sample)
            batches.append([len({r.tag[0] for r in rollouts}), sum(r.num_generated for r in rollouts)])
            continue
        cont = sum(r.num_generated for r in rollouts if r.tag[0] == "cont")
        if cont or any(r.tag[0] == "cont" for r in rollouts):
            open_batches.pop(0)[1] += cont
        init = [r for r in rollouts if r.tag[0] == "init"]
        if init:
            batch = [len({r.tag[1] for r in init}), sum(r.num_generated for r in init)]
            batches.append(batch)
            open_batches.append(batch)
    return [tuple(b) for b in batches]


@pytest.mark.parametrize("method", ["attnrl", "entropy_tree", "grpo"])
def test_the_real_sampler_never_exceeds_the_worst_case_and_the_run_its_budget(method):
    cfg = RLConfig(prompts_per_batch=2, samples_per_prompt=3, max_prompts_per_batch=3, max_response_tokens=MAX_TOKENS,
                   token_budget=3000, seed=0)
    calls: list[list] = []

    def spy(*args, **kwargs):
        calls.append(generate(*args, **kwargs))
        return calls[-1]

    policy, ref = _policies()
    out = train(method, policy, ref, TASK, cfg, generate_fn=spy)
    batches = _batch_tokens(calls)
    assert out["updates"] >= 2 and len(batches) == out["updates"] < cfg.max_updates
    spent = sum(t for _, t in batches)
    assert spent == out["generated_tokens"] <= cfg.token_budget
    for prompts, tokens in batches:
        assert tokens <= worst_case_batch_tokens(method, cfg, MAX_TOKENS, prompts), (prompts, tokens)
    # the run stopped only because one prompt no longer fit: at that decision the budget left, less the last
    # off-policy batch's continuations at their caps (AttnRL samples them in the final call), was below one
    # prompt's worst case; what those continuations saved below their caps is the only other shortfall
    final = calls[-1] if method == "attnrl" else []
    assert all(r.tag[0] == "cont" for r in final)
    saved = sum(MAX_TOKENS - len(r.prefix_ids) - r.num_generated for r in final)
    one_prompt = worst_case_batch_tokens(method, cfg, MAX_TOKENS, prompts=1)
    assert cfg.token_budget - spent - saved < one_prompt, (spent, saved, one_prompt, batches)
    if method == "entropy_tree":  # every response branched: a batch costs more than its initial samples can
        assert max(t - p * cfg.samples_per_prompt * MAX_TOKENS for p, t in batches) > 0, batches


def test_a_budget_of_one_batch_and_one_prompt_runs_that_batch_then_batches_cut_to_one_prompt():
    one_prompt = 3 * MAX_TOKENS  # GRPO: n samples at most MAX_TOKENS long
    cfg = RLConfig(prompts_per_batch=2, samples_per_prompt=3, max_response_tokens=MAX_TOKENS, seed=0,
                   token_budget=2 * one_prompt + one_prompt)
    policy, ref = _policies()
    out = train("grpo", policy, ref, TASK, cfg)
    prompts = [h["prompts"] for h in out["history"]]
    assert prompts[0] == 2 and len(prompts) >= 2 and all(p == 1 for p in prompts[1:]), prompts
    assert 0 < out["generated_tokens"] <= cfg.token_budget < out["generated_tokens"] + one_prompt


def test_a_budget_below_one_batch_is_refused_naming_both_numbers_and_the_ways_out():
    cfg = RLConfig(prompts_per_batch=4, token_budget=2000)
    msg = budget_error("attnrl", cfg, 70, prefix="experiment.rl.")
    assert msg is not None and "\n" not in msg
    assert "token_budget=2000" in msg and "8400" in msg and "raise experiment.rl.token_budget to >= 8400" in msg
    assert "shrink experiment.rl.prompts_per_batch" in msg and "max_response_tokens" in msg
    assert budget_error("grpo", cfg, 70) is None  # GRPO's batch is 1680 tokens at most
    policy, ref = _policies()
    with pytest.raises(ValueError, match="8400"):
        train("attnrl", policy, ref, ReasoningTask(ReasoningTaskConfig(max_steps=4)), cfg)


def test_the_experiment_check_refuses_the_budget_in_one_line():
    from experiments.attnrl.config import Config, check
    from experiments.config import ConfigError
    exp = Config(methods=["attnrl", "grpo"], task={"max_steps": 4}, rl={"prompts_per_batch": 4, "token_budget": 2000})
    with pytest.raises(ConfigError, match=r"experiment\.rl\.token_budget=2000 .* 8400 generated tokens"):
        check(exp, {})
    check(Config(methods=["attnrl", "grpo"], task={"max_steps": 4}, rl={"prompts_per_batch": 4, "token_budget": 8400}),
          {})
