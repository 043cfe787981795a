"""Masked diffusion (algos/vidd/mdlm.py, sampling.py): schedule, sampler, exact enumeration, NELBO, pretraining."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from algos.vidd.mdlm import (
    DenoiserConfig,
    LogLinearSchedule,
    MaskedDenoiser,
    PretrainConfig,
    forward_mask,
    nelbo,
    pretrain,
)
from algos.vidd.sampling import (
    complete,
    denoise_greedy,
    denoise_one_step,
    exact_sample_distribution,
    reverse_log_prob,
    sample,
    step_times,
)

from tests.helpers import TableDenoiser  # ignores its input: the sampler's law is prod_l softmax(logits[l])

torch.set_num_threads(1)


def tiny_denoiser(vocab_size: int = 3, seq_len: int = 4, seed: int = 0, scale: float = 3.0) -> MaskedDenoiser:
    torch.manual_seed(seed)
    model = MaskedDenoiser(DenoiserConfig(vocab_size=vocab_size, seq_len=seq_len, d_model=32, n_layers=1, n_heads=2,
                                          bf16=False))  # exact numerics on every CPU
    with torch.no_grad():
        model.head.weight.mul_(scale)  # a sharper, context-dependent law than the near-uniform init
    return model.eval()


def test_log_linear_schedule_endpoints_and_weights():
    sched = LogLinearSchedule(eps=1e-3)
    t = torch.tensor([0.0, 0.25, 1.0])
    assert torch.allclose(sched.clean_probability(t), torch.tensor([1.0, 1 - 0.999 * 0.25, 1e-3]))
    assert torch.allclose(sched.loss_weight(torch.tensor([0.5])), torch.tensor([2.0]))
    # from any t down to s = 0 every masked token must be revealed
    assert torch.allclose(sched.unmask_probability(torch.tensor(0.3), torch.tensor(0.0)), torch.tensor(1.0))
    with pytest.raises(ValueError, match="eps"):
        LogLinearSchedule(eps=1.5)


def test_forward_mask_rate_matches_schedule():
    g = torch.Generator().manual_seed(0)
    x0 = torch.zeros(4000, 16, dtype=torch.long)
    t = torch.full((4000,), 0.3)
    z = forward_mask(x0, t, mask_id=7, schedule=LogLinearSchedule(), generator=g)
    rate = (z == 7).float().mean().item()
    assert abs(rate - 0.3 * 0.999) < 0.01
    assert ((z == 0) | (z == 7)).all()


def test_denoiser_config_validation():
    with pytest.raises(ValueError, match="n_heads"):
        DenoiserConfig(vocab_size=5, seq_len=8, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="vocab_size"):
        DenoiserConfig(vocab_size=1, seq_len=8)
    with pytest.raises(ValueError, match="steps"):
        PretrainConfig(steps=0)


def test_bf16_auto_is_resolved_by_the_hardware_and_legacy_bundles_load(monkeypatch):
    import algos.vidd.mdlm as mdlm
    calls = []

    def fake_use_bf16(setting, device):
        calls.append((setting, torch.device(device).type))
        return False

    monkeypatch.setattr(mdlm, "use_bf16", fake_use_bf16)
    model = MaskedDenoiser(DenoiserConfig(vocab_size=3, seq_len=4, d_model=8, n_layers=1, n_heads=2))
    assert model.cfg.bf16 == "auto"  # the default
    logits = model(torch.full((2, 4), 3))
    assert calls == [("auto", "cpu")] and logits.dtype == torch.float32
    # bundles saved before the switch carry use_bf16
    legacy = DenoiserConfig.from_dict({"vocab_size": 3, "seq_len": 4, "d_model": 8, "n_heads": 2, "use_bf16": True})
    assert legacy.bf16 is True
    with pytest.raises(ValueError, match="bf16"):
        DenoiserConfig(vocab_size=3, seq_len=4, bf16="sometimes")


def test_subs_parameterisation_keeps_unmasked_tokens():
    model = tiny_denoiser(vocab_size=5, seq_len=6)
    x = torch.tensor([[5, 1, 5, 3, 5, 0], [2, 2, 2, 5, 5, 5]])
    x0 = denoise_one_step(model, x)
    assert (x0 != model.mask_id).all()
    keep = x != model.mask_id
    assert torch.equal(x0[keep], x[keep])
    assert model(x).shape == (2, 6, 5)


def test_greedy_decoding_completes_and_conditions_on_its_choices():
    model = tiny_denoiser(vocab_size=5, seq_len=6)
    x = torch.tensor([[5, 1, 5, 3, 5, 5], [5, 5, 5, 5, 5, 5]])
    full = denoise_greedy(model, x, tokens_per_step=2)
    assert (full != model.mask_id).all()
    assert torch.equal(full[0, [1, 3]], torch.tensor([1, 3]))
    # revealing everything in one pass is exactly the one-step argmax prediction
    assert torch.equal(denoise_greedy(model, x, tokens_per_step=6), denoise_one_step(model, x))
    # an input-independent denoiser has nothing to condition on: both decoders agree
    table = TableDenoiser(torch.randn(6, 5, generator=torch.Generator().manual_seed(0)))
    assert torch.equal(denoise_greedy(table, x, 1), denoise_one_step(table, x))
    with pytest.raises(ValueError, match="tokens_per_step"):
        denoise_greedy(model, x, 0)


def test_sampler_trajectory_is_monotone_and_reproducible():
    model = tiny_denoiser(vocab_size=5, seq_len=8)
    out = sample(model, 16, 8, 6, torch.Generator().manual_seed(3), record_trajectory=True)
    states = out.states
    assert states.shape == (7, 16, 8)
    assert (states[0] == model.mask_id).all()
    assert torch.equal(states[-1], out.tokens)
    assert (out.tokens < model.vocab_size).all()
    for k in range(6):  # once revealed, a token never changes (absorbing-state reverse process)
        revealed = states[k] != model.mask_id
        assert torch.equal(states[k + 1][revealed], states[k][revealed])
    again = sample(model, 16, 8, 6, torch.Generator().manual_seed(3))
    assert torch.equal(again.tokens, out.tokens)
    assert again.states is None


def test_complete_finishes_partial_trajectories():
    model = tiny_denoiser(vocab_size=5, seq_len=8)
    traj = sample(model, 6, 8, 4, torch.Generator().manual_seed(0), record_trajectory=True).states
    # rows taken after different numbers of reverse steps, including already clean ones
    next_step = torch.tensor([0, 1, 2, 3, 4, 2])
    partial = traj[next_step, torch.arange(6)]
    done = complete(model, partial, next_step, 4, torch.Generator().manual_seed(1))
    assert (done != model.mask_id).all()
    revealed = partial != model.mask_id
    assert torch.equal(done[revealed], partial[revealed])
    assert torch.equal(done[4], traj[4, 4])


def test_exact_distribution_matches_sampler_frequencies():
    model = tiny_denoiser()
    seqs, probs = exact_sample_distribution(model, length=4, T=3)
    assert seqs.shape == (81, 4) and abs(probs.sum().item() - 1.0) < 1e-5
    tokens = sample(model, 20000, 4, 3, torch.Generator().manual_seed(0)).tokens
    codes = (tokens * torch.tensor([27, 9, 3, 1])).sum(-1)
    empirical = torch.bincount(codes, minlength=81).float() / len(codes)
    exact = torch.zeros(81)
    exact[(seqs * torch.tensor([27, 9, 3, 1])).sum(-1)] = probs
    total_variation = 0.5 * (empirical - exact).abs().sum().item()
    assert total_variation < 0.03, total_variation
    assert exact.max() < 0.5  # the check is informative only if the law is spread out


def test_reverse_log_prob_marginalises_to_exact_distribution():
    """Summing exp(sum_k log p(x_{k+1} | x_k)) over all paths must give the sampler's marginal."""
    model = tiny_denoiser(vocab_size=2, seq_len=2)
    T, sched = 2, LogLinearSchedule()
    seqs, probs = exact_sample_distribution(model, length=2, T=T)
    m = model.mask_id
    mids = torch.tensor(list(itertools.product(range(3), repeat=2)))
    start = torch.full((len(mids), 2), m)
    t0, s0 = step_times(T, 0)
    t1, s1 = step_times(T, 1)
    with torch.no_grad():
        first = reverse_log_prob(model, start, mids, t0, s0, sched)
        for x0, p in zip(seqs, probs):
            second = reverse_log_prob(model, mids, x0.expand(len(mids), 2), t1, s1, sched)
            total = torch.logsumexp(first + second, dim=0).exp().item()
            assert math.isclose(total, p.item(), rel_tol=1e-4, abs_tol=1e-6)
        # a token that changes after being revealed is impossible
        bad = reverse_log_prob(model, torch.tensor([[0, m]]), torch.tensor([[1, 0]]), t1, s1, sched)
        assert bad.item() == -math.inf


def test_nelbo_is_tight_for_a_factorised_model():
    """For an input-independent denoiser, NLL = -sum_l log q_l(x_l) and NELBO = (1 - eps) * NLL."""
    logits = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    model = TableDenoiser(logits)
    x0 = torch.randint(0, 4, (256, 5), generator=torch.Generator().manual_seed(2))
    nll = -logits.log_softmax(-1)[torch.arange(5), x0].sum(-1)
    bound = nelbo(model, x0, n_time_samples=256, generator=torch.Generator().manual_seed(3))
    # the 1/t loss weight makes single sequences noisy; the average over 256 x 256 draws is sharp
    assert (bound.mean() - (1 - 1e-3) * nll.mean()).abs() < 0.03 * nll.mean()
    assert torch.corrcoef(torch.stack([bound, nll]))[0, 1] > 0.9


def test_pretraining_lowers_heldout_nelbo():
    # order-1 Markov data: each token repeats the previous one with probability 0.9
    g = torch.Generator().manual_seed(0)
    n, L, V = 1200, 8, 4
    x = torch.empty(n, L, dtype=torch.long)
    x[:, 0] = torch.randint(0, V, (n,), generator=g)
    for i in range(1, L):
        stay = torch.rand(n, generator=g) < 0.9
        x[:, i] = torch.where(stay, x[:, i - 1], torch.randint(0, V, (n,), generator=g))
    train, heldout = x[:1000], x[1000:]
    torch.manual_seed(0)
    model = MaskedDenoiser(DenoiserConfig(vocab_size=V, seq_len=L, d_model=32, n_layers=1, n_heads=2, bf16=False))
    before = nelbo(model, heldout, n_time_samples=8, generator=torch.Generator().manual_seed(1)).mean()
    pretrain(model, train, PretrainConfig(steps=150, batch_size=64, lr=3e-3, warmup_steps=10), g)
    after = nelbo(model, heldout, n_time_samples=8, generator=torch.Generator().manual_seed(1)).mean()
    # data entropy is about log 4 + 7 * H(0.9 + 0.1/4) ~= 4.2 nats; uniform is 8 log 4 ~= 11.1
    assert after < 0.75 * before, (before, after)
    assert after < 8.0
