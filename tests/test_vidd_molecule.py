"""Smoke-scale learning check on molecules: pretrain a tiny MDLM on MOSES SELFIES, then VIDD on QED.

One pretrained model is shared by the module. Seeds are fixed; thresholds leave room for the noise of the
evaluation sample (256 molecules; the standard error of a median QED is about 0.012) and, for VIDD, of the
finetuning seed (calibrated over seeds: see the test).

VIDD runs with ``next_value="completion"``: the numerator of the soft-optimal weight comes from one
completion of xbar under p_out (the released protein code's estimator). With Alg. 1's one-step values
r(x0hat) this tiny denoiser's early-step completions are runs of [C], the value differences are mostly
artefacts, and 40 iterations raise the median QED by only 0.02-0.05 while the NLL under p_pre grows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from algos.vidd.config import VIDDConfig
from algos.vidd.finetune import finetune
from algos.vidd.mdlm import DenoiserConfig, MaskedDenoiser, PretrainConfig, nelbo, pretrain
from algos.vidd.sampling import sample
from envs.bio.molecules import MoleculeReward, make_molecule_dataset, molecule_metrics, tokens_to_smiles

torch.set_num_threads(1)
pytestmark = pytest.mark.slow  # pretrains a denoiser, then learns

MAX_LEN = 40
T = 8  # sampling steps: 5 SELFIES tokens revealed per step on average
N_EVAL = 256
FINETUNE_SEEDS = (0, 1, 2)
QED_MARGIN = 0.01  # on the mean gain over FINETUNE_SEEDS: calibrated in the test's docstring


@pytest.fixture(scope="module")
def pretrained():
    torch.manual_seed(0)
    data = make_molecule_dataset(n_train=3000, n_heldout=200, max_len=MAX_LEN)
    model = MaskedDenoiser(
        DenoiserConfig(vocab_size=data.vocab.size, seq_len=MAX_LEN, d_model=64, n_layers=2, n_heads=4, ff_mult=2,
                       bf16=False)
    )
    heldout_before = nelbo(model, data.heldout_tokens, n_time_samples=4, generator=torch.Generator().manual_seed(1))
    pretrain(model, data.train_tokens, PretrainConfig(steps=300, batch_size=64, lr=2e-3, warmup_steps=20),
             torch.Generator().manual_seed(0))
    heldout_after = nelbo(model, data.heldout_tokens, n_time_samples=4, generator=torch.Generator().manual_seed(1))
    return data, model, heldout_before.mean().item(), heldout_after.mean().item()


def evaluate(model, data, reference) -> dict:
    tokens = sample(model, N_EVAL, MAX_LEN, T, torch.Generator().manual_seed(123)).tokens
    metrics = molecule_metrics(tokens_to_smiles(tokens, data.vocab))
    metrics["nll_pretrained"] = nelbo(reference, tokens, n_time_samples=4,
                                      generator=torch.Generator().manual_seed(5)).mean().item()
    return metrics


def test_pretraining_lowers_heldout_nll(pretrained):
    _, _, before, after = pretrained
    assert after < 0.6 * before, (before, after)


def test_vidd_raises_median_qed_over_pretrained(pretrained):
    """VIDD raises the median QED of the pretrained model's samples, on average over FINETUNE_SEEDS.

    One run's gain varies with its seed far more than the evaluation's noise, and the pretrained model differs with
    the CPU's float path as with its seed. Calibration (gain of single runs, finetuning seeds 0-3; AVX512 EPYC):
    pretraining seed 0: +0.061 +0.008 +0.053 +0.030; pretraining seed 1: +0.029 +0.034 -0.008. The old check (seed 0
    alone, > +0.03) failed on 3 of these 7 draws. Means over seeds 0-2: +0.041 and +0.018; the evaluation noise of such
    a mean is about 0.007 (medians of 256 molecules), so QED_MARGIN = 0.01 is above it. The margin on pretraining seed
    1 is thin (+0.008): at 30 iterations VIDD's gain is not reliable per run; a longer run needs its own calibration."""
    data, model, _, _ = pretrained
    cfg = VIDDConfig(
        alpha=0.1, beta=1.0, refresh_interval=5, timesteps_per_trajectory=4, batch_size=32,
        max_iterations=30, num_sampling_steps=T, lr=1e-3, value_scheme="hybrid",
    )
    before = evaluate(model, data, model)
    gains = []
    for seed in FINETUNE_SEEDS:
        result = finetune("vidd", model, MoleculeReward(data.vocab, "qed"), cfg, seed=seed)
        after = evaluate(result.model, data, model)
        assert result.reward_queries > 0 and result.iterations == cfg.max_iterations
        assert after["validity"] > 0.95 and after["uniqueness"] > 0.8, (seed, after)  # no collapse
        assert np.isfinite(after["nll_pretrained"])
        gains.append(after["qed_median"] - before["qed_median"])
    assert np.mean(gains) > QED_MARGIN, (before["qed_median"], gains)
