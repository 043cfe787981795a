"""What the VIDD studies share (``vidd_budget``, ``vidd_budget_molecule`` and later ones; the first two, issue 24, are
archived): the task (``TaskSpec``: the task, its oracles and denoiser sizes; ``Task``: sampling, rewards, NLL and the
set metrics of an evaluation), the tuning rule's NLL ceiling, and two kinds of unit: the resumable pretraining stage
and best-of-N from the pretrained model.

``pretrain`` (stage): the task's masked-diffusion denoiser, trained resumably (model, optimizer, schedule, step, RNG
and the loss curve checkpointed into ``artifacts/pretrain/checkpoint.pt`` before each call's deadline). Its end
product ``artifacts/pretrain/denoiser.pt`` is the start model: its sha256 is in every later record, and its record
holds the pretrained model's own evaluation (the NLL ceiling of a tuning rule is relative to it)."""
from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from benchmarks.study.core import StudyError, UnitContext


log = logging.getLogger(__name__)
NLL_CEILING_FACTOR = 1.25  # tuning rule: mean NLL <= 1.25 x the pretrained model's NLL on its own samples
MIN_VALIDITY = 0.9
MIN_UNIQUENESS = 0.5
BUNDLE = "pretrain/denoiser.pt"
CHECKPOINT = "pretrain/checkpoint.pt"
EVAL_SEED_BASE = 10_000  # evaluation draws use generators of their own, never the training one
NLL_SEED = 7


@dataclass(frozen=True)
class TaskSpec:
    """One study: its task, sizes (each overridable through ``ctx.size`` for tests), the variants it runs, the
    iteration and refresh counts its VIDD units must reach, and the measured unit costs."""

    study: str
    title: str
    task: str  # "molecule" | "dna"
    reward: str  # experiments.vidd.config.REWARD_KINDS
    reward_name: str
    sizes: dict
    variants: tuple[str, ...]
    cost_s: dict  # "pretrain", "best_of_n", and per variant name: measured core-seconds of one unit
    cuts: str = ""  # what this study leaves out to fit its budget (reported)

    def size(self, ctx: UnitContext | None, key: str):
        return self.sizes[key] if ctx is None else ctx.size(key, self.sizes[key])


def spec_of(study: str) -> TaskSpec:
    """The TaskSpec a VIDD study declares in its plan (``benchmarks/studies/<study>/plan.py``)."""
    return importlib.import_module(f"benchmarks.studies.{study}.plan").SPEC


def experiment_config(spec: TaskSpec, ctx: UnitContext | None):
    """The experiment config (task, data, denoiser, budget) at the study's sizes."""
    from experiments.vidd.config import Config
    s = lambda key: spec.size(ctx, key)  # noqa: E731
    return Config(task=spec.task, reward=spec.reward, seq_len=s("seq_len"), n_train=s("n_train"),
                  n_heldout=s("n_heldout"), d_model=s("d_model"), n_layers=s("n_layers"), n_heads=s("n_heads"),
                  bf16=False, pretrain_steps=s("pretrain_steps"), pretrain_batch_size=s("pretrain_batch_size"),
                  pretrain_lr=s("pretrain_lr"), num_sampling_steps=s("T"), query_budget=s("budget"),
                  max_iterations=1_000_000, batch_size=s("batch_size"), eval_every=0, eval_samples=s("eval_samples"),
                  nll_time_samples=4, refresh_check="off", best_of_n_outputs=1)


def nll_ceiling(spec: TaskSpec, records: dict[str, dict]) -> float:
    if "pretrain" not in records:
        raise StudyError(f"{spec.study}: no pretrain record, so no NLL ceiling for the tuning rule")
    return NLL_CEILING_FACTOR * float(records["pretrain"]["metrics"]["pretrained"]["nll"])


class Task:
    """The pretrained denoiser of the study (its committed artifact), the training oracle and the evaluation."""

    def __init__(self, spec: TaskSpec, ctx: UnitContext, bundle: dict | None = None) -> None:
        import torch

        from envs.bio.sequences import Vocab
        from experiments.vidd.data import build_model
        bundle = bundle if bundle is not None else ctx.load_artifact(BUNDLE)
        if bundle is None:
            raise StudyError(f"{spec.study}: no pretrained denoiser at {ctx.artifacts / BUNDLE}; run the pretrain "
                             "stage first")
        torch.set_num_threads(1)
        self.spec, self.bundle = spec, bundle
        self.pre = build_model(bundle)
        self.seq_len, self.T = bundle["denoiser"]["seq_len"], bundle["data"]["T"]
        self.vocab = Vocab(tuple(bundle["vocab"]["symbols"]), pad=bundle["vocab"]["pad"])
        if spec.task == "molecule":
            from envs.bio.molecules import MoleculeReward
            self.reward = MoleculeReward(vocab=self.vocab, kind=spec.reward)
            self.eval_reward, self.reference = None, None
        else:
            from envs.bio.dna import EVAL_RELEASE, TRAIN_RELEASE, MotifProxyReward, generate_dna_corpus
            kind = "sites" if spec.reward == "motif_sites" else "best"
            self.reward = MotifProxyReward(release=TRAIN_RELEASE, kind=kind)
            self.eval_reward = MotifProxyReward(release=EVAL_RELEASE, kind=kind)
            d = bundle["data"]
            # the corpus's held-out sequences (never used in pretraining), regenerated from the stage's seed
            self.reference = generate_dna_corpus(d["n_train"] + d["n_heldout"], self.seq_len,
                                                 seed=d["seed"])[d["n_train"]:]

    def strings(self, tokens) -> list[str]:
        if self.spec.task == "molecule":
            from envs.bio.molecules import tokens_to_smiles
            return [s or "" for s in tokens_to_smiles(tokens, self.vocab)]
        from envs.bio.dna import tokens_to_dna
        return tokens_to_dna(tokens)

    def sample(self, model, n: int, seed: int, stream: int = 0, ctx: UnitContext | None = None):
        """``n`` fresh samples from ``model`` with the evaluation generator of (seed, stream)."""
        import torch

        from algos.vidd.sampling import sample
        gen = torch.Generator().manual_seed(EVAL_SEED_BASE + 1000 * stream + int(seed))
        chunks, chunk = [], 512
        for start in range(0, n, chunk):
            chunks.append(sample(model, min(chunk, n - start), self.seq_len, self.T, gen).tokens)
            if ctx is not None and n > chunk:
                ctx.progress(start + len(chunks[-1]), n, "samples")
        return torch.cat(chunks)

    def score(self, tokens, rewards=None) -> dict:
        """Metrics of a sample set: training-oracle reward statistics, NLL under p_pre, validity, uniqueness,
        diversity; DNA adds the held-out evaluation oracle and the 3-mer correlation with the corpus."""
        import torch

        from algos.vidd.mdlm import nelbo
        from experiments.vidd.metrics import reward_stats, set_metrics
        if rewards is None:
            rewards, _ = self.reward(tokens)  # evaluation queries: outside the training budget
        strings = self.strings(tokens)
        nll = nelbo(self.pre, tokens, n_time_samples=4, generator=torch.Generator().manual_seed(NLL_SEED))
        out = {**reward_stats(np.asarray(rewards, dtype=np.float64)), "nll": float(nll.mean()),
               **set_metrics(self.spec.task, strings), "n_samples": int(tokens.shape[0])}
        if self.eval_reward is not None:
            from envs.bio.dna import kmer_correlation
            held = reward_stats(self.eval_reward(tokens)[0])
            out.update(eval_reward_median=held["reward_median"], eval_reward_top10=held["reward_top10"],
                       eval_reward_mean=held["reward_mean"], kmer3_corr=kmer_correlation(strings, self.reference))
        return {k: float(v) for k, v in out.items()}

    def evaluate(self, model, seed: int, n: int, stream: int = 0) -> dict:
        return self.score(self.sample(model, n, seed, stream))


def task_data(spec: TaskSpec, ctx: UnitContext):
    from experiments.vidd.data import load_task_data
    return load_task_data(experiment_config(spec, ctx), 0, ctx.work_dir)


def pretrain_stage(ctx: UnitContext) -> dict | None:
    """Pretrain the denoiser resumably; returns None (checkpointed) while steps remain and the call's time is up."""
    import torch

    from algos.vidd.mdlm import DenoiserConfig, LogLinearSchedule, MaskedDenoiser, diffusion_loss, nelbo
    spec = spec_of(ctx.study)
    torch.set_num_threads(1)
    bundle = ctx.load_artifact(BUNDLE)
    if bundle is None:
        exp = experiment_config(spec, ctx)
        data = task_data(spec, ctx)
        torch.manual_seed(0)
        dcfg = DenoiserConfig(vocab_size=data.vocab.size, seq_len=exp.seq_len, d_model=exp.d_model,
                              n_layers=exp.n_layers, n_heads=exp.n_heads, bf16=False)
        model = MaskedDenoiser(dcfg)
        optimizer = torch.optim.AdamW(model.parameters(), lr=exp.pretrain_lr, weight_decay=0.0)
        warmup = spec.size(ctx, "pretrain_warmup")
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / max(1, warmup)))
        gen = torch.Generator().manual_seed(0)
        ckpt = ctx.load_artifact(CHECKPOINT)
        if ckpt is not None:
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            schedule.load_state_dict(ckpt["schedule"])
            gen.set_state(ckpt["generator"])
            step, curve, before = ckpt["step"], ckpt["curve"], ckpt["heldout_nelbo_before"]
            log.info("pretrain: resumed at step %d", step)
        else:
            step, curve = 0, {"step": [], "nelbo_per_token": []}
            before = float(nelbo(model, data.heldout, n_time_samples=2,
                                 generator=torch.Generator().manual_seed(NLL_SEED)).mean())
        total, log_every = exp.pretrain_steps, max(1, exp.pretrain_steps // 50)
        # stop stepping this long before the deadline (evaluate, save); at most a fifth of a short call
        margin = min(spec.size(ctx, "stage_margin_s"), 0.2 * ctx.time_left())
        max_steps = spec.size(ctx, "stage_steps_per_call")  # tests: checkpoint after this many steps
        noise = LogLinearSchedule()
        model.train()
        running, n_run, t_last, first = 0.0, 0, time.monotonic(), step
        while step < total:
            if ctx.time_left() < margin or (max_steps and step - first >= max_steps):
                ctx.save_artifact(CHECKPOINT, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                               "schedule": schedule.state_dict(), "generator": gen.get_state(),
                                               "step": step, "curve": curve, "heldout_nelbo_before": before})
                log.info("pretrain: checkpointed at step %d of %d", step, total)
                return None
            idx = torch.randint(0, data.train.shape[0], (exp.pretrain_batch_size,), generator=gen)
            loss = diffusion_loss(model, data.train[idx], noise, gen).mean() / data.train.shape[1]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            running, n_run = running + loss.item(), n_run + 1
            if step % log_every == 0 or step == total:
                curve["step"].append(step)
                curve["nelbo_per_token"].append(running / n_run)
                running, n_run = 0.0, 0
                if time.monotonic() - t_last > 30:
                    ctx.progress(step, total, "steps", nelbo_per_token=curve["nelbo_per_token"][-1])
                    t_last = time.monotonic()
        model.eval()
        after = float(nelbo(model, data.heldout, n_time_samples=2,
                            generator=torch.Generator().manual_seed(NLL_SEED)).mean())
        bundle = {"task": spec.task, "denoiser": dataclasses.asdict(dcfg),
                  "vocab": {"symbols": list(data.vocab.symbols), "pad": data.vocab.pad},
                  "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
                  "data": {"n_train": exp.n_train, "n_heldout": exp.n_heldout, "seed": 0, "T": exp.num_sampling_steps,
                           "n_train_kept": int(data.train.shape[0]), "n_heldout_kept": int(data.heldout.shape[0])},
                  "metrics": {"steps": total, "heldout_nelbo_before": before, "heldout_nelbo_after": after},
                  "curve": curve}
        ctx.save_artifact(BUNDLE, bundle)
    task = Task(spec, ctx, bundle)
    pretrained = task.evaluate(task.pre, 0, spec.size(ctx, "eval_samples"))
    return {"metrics": {**bundle["metrics"], "n_params": int(sum(v.numel() for v in bundle["state_dict"].values())),
                        "pretrained": pretrained},
            "curves": bundle["curve"], "denoiser": bundle["denoiser"], "data": bundle["data"]}


def best_of_n_ladder(task: "Task", n_out: int, n_max: int, ctx: UnitContext) -> list[dict]:
    """Best-of-N for N = 1, 2, 4, .., ``n_max``, scored by ``task.score``: one draw of ``n_out x n_max`` samples from
    p_pre, each N choosing among the first N of every output's candidates (nested, so the curve is monotone in
    selection and not in sampling noise); N = 1 is p_pre itself."""
    import torch
    tokens = task.sample(task.pre, n_out * n_max, ctx.seed, stream=0, ctx=ctx).reshape(n_out, n_max, -1)
    rewards, _ = task.reward(tokens.reshape(n_out * n_max, -1))
    rewards = torch.as_tensor(np.asarray(rewards, dtype=np.float64)).reshape(n_out, n_max)
    points, n, rows = [], 1, torch.arange(n_out)
    while n <= n_max:
        best = rewards[:, :n].nan_to_num(-math.inf).argmax(dim=1)
        points.append({"N": n, **task.score(tokens[rows, best], rewards[rows, best].numpy())})
        n *= 2
    return points


def best_of_n_unit(ctx: UnitContext) -> dict:
    """Best-of-N from p_pre for N = 1, 2, 4, .., n_max on nested subsets of one draw of ``eval_samples x n_max``
    candidates (N = 1: the pretrained model's own samples). Each N costs N oracle calls per output sample."""
    spec = spec_of(ctx.study)
    task = Task(spec, ctx)
    n_out, n_max = spec.size(ctx, "eval_samples"), spec.size(ctx, "best_of_n_max")
    t0 = time.perf_counter()
    points = best_of_n_ladder(task, n_out, n_max, ctx)
    keys = ("reward_median", "reward_top10", "nll", "diversity", *(("eval_reward_median", "kmer3_corr")
                                                                    if spec.task == "dna" else ()))
    return {"metrics": {**points[-1], "queries_per_output_sample": float(points[-1]["N"]), "queries": 0,
                        "inference_queries": n_out * n_max, "wall_sample_s": time.perf_counter() - t0},
            "pretrained": points[0], "points": points,
            "curves": {"N": [p["N"] for p in points], **{k: [p[k] for p in points] for k in keys}}}
