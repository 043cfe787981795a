"""Pool sampler for masked-diffusion models: ancestral samples, roll-in trajectories and VIDD roll-out batches,
scored by the task's reward oracle inside the worker.

config (one sampler per task/model shape, cached by the pool worker):
    task         "molecule" | "dna" | "protein"
    denoiser     algos.vidd.mdlm.DenoiserConfig fields (vocab_size, seq_len, d_model, ...)
    vocab        {"symbols": [...], "pad": ...} of the task's tokens (molecules: the SELFIES vocabulary)
    reward       {"kind": ..., ...}: molecule kind qed|sa|composite (+ sa_weight); dna kind motif|motif_sites
                 (+ release);
                 protein kind beta_sheet; any task: kind custom + factory "module:callable" (a user oracle)
    T            reverse steps of the ancestral sampler
weights (published by version): a bundle ``{role: state_dict}`` with roles "pretrained" (p_pre), "teacher" (p_out)
    and "student" (p_theta).
request:
    kind "sample": n, seed, model (a role), record_trajectory (bool), score (bool), max_queries (optional)
        -> tokens [n, L], sequences (decoded strings), rewards [n] (if score), states [T+1, n, L] (if recorded)
    kind "vidd":   n, seed, model (roll-in role), steps_per_trajectory (k or None = all T), max_queries,
                   value_model (role, default "teacher"), value_estimator, greedy_tokens_per_step, next_value,
                   states_from_teacher, keep_teacher_log_probs, value_denominator
                   (algos.vidd.vidd.collect_vidd_batch's options)
        -> the Alg. 1 roll-out transitions of algos.vidd.vidd.collect_vidd_batch as arrays (x_t, x_next, t, s,
           v_current, v_next, changed, teacher_log_probs if kept); x̄ is drawn from the "teacher" role (p_out), values
           v(x) = r(x̂0(x)) from value_model
    kind "x0":     n, seed, model (roll-in role), steps_per_trajectory, max_queries, value_model (role or None: no
                   value queries), value_estimator, greedy_tokens_per_step
        -> the final-sample batch of algos.vidd.x0_losses.collect_x0_batch (x_t, x0, t, trajectory, r_final,
           v_current, valid) for DDPP, RW_MLE and the released VIDD variant
Every result carries ``queries`` (distinct sequences sent to the oracle, exact), ``reward_info`` (invalid / empty /
error / non-finite counts summed over calls), ``weights_version`` and ``num_samples``. An oracle that raises is retried
row by row; rows that still raise get the floor reward and are counted in ``n_errors``, so a bad molecule never kills a
run. Non-finite rewards come back as NaN, counted in ``n_nonfinite`` (the consumers skip them).

Device: the sampler's denoisers live on the device of its pool worker (``cluster.devices.assigned_device``: the GPU
the "gpu" worker group reserved, when CUDA can use it, else the CPU); results travel as CPU arrays.
"""
from __future__ import annotations

import importlib
import logging
from typing import Any, Callable

import numpy as np
import torch

from algos.vidd.mdlm import DenoiserConfig, LogLinearSchedule, MaskedDenoiser
from algos.vidd.oracle import RewardCounter
from algos.vidd.sampling import sample as mdlm_sample
from algos.vidd.vidd import collect_vidd_batch, select_steps
from algos.vidd.x0_losses import collect_x0_batch
from cluster.devices import assigned_device
from envs.bio.sequences import Vocab

log = logging.getLogger(__name__)

TASKS = ("molecule", "dna", "protein")
ROLES = ("pretrained", "teacher", "student")


# ------------------------------------------------------------------------------------------ task plumbing

def task_vocab(task: str, vocab: dict | None) -> Vocab:
    """The task's token vocabulary (molecules carry theirs in the config; DNA and protein are fixed)."""
    if task == "dna":
        from envs.bio.dna import DNA_VOCAB
        return DNA_VOCAB
    if task == "protein":
        from envs.bio.protein import PROTEIN_VOCAB
        return PROTEIN_VOCAB
    if task == "molecule":
        if not vocab:
            raise ValueError("diffusion sampler: task 'molecule' needs config['vocab'] = {symbols, pad}")
        return Vocab(tuple(vocab["symbols"]), pad=vocab.get("pad"))
    raise ValueError(f"diffusion sampler: unknown task {task!r} (choose from {', '.join(TASKS)})")


def make_reward(task: str, spec: dict, vocab: Vocab) -> tuple[Callable, float]:
    """``(oracle, floor)``: the task's batched reward oracle ``tokens [B, L] -> (rewards, info)``."""
    spec = dict(spec or {})
    kind = spec.pop("kind", None)
    if kind == "custom":
        module, _, attr = str(spec.pop("factory", "")).partition(":")
        if not attr:
            raise ValueError("reward kind 'custom' needs factory='package.module:callable'")
        floor = float(spec.pop("floor", 0.0))
        return getattr(importlib.import_module(module), attr)(vocab=vocab, **spec), floor
    if task == "molecule":
        from envs.bio.molecules import MoleculeReward
        oracle = MoleculeReward(vocab=vocab, kind=kind or "qed", sa_weight=float(spec.get("sa_weight", 0.5)))
        return oracle, float(oracle.floor)
    if task == "dna":
        from envs.bio.dna import TRAIN_RELEASE, MotifProxyReward
        oracle = MotifProxyReward(release=spec.get("release") or TRAIN_RELEASE,
                                  kind="sites" if kind == "motif_sites" else "best")
        return oracle, oracle.floor
    if task == "protein":
        from envs.bio.protein import BetaSheetProxyReward
        oracle = BetaSheetProxyReward()
        return oracle, oracle.floor
    raise ValueError(f"diffusion sampler: unknown task {task!r}")


def decode(task: str, tokens: torch.Tensor, vocab: Vocab) -> list[str]:
    """Generated rows as strings (SMILES, DNA, amino acids); "" where a molecule fails to decode."""
    if task == "molecule":
        from envs.bio.molecules import tokens_to_smiles
        return [s or "" for s in tokens_to_smiles(tokens, vocab)]
    return ["".join(vocab.decode(row)) for row in tokens.tolist()]


class SafeOracle:
    """Never raises: a failing batch is re-scored row by row; rows that still fail get ``floor`` (``n_errors``)."""

    def __init__(self, oracle: Callable, floor: float) -> None:
        self.oracle, self.floor = oracle, floor

    def __call__(self, tokens: torch.Tensor) -> tuple[np.ndarray, dict]:
        try:
            rewards, info = self.oracle(tokens)
            return self._checked(rewards, len(tokens)), dict(info)
        except Exception as err:  # noqa: BLE001 - one bad row must not cost the batch
            log.debug("oracle failed on a batch of %d (%r): scoring row by row", len(tokens), err)
        rewards = np.full(len(tokens), self.floor, dtype=np.float64)
        info: dict[str, float] = {"n_errors": 0}
        for i in range(len(tokens)):
            try:
                value, row_info = self.oracle(tokens[i : i + 1])
                rewards[i] = self._checked(value, 1)[0]
                for k, v in row_info.items():
                    if isinstance(v, (int, float)) and k != "n_queries":
                        info[k] = info.get(k, 0) + v
            except Exception:  # noqa: BLE001
                info["n_errors"] += 1
        return rewards, info

    def _checked(self, rewards: Any, n: int) -> np.ndarray:
        out = np.asarray(rewards, dtype=np.float64).reshape(-1)
        if len(out) != n:
            raise ValueError(f"oracle returned {len(out)} rewards for {n} sequences")
        return out  # non-finite values pass to the RewardCounter, which counts them and returns NaN (skipped)


# ------------------------------------------------------------------------------------------ the sampler

class DiffusionSampler:
    KEYS = {"task", "denoiser", "vocab", "reward", "T"}

    def __init__(self, config: dict) -> None:
        unknown = sorted(set(config) - self.KEYS)
        if unknown or "task" not in config or "denoiser" not in config:
            raise ValueError(f"diffusion sampler config: unknown keys {unknown} or missing task/denoiser "
                             f"(valid: {sorted(self.KEYS)})")
        self.task = config["task"]
        self.vocab = task_vocab(self.task, config.get("vocab"))
        self.denoiser_cfg = DenoiserConfig.from_dict(config["denoiser"])
        self.T = int(config.get("T", 32))
        oracle, floor = make_reward(self.task, config.get("reward") or {}, self.vocab)
        self.oracle = SafeOracle(oracle, floor)
        self.models: dict[str, MaskedDenoiser] = {}
        self.version = 0
        self.schedule = LogLinearSchedule()
        self.device = assigned_device()  # the worker's GPU when its group reserved one and CUDA works

    def load_weights(self, weights: dict, version: int) -> None:
        unknown = sorted(set(weights) - set(ROLES))
        if unknown:
            raise ValueError(f"weights bundle has unknown roles {unknown} (valid: {ROLES})")
        for role, state in weights.items():
            if role not in self.models:
                self.models[role] = MaskedDenoiser(self.denoiser_cfg).to(self.device).eval()
            self.models[role].load_state_dict(state)
        self.version = version

    def _model(self, role: str) -> MaskedDenoiser:
        if role not in self.models:
            raise RuntimeError(f"no {role!r} weights loaded (have {sorted(self.models)}): publish them first")
        return self.models[role]

    def sample(self, request: dict) -> dict:
        kind = request.get("kind", "sample")
        if kind == "sample":
            return self._sample(request)
        if kind == "vidd":
            return self._vidd(request)
        if kind == "x0":
            return self._x0(request)
        raise ValueError(f"diffusion sampler: unknown request kind {kind!r} (sample | vidd | x0)")

    def _counter(self, request: dict) -> RewardCounter:
        budget = request.get("max_queries")
        return RewardCounter(self.oracle, None if budget is None else int(budget))

    def _sample(self, request: dict) -> dict:
        n = int(request["n"])
        generator = torch.Generator().manual_seed(int(request.get("seed", 0)))
        record = bool(request.get("record_trajectory", False))
        result = mdlm_sample(self._model(request.get("model", "pretrained")), n, self.denoiser_cfg.seq_len, self.T,
                             generator, record_trajectory=record, schedule=self.schedule)
        out: dict[str, Any] = {"tokens": result.tokens.numpy().astype(np.int16),
                               "sequences": decode(self.task, result.tokens, self.vocab),
                               "weights_version": self.version, "num_samples": n}
        if record:
            out["states"] = result.states.numpy().astype(np.int16)
        counter = self._counter(request)
        if request.get("score", True):
            n_score = min(n, int(counter.remaining)) if counter.budget is not None else n
            rewards = np.full(n, np.nan)
            if n_score > 0:
                scored, _ = counter(result.tokens[:n_score])
                rewards[:n_score] = scored.numpy()
            out["rewards"] = rewards
        out.update(queries=counter.n_queries, reward_info=dict(counter.info))
        return out

    def _rollin(self, request: dict, n: int):
        """The request's generator, ``n`` roll-in trajectories of its model, the steps to distill and its counter."""
        generator = torch.Generator().manual_seed(int(request.get("seed", 0)))
        rollin = mdlm_sample(self._model(request.get("model", "teacher")), n, self.denoiser_cfg.seq_len, self.T,
                             generator, record_trajectory=True, schedule=self.schedule)
        k = request.get("steps_per_trajectory")
        steps = select_steps(n, self.T, None if k is None else int(k), generator)
        return generator, rollin, steps, self._counter(request)

    def _vidd(self, request: dict) -> dict:
        n = int(request["n"])
        generator, rollin, steps, counter = self._rollin(request, n)
        batch, _ = collect_vidd_batch(
            self._model("teacher"), self._model(request.get("value_model", "teacher")), rollin.states, steps,
            counter, generator, self.schedule, max_queries=counter.remaining,
            value_estimator=request.get("value_estimator", "one_step"),
            greedy_tokens_per_step=int(request.get("greedy_tokens_per_step", 4)),
            next_value=request.get("next_value", "denoised"),
            states_from_teacher=bool(request.get("states_from_teacher", False)),
            keep_teacher_log_probs=bool(request.get("keep_teacher_log_probs", False)),
            value_denominator=bool(request.get("value_denominator", True)))
        extra = {} if batch.teacher_log_probs is None else {"teacher_log_probs": batch.teacher_log_probs.numpy()}
        return {**extra, "x_t": batch.x_t.numpy().astype(np.int16), "x_next": batch.x_next.numpy().astype(np.int16),
                "t": batch.t.numpy(), "s": batch.s.numpy(), "v_current": batch.v_current.numpy(),
                "v_next": batch.v_next.numpy(), "changed": batch.changed.numpy(),
                "final_tokens": rollin.tokens.numpy().astype(np.int16),
                "queries": counter.n_queries, "reward_info": dict(counter.info),
                "weights_version": self.version, "num_samples": n}

    def _x0(self, request: dict) -> dict:
        n = int(request["n"])
        generator, rollin, steps, counter = self._rollin(request, n)
        role = request.get("value_model")
        batch, _ = collect_x0_batch(
            None if role is None else self._model(role), self.denoiser_cfg.vocab_size, rollin.states, steps, counter,
            max_queries=counter.remaining, value_estimator=request.get("value_estimator", "one_step"),
            greedy_tokens_per_step=int(request.get("greedy_tokens_per_step", 4)), generator=generator)
        return {"x_t": batch.x_t.numpy().astype(np.int16), "x0": batch.x0.numpy().astype(np.int16),
                "t": batch.t.numpy(), "trajectory": batch.trajectory.numpy(), "r_final": batch.r_final.numpy(),
                "v_current": batch.v_current.numpy(), "valid": batch.valid.numpy(),
                "final_tokens": rollin.tokens.numpy().astype(np.int16), "queries": counter.n_queries,
                "reward_info": dict(counter.info), "weights_version": self.version, "num_samples": n}
