"""The paper's other baselines and VIDD's variants (algos/vidd/x0_losses.py, the value-denominator ablation) and the
non-finite reward guard of every oracle path (algos/vidd/oracle.py and its consumers)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from algos.vidd import ddpo
from algos.vidd.config import VIDDConfig
from algos.vidd.finetune import best_of_n, finetune
from algos.vidd.oracle import RewardCounter
from algos.vidd.sampling import denoise_one_step, sample
from algos.vidd.vidd import collect_vidd_batch, select_steps
from algos.vidd.x0_losses import X0Batch, collect_x0_batch, ddpp_loss, final_sample_loss, final_sample_weights
from tests.helpers import L, T, TableDenoiser, count_of_twos, tiny_pretrained

torch.set_num_threads(1)


def nan_for_leading_zero(tokens):
    """count_of_twos, except NaN for rows starting with token 0 and +inf for rows starting with token 1."""
    tokens = torch.as_tensor(tokens)
    rewards, info = count_of_twos(tokens)
    rewards[(tokens[:, 0] == 0).numpy()] = np.nan
    rewards[(tokens[:, 0] == 1).numpy()] = np.inf
    return rewards, info


# --------------------------------------------------------------------------------------------------
# Losses by hand
# --------------------------------------------------------------------------------------------------


def _x0_batch(m: int) -> X0Batch:
    return X0Batch(x_t=torch.tensor([[m, m, 2, 2], [m, 0, 0, 0], [m, m, m, m]]),
                   x0=torch.tensor([[2, 1, 2, 2], [0, 0, 0, 0], [1, 1, 1, 1]]),
                   t=torch.tensor([0.5, 0.25, 1.0]), trajectory=torch.tensor([0, 1, 2]),
                   r_final=torch.tensor([0.75, 0.0, 0.5]), v_current=torch.tensor([0.25, 0.5, 0.0]),
                   valid=torch.tensor([True, True, False]))


def test_final_sample_weights_follow_the_released_code():
    model = TableDenoiser(torch.randn(L, 3, generator=torch.Generator().manual_seed(0)))
    batch = _x0_batch(model.mask_id)
    # released VIDD variant: clamp(exp((r - v) / alpha)) standardised over the valid rows; invalid rows weigh 0
    cfg = VIDDConfig(alpha=0.5, distill_target="final_sample")
    w, _ = final_sample_weights(batch, cfg)
    ratio = torch.tensor([math.exp(1.0), math.exp(-1.0)])
    assert w[:2].tolist() == pytest.approx(((ratio - ratio.mean()) / ratio.std()).tolist(), rel=1e-5)
    assert w[2] == 0
    # RW_MLE: exp(standardised r / alpha), normalised to mean 1 over the valid rows
    rw = dataclasses.replace(cfg.for_method("rw_mle"))
    w, _ = final_sample_weights(batch, rw)
    z = torch.tensor([0.75, 0.0])
    z = (z - z.mean()) / z.std()
    expected = (z / 0.5).exp()
    assert w[:2].tolist() == pytest.approx((expected / expected.mean()).tolist(), rel=1e-5)
    # the loss: -mean_b w_b sum_masked log p(x0 | x_t) / L, over all rows (invalid ones contribute 0)
    log_p = model.logits.log_softmax(-1)
    ll = torch.stack([log_p[0, 2] + log_p[1, 1], log_p[0, 0]]) / L
    loss, _ = final_sample_loss(model, batch, rw)
    assert loss.item() == pytest.approx(-(w[:2] * ll).sum().item() / 3, rel=1e-5)


def test_ddpp_loss_by_hand():
    g = torch.Generator().manual_seed(1)
    student, pre = TableDenoiser(torch.randn(L, 3, generator=g)), TableDenoiser(torch.randn(L, 3, generator=g))
    batch = _x0_batch(student.mask_id)
    cfg = VIDDConfig(alpha=0.5).for_method("ddpp")
    ls, lp = student.logits.log_softmax(-1), pre.logits.log_softmax(-1)
    residual0 = (ls[0, 2] + ls[1, 1]) - (lp[0, 2] + lp[1, 1]) - (0.75 - 0.25) / 0.5
    residual1 = ls[0, 0] - lp[0, 0] - (0.0 - 0.5) / 0.5
    loss, _ = ddpp_loss(student, pre, batch, cfg)
    assert loss.item() == pytest.approx(((residual0 ** 2 + residual1 ** 2) / 2).item(), rel=1e-5)
    # at the optimum (student = p_pre tilted so that the residual vanishes) the loss is 0; here it is not
    assert loss.item() > 0


def test_x0_collection_queries_finals_once_and_values_per_state():
    model = tiny_pretrained()
    g = torch.Generator().manual_seed(0)
    states = sample(model, 6, L, T, g, record_trajectory=True).states
    steps = select_steps(6, T, 2, g)
    counter = RewardCounter(count_of_twos)
    batch, _ = collect_x0_batch(model, model.mask_id, states, steps, counter)
    assert (batch.x_t == model.mask_id).any(-1).all()  # fully unmasked states carry no loss: dropped
    assert torch.equal(batch.x0, states[T, batch.trajectory])
    assert torch.allclose(batch.r_final, torch.as_tensor(count_of_twos(batch.x0)[0], dtype=torch.float32))
    denoised = denoise_one_step(model, batch.x_t)
    assert torch.allclose(batch.v_current, torch.as_tensor(count_of_twos(denoised)[0], dtype=torch.float32))
    assert counter.n_queries == len(torch.unique(torch.cat([batch.x0, denoised]), dim=0))
    rw_counter = RewardCounter(count_of_twos)
    rw, _ = collect_x0_batch(None, model.mask_id, states, steps, rw_counter)
    assert rw_counter.n_queries == len(torch.unique(rw.x0, dim=0)) and (rw.v_current == 0).all()
    small = RewardCounter(count_of_twos, budget=3)
    trimmed, _ = collect_x0_batch(model, model.mask_id, states, steps, small, max_queries=3)
    assert small.n_queries <= 3 and 1 <= len(trimmed) < len(batch)


def test_value_denominator_ablation_never_queries_the_rollin_states():
    model = tiny_pretrained()
    g = torch.Generator().manual_seed(2)
    states = sample(model, 6, L, T, g, record_trajectory=True).states
    steps = select_steps(6, T, None)
    counter = RewardCounter(count_of_twos)
    batch, _ = collect_vidd_batch(model, model, states, steps, counter, g, next_value="completion",
                                  states_from_teacher=True, value_denominator=False)
    assert counter.n_queries == len(torch.unique(states[T], dim=0))  # one query per distinct final sample
    assert (batch.v_current == 0).all()
    # the weights then depend on the final sample alone: equal within a trajectory and a reverse step group
    cfg = VIDDConfig(alpha=0.25, num_sampling_steps=T, timesteps_per_trajectory=None, value_denominator=False)
    shifted = dataclasses.replace(batch, v_current=batch.v_current + torch.rand(len(batch)))
    from algos.vidd.vidd import vidd_loss
    assert vidd_loss(model, shifted, cfg)[0].item() == pytest.approx(vidd_loss(model, batch, cfg)[0].item())


# --------------------------------------------------------------------------------------------------
# Non-finite rewards: counted and skipped in every path
# --------------------------------------------------------------------------------------------------


def test_reward_counter_counts_nonfinite_rewards_as_nan():
    counter = RewardCounter(nan_for_leading_zero)
    rewards, info = counter(torch.tensor([[0, 2, 2, 2], [1, 2, 2, 2], [2, 2, 0, 0], [0, 2, 2, 2]]))
    assert torch.isnan(rewards[[0, 1, 3]]).all() and rewards[2].item() == pytest.approx(0.5)
    assert info["n_nonfinite"] == 2 and counter.info["n_nonfinite"] == 2 and counter.n_queries == 3
    assert ddpo.normalized_advantages(torch.tensor([float("nan"), 1.0, 3.0])).tolist() == pytest.approx(
        [0.0, -0.7071, 0.7071], abs=1e-3)
    tokens, best = best_of_n(tiny_pretrained(), RewardCounter(nan_for_leading_zero), 4, 64, L, T,
                             torch.Generator().manual_seed(0))
    assert torch.isfinite(best).all() and (tokens[:, 0] == 2).all()


METHOD_VARIANTS = [
    ("vidd", {}),
    ("vidd", {"value_scheme": "hybrid", "self_normalize_weights": True, "exact_teacher_term": True,
              "timesteps_per_trajectory": None}),
    ("vidd", {"value_scheme": "hybrid", "value_denominator": False}),
    ("vidd", {"distill_target": "final_sample", "timesteps_per_trajectory": 1, "value_model": "student",
              "value_estimator": "greedy"}),
    ("standard_ft", {}),
    ("ddpo", {"ddpo_clip": 1e-4, "ddpo_inner_steps": 1}),
    ("ddpp", {"beta": 0.5}),
    ("rw_mle", {}),
    ("ddpo", {"ddpo_clip": 1e-4, "ddpo_inner_steps": 1, "ddpo_variant": "official"}),
]


@pytest.mark.parametrize("method,overrides", METHOD_VARIANTS)
def test_every_method_skips_nonfinite_rewards_and_keeps_its_budget(method, overrides):
    cfg = dataclasses.replace(VIDDConfig(alpha=0.25, batch_size=8, max_iterations=6, num_sampling_steps=T,
                                         timesteps_per_trajectory=2, query_budget=120, lr=1e-3), **overrides)
    result = finetune(method, tiny_pretrained(), nan_for_leading_zero, cfg, seed=0)
    assert 0 < result.reward_queries <= 120 and result.reward_info["n_nonfinite"] > 0
    assert all(math.isfinite(h["loss"]) for h in result.history if "loss" in h), result.history
    assert all(torch.isfinite(p).all() for p in result.model.parameters())
    assert result.trajectories == 8 * result.iterations or result.reward_queries >= 110


@pytest.mark.parametrize("method,overrides", METHOD_VARIANTS[2:4] + METHOD_VARIANTS[6:])
def test_new_methods_raise_the_reward_on_the_tiny_space(method, overrides):
    """Reward-weighted methods shift the exact sample law toward token 2 (fraction of 2s: pretrained ~0.3)."""
    from algos.vidd.sampling import exact_sample_distribution
    pre = tiny_pretrained()
    seqs, p_pre = exact_sample_distribution(pre, L, T)
    rewards = torch.as_tensor(count_of_twos(seqs)[0], dtype=torch.float32)
    cfg = dataclasses.replace(VIDDConfig(alpha=0.1, batch_size=32, max_iterations=40, num_sampling_steps=T,
                                         timesteps_per_trajectory=2, lr=3e-3), **overrides)
    tuned = finetune(method, pre, count_of_twos, cfg, seed=0).model
    _, p_tuned = exact_sample_distribution(tuned, L, T)
    assert float((p_tuned * rewards).sum()) > float((p_pre * rewards).sum()) + 0.05


def test_the_official_ddpos_old_policy_is_the_previous_iterations():
    """previous_iterate: theta_0, theta_0, theta_1, theta_2, ... (the released code skips the swap after iteration 0)."""
    from algos.vidd.finetune import frozen_copy
    policy, holder, seen = tiny_pretrained(), None, []
    for value in (0.0, 1.0, 2.0, 3.0):  # theta_e: every weight set to e at the start of iteration e
        with torch.no_grad():
            for p in policy.parameters():
                p.fill_(value)
        holder = holder or frozen_copy(policy)  # the loop's copy of the starting policy
        old = ddpo.previous_iterate(holder, policy)
        seen.append(next(old.parameters()).flatten()[0].item())
    assert seen == [0.0, 0.0, 1.0, 2.0]


def test_official_ddpo_log_probs_and_its_clip_gate():
    """x0_mean_log_probs: the position-mean of log p(x0 | x_t) over masked positions (zero at a fully unmasked step);
    the clip gate: with advantages that all push up probabilities that already rose past 1 + clip against theta_old,
    the official step leaves the policy unchanged, while the orrery variant (ratio 1) moves it."""
    from algos.vidd.mdlm import x0_log_probs
    V = 3
    favour = lambda token: torch.full((L, V), 0.0).index_fill_(1, torch.tensor([token]), 4.0)  # noqa: E731
    policy, old = TableDenoiser(favour(2)), TableDenoiser(favour(0))
    states = sample(policy, 6, L, T, torch.Generator().manual_seed(0), record_trajectory=True).states
    every = torch.arange(T + 1).expand(6, T + 1)
    lp = ddpo.x0_mean_log_probs(policy, states, every)
    manual = x0_log_probs(policy, states[0]).gather(-1, states[-1].unsqueeze(-1)).squeeze(-1).mean(-1)
    torch.testing.assert_close(lp[:, 0], manual)  # x_T is all masks: every position counts
    assert torch.equal(lp[:, -1], torch.zeros(6))  # x_0 has no masked position left
    gain = lp - ddpo.x0_mean_log_probs(old, states, every)
    # precondition: every ratio against theta_old is above 1 + clip, or 1 at a step with nothing masked (no gradient)
    assert ((gain > 1e-2) | (lp == 0)).all() and (gain > 1e-2).any()
    cfg = VIDDConfig(num_sampling_steps=T, timesteps_per_trajectory=T, ddpo_clip=1e-4, ddpo_inner_steps=1,
                     ddpo_variant="official", lr=1e-2)
    before = policy.logits.detach().clone()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    up = torch.ones(6)
    ddpo.ddpo_update(policy, opt, states, up, cfg, torch.Generator().manual_seed(0), old_policy=old)
    assert torch.equal(before, policy.logits), "the clip let a gradient through"
    ddpo.ddpo_update(policy, opt, states, up, dataclasses.replace(cfg, ddpo_variant="orrery"),
                     torch.Generator().manual_seed(0))
    assert not torch.equal(before, policy.logits)
    with pytest.raises(ValueError, match="old_policy"):
        ddpo.ddpo_update(policy, opt, states, up, cfg, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="ddpo_variant"):
        VIDDConfig(ddpo_variant="official", ddpo_inner_steps=2)
