"""The SFT stage of an AttnRL run: pretrain the policy once (or reuse a saved model), save it as the starting
point of every method, and measure its greedy accuracy on the evaluation set."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from algos.precision import use_bf16
from experiments.attnrl.config import Config
from experiments.attnrl.weights import build_policy, gpt_weights, hf_weights

log = logging.getLogger(__name__)


def load_sft(path: str | Path) -> tuple[dict, dict]:
    """(weights dict for the pool, info) of a saved SFT model."""
    saved = torch.load(path, weights_only=True, map_location="cpu")  # saved on a GPU, read anywhere
    return saved["weights"], saved["info"]


def sft_stage(exp: Config, run_path: Path, seed: int) -> tuple[Path, dict, float, dict[int, float]]:
    """Stage 0 where ``cluster.train.stage0`` runs it (a Ray task on a learner GPU at scale=paper, else the driver):
    SFT and its greedy evaluation on this process's device. Returns (model file, SFT info, accuracy, by difficulty)."""
    from cluster.devices import assigned_device
    device = assigned_device()
    path, info = pretrain_sft(exp, run_path, seed, device)
    accuracy, by_difficulty = evaluate_sft(exp, path, device)
    return path, info, accuracy, by_difficulty


def pretrain_sft(exp: Config, run_path: Path, seed: int, device="cpu") -> tuple[Path, dict]:
    """SFT (or reuse ``<run>/sft_model.pt`` / ``experiment.sft_model``); returns the model file and SFT info. A Hugging
    Face model trains on ``device``; the small GPT (cached per config) on the CPU."""
    from algos.attnrl.sft import pretrain, pretrained_policy
    from envs.reasoning.task import ReasoningTask
    if exp.sft_model is not None:
        return Path(exp.sft_model), load_sft(exp.sft_model)[1]
    out = run_path / "sft_model.pt"
    if out.exists():
        return out, load_sft(out)[1]
    task = ReasoningTask(exp.task_config())
    t0 = time.perf_counter()
    if exp.hf_model is None:
        gpt_cfg = exp.gpt_config(task.tokenizer.vocab_size)
        policy, info = pretrained_policy(task, gpt_cfg, exp.sft_config(), init_seed=seed,
                                         cache_dir=run_path / "sft_cache")
        weights = gpt_weights(policy, gpt_cfg)
    else:
        from algos.attnrl.lm import load_hf_policy
        policy = load_hf_policy(exp.hf_model, autocast_bf16=use_bf16(exp.autocast_bf16, device))
        policy.model.to(device)
        info = pretrain(policy, task, exp.sft_config())
        weights = hf_weights(policy, exp.hf_model)
    info = {**info, "wall_s": time.perf_counter() - t0}
    tmp = out.with_suffix(".tmp")
    torch.save({"weights": weights, "info": info}, tmp)
    tmp.replace(out)
    # its accuracy is the model's on the evaluation set, measured once by evaluate_sft (SFT's own is on its training
    # loop's set, at its last evaluation: another number, which printed here read as a second SFT accuracy)
    log.info("SFT: %d steps in %.0f s", info["steps"], info["wall_s"])
    return out, info


def evaluate_sft(exp: Config, sft_path: Path, device="cpu") -> tuple[float, dict[int, float]]:
    from algos.attnrl.sft import evaluate_accuracy
    from envs.reasoning.task import ReasoningTask
    task = ReasoningTask(exp.task_config())
    policy = build_policy(load_sft(sft_path)[0], use_bf16(exp.autocast_bf16, device))
    policy.model.to(device)
    res = evaluate_accuracy(policy, task, task.evaluation_problems(exp.eval_problems_per_difficulty, exp.eval_seed))
    return res.accuracy, res.by_difficulty
