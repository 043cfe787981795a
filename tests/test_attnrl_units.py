"""Hand-computed checks of the AttnRL pieces: FCI, ATB, tree advantages, ADS formulas, off-policy ordering."""

import math
import random
from types import SimpleNamespace

import pytest
import torch

from algos.attnrl.adaptive import (RunningMean, adaptive_batch_size, adaptive_expansion, expansion_count,
                                   responses_to_expand)
from algos.attnrl.branching import select_branch_points, select_entropy_branch_points
from algos.attnrl.config import RLConfig
from algos.attnrl.fci import fci_scores
from algos.attnrl.gpt import GPT, GPTConfig
from algos.attnrl.grpo import grpo_advantages
from algos.attnrl.lm import Policy, aggregate_step_attention, generate, response_step_ids
from algos.attnrl.offpolicy import OffPolicyScheduler
from algos.attnrl.ppo import low_var_kl, ppo_clip_loss
from algos.attnrl.train import train
from algos.attnrl.tree import Continuation, PromptTree, training_paths, tree_advantages

# Token attention of one head over 6 tokens; steps: prompt = tokens 0-1, step 1 = token 2, step 2 = tokens 3-4,
# step 3 = token 5. Rows are causal and sum to 1.
TOKEN_ATTENTION = torch.tensor([
    [1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    [0.5, 0.5, 0.0, 0.0, 0.0, 0.0],
    [0.2, 0.2, 0.6, 0.0, 0.0, 0.0],
    [0.1, 0.1, 0.4, 0.4, 0.0, 0.0],
    [0.0, 0.2, 0.4, 0.2, 0.2, 0.0],
    [0.1, 0.1, 0.2, 0.3, 0.1, 0.2],
])
STEP_IDS = [0, 0, 1, 2, 2, 3]


def test_step_attention_is_mean_over_query_and_key_tokens():
    alpha = aggregate_step_attention([TOKEN_ATTENTION[None]], STEP_IDS)[0, 0]
    expected = {(1, 0): 0.2, (2, 0): 0.1, (2, 1): 0.4, (2, 2): 0.2, (3, 0): 0.1, (3, 1): 0.2, (3, 2): 0.2,
                (3, 3): 0.2, (0, 1): 0.0}
    for (j, k), v in expected.items():
        assert alpha[j, k].item() == pytest.approx(v), (j, k)


def test_fci_delta_cutoff_prompt_zeroing_and_max_over_layers_and_heads():
    alpha = torch.zeros(2, 2, 4, 4)
    alpha[0, 0] = aggregate_step_attention([TOKEN_ATTENTION[None]], STEP_IDS)[0, 0]  # y = [., .6, .2, 0]
    alpha[0, 1, 3, 2] = 0.7  # y_2 = .7
    alpha[1, 0, 2, 1] = alpha[1, 0, 3, 1] = 0.1  # y_1 = .2
    alpha[1, 1, 1, 0] = 0.9  # attention to the prompt is never a score
    assert fci_scores(alpha, delta=1).tolist() == pytest.approx([0.0, 0.6, 0.7, 0.0])
    assert fci_scores(alpha, delta=1, zero_first_step=True).tolist() == pytest.approx([0.0, 0.0, 0.7, 0.0])
    # delta = 2: only step 3 -> step 1 counts (0.2 from head (0, 0), 0.1 from head (1, 0)).
    assert fci_scores(alpha, delta=2).tolist() == pytest.approx([0.0, 0.2, 0.0, 0.0])
    with pytest.raises(ValueError):
        fci_scores(alpha, delta=0)


def test_response_steps_end_at_delimiters_and_eos_stays_with_its_step():
    nl, eos = 9, 1
    assert response_step_ids([5, 6, nl, 7, nl, 8, eos], frozenset({nl}), eos) == [1, 1, 1, 2, 2, 3, 3]
    assert response_step_ids([5, nl, eos], frozenset({nl}), eos) == [1, 1, 1]
    assert response_step_ids([eos], frozenset({nl}), eos) == [1]


SCORES = [0.0, 0.1, 0.9, 0.3, 0.8, 0.05, 0.7, 0.2, 0.1, 0.6, 0.4]  # prompt + 10 response steps
STARTS = [0, 5, 10, 15, 20, 25, 30, 35, 40, 45]  # 5 tokens per step


def test_branch_points_top_quantile_earliest_first():
    # 0.8-quantile of the 10 response scores = 0.7 + 0.2 * (0.8 - 0.7) = 0.72 -> steps 2 (0.9) and 4 (0.8).
    assert select_branch_points(SCORES, STARTS, num_points=2, rho=0.2) == [5, 15]
    # rho = 0.3: threshold 0.63 -> steps 2, 4, 6; N = 2 takes the two earliest.
    assert select_branch_points(SCORES, STARTS, num_points=2, rho=0.3) == [5, 15]
    assert select_branch_points(SCORES, STARTS, num_points=3, rho=0.3) == [5, 15, 25]


def test_branch_points_spacing_and_fallback_fill():
    # distance 6: step 2 (offset 5) is too close to the response start; steps 4 and 6 are 10 apart.
    assert select_branch_points(SCORES, STARTS, num_points=2, rho=0.3, min_token_distance=6) == [15, 25]
    # distance 12: only step 4 passes; the earliest remaining step (2) fills up without a distance check.
    assert select_branch_points(SCORES, STARTS, num_points=2, rho=0.3, min_token_distance=12) == [5, 15]
    # threshold 0 -> smallest positive score (step 4) is the only candidate; step 2 fills.
    sparse = [0.0, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0]
    assert select_branch_points(sparse, STARTS[:7], num_points=2, rho=0.2) == [5, 15]
    # never the first response step, and nothing for a one-step response
    assert select_branch_points([0.0, 1.0, 0.0], [0, 5], num_points=2) == [5]
    assert select_branch_points([0.0, 1.0], [0], num_points=2) == []


def test_entropy_branch_points():
    ent = [9.0, 0.1, 0.8, 0.2, 0.7, 0.6, 0.05, 5.0]  # offset 0 and the last token are never chosen
    assert select_entropy_branch_points(ent, 2) == [2, 4]
    # distance 3: offset 2 is too close to the start, 5 and 6 too close to 4
    assert select_entropy_branch_points(ent, 2, min_token_distance=3) == [4]


def _hand_tree() -> PromptTree:
    """Original (10 tokens) cut at 3 and 7; two continuations from each cut; plus two unexpanded responses."""
    tree = PromptTree([100, 101])
    original = list(range(10))
    tree.add_response(original, [-0.1 * i for i in range(10)], reward=1.0, continuations={
        3: [Continuation([20, 21], [-1.0, -1.0], 0.0), Continuation([22], [-2.0], 1.0)],
        7: [Continuation([30], [-3.0], 0.0), Continuation([31, 32], [-4.0, -4.0], 1.0)],
    })
    tree.add_response([40, 41], [-0.5, -0.5], reward=0.0)
    tree.add_response([50], [-0.5], reward=1.0)
    return tree


def test_tree_values_and_advantages_by_hand():
    tree = _hand_tree()
    # nodes: 0 root, 1 A=[0,3), 2 B=[3,7), 3 C1, 4 C2, 5 D=[7,10), 6 E1, 7 E2, 8 U1, 9 U2
    assert [n.parent for n in tree.nodes] == [None, 0, 1, 1, 1, 2, 2, 2, 0, 0]
    count, value = tree.leaf_counts_and_values()
    assert count[:3] == [7, 5, 3]
    assert value[:3] == pytest.approx([4 / 7, 3 / 5, 2 / 3])
    adv = tree_advantages(tree)
    expected = [0.0, 2 * (3 / 5 - 4 / 7) / math.sqrt(5), ((2 / 3 - 4 / 7) + (2 / 3 - 3 / 5)) / math.sqrt(3),
                -41 / 35, 29 / 35, 16 / 21, -26 / 21, 16 / 21]
    assert adv[:8] == pytest.approx(expected)


def test_training_paths_replicate_prefixes_and_drop_unexpanded():
    tree = _hand_tree()
    adv = tree_advantages(tree)
    paths = training_paths(tree)
    assert len(paths) == 5  # the two unexpanded responses only count in V(root)
    by_tokens = {tuple(p.response_ids): p for p in paths}
    e1 = by_tokens[(0, 1, 2, 3, 4, 5, 6, 30)]
    assert e1.advantages == pytest.approx([adv[1]] * 3 + [adv[2]] * 4 + [adv[6]])
    assert e1.old_logprobs == pytest.approx([-0.1 * i for i in range(7)] + [-3.0])
    assert e1.reward == 0.0 and e1.prompt_ids == [100, 101]
    assert by_tokens[(0, 1, 2, 22)].advantages == pytest.approx([adv[1]] * 3 + [adv[4]])
    assert tuple(range(10)) in by_tokens
    assert len(training_paths(tree, drop_unexpanded=False)) == 7


def test_expansion_table_ceil_and_round():
    assert [expansion_count(6, k / 6) for k in range(7)] == [6, 6, 5, 4, 4, 3, 3]
    assert [expansion_count(6, k / 6, "round") for k in range(7)] == [6, 5, 4, 4, 3, 3, 2]


def test_responses_to_expand_minority_first():
    rng = random.Random(0)
    chosen = responses_to_expand([True, False, False, True, False, False], num_trees=5, rng=rng)
    assert len(chosen) == 5 and {0, 3} <= set(chosen)  # both correct (minority) responses
    chosen = responses_to_expand([True, True, False, True, True, True], num_trees=3, rng=rng)
    assert len(chosen) == 3 and 2 in chosen


def test_attention_filter_on_solved_problems():
    solved = RunningMean()
    solved.update([0.2, 0.4])  # running mean 0.3
    rng = random.Random(0)
    assert adaptive_expansion([True] * 6, 0.5, solved, rng) == [0, 1, 2]  # ceil(6 / e) = 3 trees
    assert adaptive_expansion([True] * 6, 0.3, solved, rng) == []  # not above the mean: not gathered
    assert adaptive_expansion([True] * 6, 0.1, None, rng) == [0, 1, 2]  # filter off
    assert adaptive_expansion([False] * 6, 0.0, solved, rng) == list(range(6))


def test_adaptive_batch_size_formula():
    assert adaptive_batch_size(8, valid=120, target=240) == 9  # ceil(0.1 * 8 * 2 + 7.2) = ceil(8.8)
    assert adaptive_batch_size(8, valid=480, target=240) == 8  # ceil(0.1 * 8 * 0.5 + 7.2) = ceil(7.6)
    assert adaptive_batch_size(10, valid=240, target=240) == 10
    assert adaptive_batch_size(8, valid=0, target=240, max_size=32) == 32
    assert adaptive_batch_size(2, valid=10_000, target=240, min_size=2) == 2


def test_dual_clip_caps_a_negative_advantages_loss_at_c_times_its_size():
    """verl's dual clip (the released code's clip_ratio_c 3.0): ratio 5 on A = -1 costs 3, not 5, and sends no
    gradient; ratio 2 on A = -1 (under c) and every positive advantage are as before; None turns it off."""
    lp = torch.tensor([[math.log(5.0), math.log(2.0), math.log(5.0)]], requires_grad=True)
    old, mask = torch.zeros(1, 3), torch.ones(1, 3)
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    loss, _ = ppo_clip_loss(lp, old, adv, mask, kl_coef=0.0)
    assert loss.item() == pytest.approx((3.0 + 2.0 - 1.28) / 3)
    loss.backward()
    assert lp.grad[0, 0].item() == 0.0 and lp.grad[0, 1].item() != 0.0
    off, _ = ppo_clip_loss(lp.detach(), old, adv, mask, kl_coef=0.0, clip_ratio_c=None)
    assert off.item() == pytest.approx((5.0 + 2.0 - 1.28) / 3)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ppo_clip_loss(lp.detach(), old, adv, mask, clip_ratio_c=1.0)


def test_ppo_clip_loss_by_hand():
    lp = torch.tensor([[math.log(1.5), math.log(0.5), 0.0]], requires_grad=True)
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, m = ppo_clip_loss(lp, old, adv, mask, kl_coef=0.0)
    # token 1: ratio 1.5, A > 0 -> clipped at 1.28; token 2: ratio 0.5, A < 0 -> clipped at 0.8 -> -(-0.8)
    assert loss.item() == pytest.approx((-1.28 + 0.8) / 2)
    assert m["clip_fraction"] == pytest.approx(1.0)
    loss.backward()
    assert lp.grad.abs().sum().item() == 0.0  # both tokens clipped -> no gradient
    ref = torch.tensor([[0.0, 0.0, 0.0]])
    r = -math.log(1.5)
    assert low_var_kl(torch.tensor([math.log(1.5)]), torch.tensor([0.0])).item() == pytest.approx(
        math.exp(r) - r - 1)
    loss_kl, m_kl = ppo_clip_loss(lp.detach(), old, adv, mask, ref, kl_coef=0.5)
    kl = ((math.exp(r) - r - 1) + (2 - math.log(2) - 1)) / 2
    assert m_kl["kl_ref"] == pytest.approx(kl)
    assert loss_kl.item() == pytest.approx((-1.28 + 0.8) / 2 + 0.5 * kl)


def test_grpo_advantages():
    adv = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]))
    s = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0, 1)
    assert adv[0].tolist() == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s], rel=1e-4)
    assert adv[1].tolist() == [0.0] * 4


def test_off_policy_scheduler_ordering():
    sched = OffPolicyScheduler(off_policy=True)
    calls = []
    for m in range(4):
        calls.append(sched.next_call())
        if calls[-1].continuation_batch is not None:
            sched.record_update()
    calls.append(sched.next_call(start_new_batch=False))
    sched.record_update()
    assert sched.next_call(start_new_batch=False) is None
    assert [(c.policy_version, c.initial_batch, c.continuation_batch) for c in calls] == [
        (0, 0, None), (0, 1, 0), (1, 2, 1), (2, 3, 2), (3, None, 3)]
    # continuations of batch m are sampled after update m - 1; its originals one update earlier
    for c in calls[1:]:
        assert c.policy_version == c.continuation_batch

    sched = OffPolicyScheduler(off_policy=False)
    seen = []
    for _ in range(4):
        c = sched.next_call()
        seen.append((c.policy_version, c.initial_batch, c.continuation_batch))
        if c.continuation_batch is not None:
            sched.record_update()
    assert seen == [(0, 0, None), (0, None, 0), (1, 1, None), (1, None, 1)]


class _ParityTask:
    """Stand-in task for driver bookkeeping: reward = parity of the number of 'a' in the response."""

    def __init__(self):
        self.prompt = "a=1;?a\n"

    def sample(self, rng, n):
        return [SimpleNamespace(prompt=self.prompt, difficulty=1) for _ in range(n)]

    def reward(self, problem, text, finished=True):
        return float(text.count("a") % 2 == 0)

    def max_response_chars(self):
        return 10


def _checksum(model):
    return sum(float(p.detach().double().sum()) for p in model.parameters())


@pytest.mark.parametrize("off_policy", [True, False])
def test_driver_samples_continuations_with_the_weights_after_the_previous_update(off_policy):
    from envs.reasoning.task import CharTokenizer

    tok = CharTokenizer()
    tok.delimiter_ids = frozenset(range(2, tok.vocab_size))  # every token is a step: random text branches
    torch.manual_seed(0)
    policy = Policy(GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16, block_size=32)), tok)
    ref = Policy(GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16, block_size=32)), tok)
    ref.model.load_state_dict(policy.model.state_dict())
    calls, after_update = [], [_checksum(policy.model)]

    def recording_generate(pol, requests, *args):
        rollouts = generate(pol, requests, *args)
        calls.append({"weights": _checksum(pol.model), "kinds": {r.tag[0] for r in requests},
                      "tokens": sum(len(r.generated_ids) for r in rollouts)})
        return rollouts

    cfg = RLConfig(prompts_per_batch=2, samples_per_prompt=4, max_updates=3, lr=1e-2, off_policy=off_policy,
                   token_budget=10_000, seed=1)
    out = train("attnrl", policy, ref, _ParityTask(), cfg, generate_fn=recording_generate,
                log_fn=lambda m: after_update.append(_checksum(policy.model)))
    assert out["updates"] == 3
    assert len(set(after_update)) == 4  # every update changed the weights
    continuation_calls = [c for c in calls if "cont" in c["kinds"]]
    assert len(continuation_calls) == 3
    for m, c in enumerate(continuation_calls):
        assert c["weights"] == after_update[m]  # batch m's continuations: weights after update m - 1
    if off_policy:
        assert [c["kinds"] for c in calls] == [{"init"}, {"init", "cont"}, {"init", "cont"}, {"cont"}]
    else:
        assert [c["kinds"] for c in calls] == [{"init"}, {"cont"}] * 3
        assert all(a["weights"] == b["weights"] for a, b in zip(calls[::2], calls[1::2]))
    assert out["generated_tokens"] == sum(c["tokens"] for c in calls)


# ---- issue 17: fixes and the branching controls ----------------------------------------------------------------

def _rollout(tag, step_scores=None, step_starts=(0, 4, 8), n_tokens=12):
    from algos.attnrl.lm import Rollout
    return Rollout(prompt_ids=(5, 6), prefix_ids=(), generated_ids=list(range(2, 2 + n_tokens)),
                   logprobs=[-0.1] * n_tokens, entropies=[0.5] * n_tokens, finished=True,
                   step_starts=list(step_starts), step_scores=step_scores, tag=tag)


def _fake_run(method="attnrl", n=6, **rl):
    cfg = RLConfig(samples_per_prompt=n, **rl).resolved(method)
    return SimpleNamespace(cfg=cfg, method=method, rng=random.Random(0), max_tokens=20,
                           task=SimpleNamespace(dependency_cone=lambda p: p.cone))


def test_attention_filter_takes_effect_without_difficulty_expansion():
    """The paper's "ADS without difficulty expansion" ablation keeps the attention filter (issue 17: it silently
    ran without it). Two all-correct problems: the one whose mean FCI is not above the running mean is not
    branched; the other one has every response branched (no difficulty-aware expansion)."""
    from algos.attnrl.config import AdaptiveSamplingConfig
    from algos.attnrl.tree_rl import TreeBatch, plan_continuations

    n = 6
    run = _fake_run(n=n, ads=AdaptiveSamplingConfig(difficulty_expansion=False, attention_filter=True))
    batch = TreeBatch(problems=[SimpleNamespace(cone=[]), SimpleNamespace(cone=[])])
    low, high = [0.0, 0.1, 0.1, 0.1], [0.0, 0.9, 0.9, 0.9]
    batch.initial = [[_rollout(("init", i, j), scores) for j in range(n)] for i, scores in enumerate((low, high))]
    batch.rewards = [[1.0] * n, [1.0] * n]
    requests = plan_continuations(run, batch, RunningMean())
    branched = {tag[1:3] for tag in (r.tag for r in requests)}
    assert {i for i, _ in branched} == {1}
    assert {j for _, j in branched} == set(range(n))
    # the filter off: both problems branched
    run = _fake_run(n=n, ads=AdaptiveSamplingConfig(difficulty_expansion=False, attention_filter=False))
    assert {r.tag[1] for r in plan_continuations(run, batch, None)} == {0, 1}


def test_initial_rollouts_are_grouped_by_tag_not_by_position():
    """A pool returns rollouts in any order: each problem must get its own samples and rewards (issue 17)."""
    from algos.attnrl.tree_rl import TreeBatch, add_initial_samples

    n = 3
    problems = [SimpleNamespace(name=f"p{i}") for i in range(2)]
    rollouts = [_rollout(("init", i, j)) for i in range(2) for j in range(n)]
    random.Random(1).shuffle(rollouts)
    run = SimpleNamespace(cfg=SimpleNamespace(samples_per_prompt=n),
                          score=lambda p, r: float(r.tag[1] == int(p.name[1:])))
    batch = TreeBatch(problems=problems)
    add_initial_samples(run, batch, rollouts)
    assert [[r.tag for r in rolls] for rolls in batch.initial] == [[("init", i, j) for j in range(n)] for i in range(2)]
    assert batch.rewards == [[1.0] * n, [1.0] * n]
    with pytest.raises(ValueError):
        add_initial_samples(run, TreeBatch(problems=problems), rollouts[:-1])


def test_first_response_step_fci_is_zeroed_by_default_as_in_the_released_code():
    from algos.attnrl.tree_rl import fci_step_score_fn

    alpha = torch.zeros(1, 1, 4, 4)
    alpha[0, 0, 3, 1] = alpha[0, 0, 3, 2] = 0.5
    score = fci_step_score_fn(RLConfig().resolved("attnrl"))
    assert score(alpha).tolist() == pytest.approx([0.0, 0.0, 0.5, 0.0])
    assert fci_step_score_fn(RLConfig(zero_first_step=False).resolved("attnrl"))(alpha)[1] == pytest.approx(0.5)


def test_yaml_comments_state_the_dataclass_defaults():
    """Every ``key: null  # <value>`` (or ``# X = <value>``) in the rl section of configs/experiment/attnrl.yaml
    names the value the dataclass default really has (issue 17: the Delta comment said 2 while the default is 1)."""
    import re
    from dataclasses import fields
    from pathlib import Path

    from algos.attnrl.config import AdaptiveSamplingConfig

    text = (Path(__file__).parents[1] / "configs" / "experiment" / "attnrl.yaml").read_text()
    rl_section = text.split("\nrl:", 1)[1].split("\nhf_model:", 1)[0]
    defaults = {f.name: f.default for cls in (RLConfig, AdaptiveSamplingConfig) for f in fields(cls)}
    checked = 0
    for key, value in re.findall(r"^\s+(\w+): null\s+#\s*(?:\w+ = )?(-?[\d.]+(?:e-?\d+)?)\b", rl_section, re.M):
        assert float(defaults[key]) == pytest.approx(float(value)), key
        checked += 1
    assert checked >= 5


def test_step_level_branching_controls():
    from algos.attnrl.branching import (select_earliest_branch_points, select_oracle_branch_points,
                                        select_random_branch_points)

    starts = [0, 16, 32, 48, 64, 80]  # six response steps; the last is the answer line
    assert select_earliest_branch_points(starts, 2) == [16, 32]
    assert select_earliest_branch_points(starts[:2], 2) == [16]
    rng = random.Random(0)
    seen = set()
    for _ in range(200):
        chosen = select_random_branch_points(starts, 2, rng)
        assert len(chosen) == 2 and chosen == sorted(chosen) and set(chosen) <= {16, 32, 48, 64}
        seen |= set(chosen)
    assert seen == {16, 32, 48, 64}  # never the first step or the answer line, all others sometimes
    assert select_random_branch_points(starts[:2], 2, rng) == [16]
    cone = [True, False, False, True, True, False]  # step 1 is in the cone but never a branch point
    assert select_oracle_branch_points(cone, starts, 2) == [48, 64]
    assert select_oracle_branch_points(cone, starts, 3) == [16, 48, 64]  # fill-up by the earliest other step
    assert select_oracle_branch_points(cone[:4], starts, 2) == [16, 48]  # steps past the cone count as outside


@pytest.mark.parametrize("method,rule", [("attnrl", "fci"), ("attn_tree", "fci"), ("entropy_tree", "entropy"),
                                         ("earliest_tree", "earliest"), ("random_tree", "random"),
                                         ("oracle_tree", "oracle")])
def test_tree_methods_differ_only_in_their_branching_rule(method, rule):
    from algos.attnrl.tree_rl import branch_offsets, fci_step_score_fn

    cfg = RLConfig().resolved(method)
    assert cfg.branching == rule
    if method != "attnrl":  # the controls sample and train like TreeRL's entropy branching
        base = RLConfig().resolved("entropy_tree")
        assert (cfg.ads, cfg.off_policy) == (base.ads, base.off_policy)
    assert (fci_step_score_fn(cfg) is not None) == (rule == "fci")
    run = _fake_run(method)
    starts = [0, 4, 8, 12]
    r = _rollout(("init", 0, 0), [0.0, 0.2, 0.1, 0.9, 0.0], starts, n_tokens=16)
    r.entropies = [0.1] * 16
    r.entropies[6], r.entropies[10] = 2.0, 1.0
    offsets = branch_offsets(run, SimpleNamespace(cone=[True, False, True, True, False]), r)
    expected = {"fci": [4, 8], "entropy": [6, 10], "earliest": [4, 8], "oracle": [8, 12]}
    if rule == "random":
        assert len(offsets) == 2 and set(offsets) <= {4, 8}
    else:
        assert offsets == expected[rule]
