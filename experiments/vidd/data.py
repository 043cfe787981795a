"""The task's corpus, the pretrained denoiser (fitted here or loaded) and the pool sampler's config.

The pretrained model travels as a bundle ``{task, denoiser (DenoiserConfig fields), vocab {symbols, pad},
state_dict, metrics}``: plain values and tensors, saved as run_dir/pretrained.pt and loaded with
``torch.load(..., weights_only=True)``.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.vidd.config import Config

log = logging.getLogger(__name__)


@dataclass
class TaskData:
    train: Any  # [N, L] tokens
    heldout: Any
    vocab: Any  # envs.bio.sequences.Vocab


def load_task_data(exp: Config, seed: int, run_path: Path) -> TaskData:
    """The pretraining corpus of the task (tokens) with a held-out split for the NLL check."""
    if exp.task == "molecule":
        from envs.bio.molecules import make_molecule_dataset
        data = make_molecule_dataset(exp.n_train, exp.n_heldout, exp.seq_len)
        return TaskData(data.train_tokens, data.heldout_tokens, data.vocab)
    if exp.task == "dna":
        from envs.bio.dna import DNA_VOCAB, dna_to_tokens, generate_dna_corpus
        seqs = generate_dna_corpus(exp.n_train + exp.n_heldout, exp.seq_len, seed=seed)
        tokens = dna_to_tokens(seqs)
        return TaskData(tokens[: exp.n_train], tokens[exp.n_train :], DNA_VOCAB)
    from envs.bio.protein import PROTEIN_VOCAB, protein_tokens, read_fasta, write_synthetic_fasta
    path = exp.fasta
    if path == "demo":
        path = write_synthetic_fasta(run_path / "demo.fasta", n=exp.n_train + exp.n_heldout,
                                     min_len=max(1, exp.seq_len // 2), max_len=exp.seq_len, seed=seed)
    seqs = [s for s in read_fasta(path) if len(s) <= exp.seq_len]
    n_heldout = min(exp.n_heldout, max(1, len(seqs) // 10))
    tokens = protein_tokens(seqs, exp.seq_len)
    return TaskData(tokens[n_heldout:], tokens[:n_heldout], PROTEIN_VOCAB)


def pretrain_stage(exp: Config, seed: int, run_path: Path, out: Path) -> dict:
    """Stage 0 where ``cluster.train.stage0`` runs it (a Ray task on a learner GPU at scale=paper, else the driver):
    the task's corpus and ``pretrain_model`` on this process's device."""
    from cluster.devices import assigned_device
    return pretrain_model(exp, load_task_data(exp, seed, run_path), seed, out, assigned_device())


def pretrain_model(exp: Config, data: TaskData, seed: int, out: Path, device="cpu") -> dict:
    """Fit the denoiser to the corpus (MDLM NELBO) on ``device`` and save the bundle {denoiser, vocab, state_dict (CPU
    tensors), metrics}."""
    import torch

    from algos.vidd.mdlm import DenoiserConfig, MaskedDenoiser, PretrainConfig, nelbo, pretrain
    torch.manual_seed(seed)
    dcfg = DenoiserConfig(vocab_size=data.vocab.size, seq_len=exp.seq_len, d_model=exp.d_model,
                          n_layers=exp.n_layers, n_heads=exp.n_heads, bf16=exp.bf16)
    model = MaskedDenoiser(dcfg).to(device)  # batches follow the model; the generator stays on the CPU
    gen = torch.Generator().manual_seed(seed)
    heldout_before = float(nelbo(model, data.heldout, n_time_samples=2, generator=gen).mean())
    start = time.perf_counter()
    metrics = pretrain(model, data.train, PretrainConfig(steps=exp.pretrain_steps, batch_size=exp.pretrain_batch_size,
                                                         lr=exp.pretrain_lr, log_every=max(1, exp.pretrain_steps // 5)),
                       gen, log_fn=lambda step, m: log.info("pretrain step %d: %s", step, m))
    heldout_after = float(nelbo(model, data.heldout, n_time_samples=2, generator=gen).mean())
    bundle = {"task": exp.task, "denoiser": dataclasses.asdict(dcfg),
              "vocab": {"symbols": list(data.vocab.symbols), "pad": data.vocab.pad},
              "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
              "metrics": {**metrics, "heldout_nll_before": heldout_before, "heldout_nll_after": heldout_after,
                          "pretrain_s": time.perf_counter() - start}}
    torch.save(bundle, out)
    log.info("pretrained %s denoiser in %.0f s: held-out NELBO %.1f -> %.1f nats", exp.task,
             bundle["metrics"]["pretrain_s"], heldout_before, heldout_after)
    return bundle


def load_bundle(path: str | Path) -> dict:
    """A bundle saved by :func:`pretrain_model`."""
    import torch
    return torch.load(path, weights_only=True, map_location="cpu")  # saved on a GPU, read anywhere


def build_model(bundle: dict):
    """The bundle's denoiser, in eval mode."""
    from algos.vidd.mdlm import DenoiserConfig, MaskedDenoiser
    model = MaskedDenoiser(DenoiserConfig.from_dict(bundle["denoiser"]))
    model.load_state_dict(bundle["state_dict"])
    return model.eval()


def sampler_config(exp: Config, bundle: dict) -> dict:
    """The pool sampler's config (hashable JSON: workers cache one sampler per distinct config)."""
    reward: dict[str, Any] = {"kind": exp.reward}
    if exp.task == "molecule":
        reward["sa_weight"] = exp.sa_weight
    if exp.task == "dna":
        reward["release"] = exp.dna_release
    return {"task": exp.task, "denoiser": bundle["denoiser"], "vocab": bundle["vocab"], "reward": reward,
            "T": exp.num_sampling_steps}
