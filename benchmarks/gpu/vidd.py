"""VIDD on the device: stage 0 (MDLM pretraining) with the model there and the generator on the CPU, as
``experiments/vidd/data.py`` runs it, then the ancestral sampler."""
from __future__ import annotations

import time

import torch

from benchmarks.gpu.rows import Row, run_row


def _chain_data(n: int, length: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """Token sequences that mostly count up by one (mod ``vocab``): a law a denoiser learns in a few steps."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (n, 1), generator=g)
    steps = 1 + (torch.rand(n, length, generator=g) < 0.1).long()
    return (start + steps.cumsum(1) - steps[:, :1]) % vocab


def vidd_stage0_and_sampler(device: str, steps: int = 200, vocab: int = 32, length: int = 32, samples: int = 256,
                            d_model: int = 64, bf16: bool | str = "auto") -> Row:
    """VIDD's stage 0 (MDLM pretraining, ``algos.vidd.mdlm.pretrain``) with the model on the device and the
    generator on the CPU, as ``experiments/vidd/data.py`` runs it, then the ancestral sampler there."""
    def check():
        from algos.vidd.mdlm import DenoiserConfig, MaskedDenoiser, PretrainConfig, pretrain
        from algos.vidd.sampling import sample
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = MaskedDenoiser(DenoiserConfig(vocab_size=vocab, seq_len=length, d_model=d_model, n_layers=2,
                                                  n_heads=4, bf16=bf16)).to(device)
        losses: list[float] = []
        pretrain(model, _chain_data(2048, length, vocab), PretrainConfig(steps=steps, batch_size=64, lr=3e-3,
                                                                         log_every=max(1, steps // 4)),
                 torch.Generator().manual_seed(0), log_fn=lambda step, m: losses.append(m["pretrain/nelbo_per_token"]))
        start = time.perf_counter()
        out = sample(model, samples, length, 32, torch.Generator().manual_seed(1)).tokens
        rate = out.shape[0] / (time.perf_counter() - start)
        on_device = all(p.device.type == torch.device(device).type for p in model.parameters())
        counting = float(((out[:, 1:] - out[:, :-1]) % vocab == 1).float().mean())
        ok = on_device and losses[-1] < losses[0] and bool((out < vocab).all())
        return ok, (f"model on {device} {on_device}; NELBO/token {losses[0]:.2f} -> {losses[-1]:.2f} in {steps} "
                    f"steps; {samples} samples ({rate:.0f}/s), {counting:.0%} of steps count up (chance "
                    f"{1 / vocab:.0%}), no mask left {bool((out < vocab).all())}")
    return run_row("vidd stage 0 + sampler", check)
