"""What the two VIDD studies (``vidd_molecule``, ``vidd_dna``; issue 24) share: the labelled variants and the one
grid they are all tuned over, the plan of units, the three kinds of unit (the resumable pretraining stage, one
fine-tuning run, best-of-N) and the report.

The plan of a study (every unit <= 20 min of one core; measured costs in each study's ``COST_S``):

1. ``pretrain`` (stage): the task's masked-diffusion denoiser, trained resumably (model, optimizer, schedule, step,
   RNG and the loss curve checkpointed into ``artifacts/pretrain/checkpoint.pt`` before each call's deadline). Its
   end product ``artifacts/pretrain/denoiser.pt`` is the start model: its sha256 is in every later record, and its
   record holds the pretrained model's own evaluation (the NLL ceiling of the tuning rule is relative to it).
2. ``tune-<variant>-lr<lr>-s100``: every fine-tuning variant at each value of the same learning-rate grid
   (:data:`GRID`) on tuning seed 100, at the full budget, final evaluation only.
3. ``best_of_n-s<seed>`` and ``<variant>-s<seed>`` on the reported seeds 10-14: best-of-N from the pretrained model
   (N = 1 .. 32 on nested subsets of one draw; N = 1 is the pretrained model itself) and every variant with the
   learning rate its own tuning units chose by the rule below. A report unit without its tuning records refuses with
   one line: there is no default setting to fall back to.

Tuning rule, fixed before any unit ran: per variant, the grid value with the highest mean median training reward over
the tuning seeds among the values whose mean NLL under the pretrained model is at most ``NLL_CEILING_FACTOR`` x the
pretrained model's own NLL (its samples, the ``pretrain`` record) and whose samples are >= 90 % valid and >= 50 %
unique; if no value qualifies, the value with the lowest NLL.

The primary comparison is :data:`PRIMARY` (the hybrid) against each baseline, seed-paired; it was named here before any
reported unit ran. Every fine-tuning method stops at the same number of distinct oracle queries (``RewardCounter``),
and each unit records its iterations and teacher refreshes and refuses to report a VIDD run that got fewer than the
study's minimum (VIDD with too few refreshes is standard fine-tuning).
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks.study.core import REPORTED_SEEDS, Study, StudyError, Unit, UnitContext

log = logging.getLogger(__name__)

PRIMARY = "vidd_hybrid"
GRID_KEY = "lr"
GRID = (3e-4, 1e-3, 3e-3)  # the same three values for every fine-tuning method (DDPO included: its lr is this lr)
TUNE_SEEDS = (100,)
NLL_CEILING_FACTOR = 1.25  # tuning rule: mean NLL <= 1.25 x the pretrained model's NLL on its own samples
MIN_VALIDITY = 0.9
MIN_UNIQUENESS = 0.5
BUNDLE = "pretrain/denoiser.pt"
CHECKPOINT = "pretrain/checkpoint.pt"
EVAL_SEED_BASE = 10_000  # evaluation draws use generators of their own, never the training one
NLL_SEED = 7

# every setting a variant may change, at this value unless the variant says otherwise (the experiment config's own
# defaults never leak into a variant)
COMMON = dict(alpha=0.1, beta=1.0, refresh_interval=5, next_value="denoised", value_model="teacher",
              value_estimator="one_step", self_normalize_weights=False, exact_teacher_term=False, updates_per_batch=1,
              value_denominator=True, distill_target="next_state", standardize_weights=True, max_log_weight=None,
              ddpo_clip=0.2, ddpo_inner_steps=2, ddpo_lr=None)
# Algorithm 1 as written: one-step values r(x0hat) of p_out for x_t and xbar_{t-1}, batch-normalised raw weights,
# one gradient step per batch
ALG1 = dict(next_value="denoised", value_model="teacher", value_estimator="one_step", self_normalize_weights=False,
            exact_teacher_term=False, updates_per_batch=1)
# the hybrid of the earlier benchmark (RESULTS.md): numerator r of the roll-in's own final sample, per-step normalised
# weights, the exact-teacher control variate, 4 gradient steps per batch
HYBRID = dict(next_value="completion", value_model="teacher", value_estimator="one_step", self_normalize_weights=True,
              exact_teacher_term=True, updates_per_batch=4)


@dataclass(frozen=True)
class Variant:
    """A labelled method: the algos method and the overrides that define it. ``family``: ``vidd`` (iterative: its
    iterations and teacher refreshes are asserted), ``control`` (VIDD's loss, teacher never refreshed) or
    ``baseline``. ``steps``: which of the task's distilled-steps-per-trajectory settings it uses."""

    name: str
    label: str
    method: str
    overrides: dict = field(default_factory=dict)
    family: str = "baseline"
    steps: str = "vidd"  # "vidd" (the task's vidd_steps), "ddpo" (ddpo_steps) or "one" (1 random step)


VARIANTS: dict[str, Variant] = {v.name: v for v in [
    Variant("vidd_hybrid", "VIDD hybrid (primary)", "vidd", HYBRID, "vidd"),
    Variant("vidd_alg1", "VIDD, Algorithm 1 as written", "vidd", ALG1, "vidd"),
    Variant("vidd_hybrid_nodenom", "ablation: hybrid without v(x_t)", "vidd", {**HYBRID, "value_denominator": False},
            "vidd"),
    Variant("standard_ft_hybrid", "standard FT, hybrid settings (matched control)", "standard_ft", HYBRID, "control"),
    Variant("standard_ft", "standard FT, Alg. 1 settings", "standard_ft", ALG1, "control"),
    Variant("ddpo", "DDPO (released clip 1e-4, 1 step/batch)", "ddpo", dict(ddpo_clip=1e-4, ddpo_inner_steps=1),
            steps="ddpo"),
    Variant("ddpp", "DDPP", "ddpp", dict(beta=0.5), steps="one"),
    Variant("rw_mle", "RW-MLE (reward-weighted MLE)", "rw_mle", dict(alpha=1.0, standardize_weights=True),
            steps="one"),
]}
BASELINE_ORDER = ("standard_ft_hybrid", "standard_ft", "ddpo", "ddpp", "rw_mle", "best_of_n", "vidd_alg1",
                  "vidd_hybrid_nodenom")


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
    return importlib.import_module(f"benchmarks.study.{study}").SPEC


# ------------------------------------------------------------------------------------------------ configs

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


def variant_config(spec: TaskSpec, ctx: UnitContext | None, variant: Variant, lr: float):
    """The full config of ``variant`` at learning rate ``lr`` (the grid's value)."""
    steps = {"vidd": spec.size(ctx, "vidd_steps"), "ddpo": spec.size(ctx, "ddpo_steps"), "one": 1}[variant.steps]
    return dataclasses.replace(experiment_config(spec, ctx), **{**COMMON, **variant.overrides, GRID_KEY: lr,
                                                                "timesteps_per_trajectory": steps})


def planned_counts(spec: TaskSpec, variant: Variant, ctx: UnitContext | None = None) -> tuple[int, int]:
    """(iterations, teacher refreshes) the budget buys ``variant`` at least: queries per trajectory are bounded above
    (duplicates are free), so these are lower bounds."""
    cfg = variant_config(spec, ctx, variant, GRID[0])
    return cfg.expected_refreshes(variant.method)


# ------------------------------------------------------------------------------------------------ the plan

def lr_name(lr: float) -> str:
    return f"{lr:g}"


def tune_unit_name(variant: str, lr: float, seed: int) -> str:
    return f"tune-{variant}-lr{lr_name(lr)}-s{seed}"


def build_units(spec: TaskSpec) -> list[Unit]:
    """The whole plan, in run order; refuses a plan whose budget cannot buy a VIDD variant its iterations and teacher
    refreshes (the arithmetic, done before anything runs)."""
    for name in spec.variants:
        if name not in VARIANTS:
            raise StudyError(f"{spec.study}: unknown variant {name!r} (known: {', '.join(VARIANTS)})")
    if PRIMARY not in spec.variants:
        raise StudyError(f"{spec.study}: the primary {PRIMARY} is not among the variants")
    for name in spec.variants:
        v = VARIANTS[name]
        if v.family != "vidd":
            continue
        iterations, refreshes = planned_counts(spec, v)
        if iterations < spec.sizes["min_iterations"] or refreshes < spec.sizes["min_refreshes"]:
            raise StudyError(f"{spec.study}: {name} gets >= {iterations} iterations and {refreshes} teacher refreshes "
                             f"from {spec.sizes['budget']} queries, fewer than the study's minimum "
                             f"{spec.sizes['min_iterations']} / {spec.sizes['min_refreshes']}")
    mod = f"benchmarks.study.vidd_common:"
    plan = [Unit("pretrain", "stage", "pretrain", None, mod + "pretrain_stage", est_core_s=spec.cost_s["pretrain"])]
    tune_names: dict[str, list[str]] = {}
    for name in spec.variants:
        for seed in TUNE_SEEDS:
            for lr in GRID:
                unit = Unit(tune_unit_name(name, lr, seed), "tune", name, seed, mod + "finetune_unit",
                            setting={"variant": name, GRID_KEY: lr}, after=("pretrain",),
                            est_core_s=spec.cost_s[name])
                plan.append(unit)
                tune_names.setdefault(name, []).append(unit.name)
    for seed in REPORTED_SEEDS:
        plan.append(Unit(f"best_of_n-s{seed}", "report", "best_of_n", seed, mod + "best_of_n_unit",
                         setting={"n_max": spec.sizes["best_of_n_max"]}, after=("pretrain",),
                         est_core_s=spec.cost_s["best_of_n"]))
        for name in spec.variants:
            plan.append(Unit(f"{name}-s{seed}", "report", name, seed, mod + "finetune_unit",
                             setting={"variant": name}, after=("pretrain", *tune_names[name]),
                             est_core_s=spec.cost_s[name]))
    return plan


def make_study(spec: TaskSpec) -> Study:
    return Study(name=spec.study, title=spec.title, units=lambda: build_units(spec),
                 start_files=lambda artifacts: [Path(artifacts) / BUNDLE],
                 report=f"benchmarks.study.{spec.study}:report")


# ------------------------------------------------------------------------------------------------ tuning rule

def tuning_rows(spec: TaskSpec, variant: str, records: dict[str, dict]) -> dict[float, dict]:
    """Per grid value, the mean over tuning seeds of the final metrics the rule reads; refuses (one line) when a
    tuning record is missing."""
    names = {lr: [tune_unit_name(variant, lr, s) for s in TUNE_SEEDS] for lr in GRID}
    missing = [n for group in names.values() for n in group if n not in records]
    if missing:
        raise StudyError(f"{spec.study}: {variant} has no tuning record {missing[0]}"
                         f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; run its tuning units "
                         f"first (a reported unit never falls back to a default setting)")
    rows = {}
    for lr, group in names.items():
        finals = [records[n]["metrics"] for n in group]
        rows[lr] = {k: float(np.mean([f[k] for f in finals])) for k in ("reward_median", "nll", "validity",
                                                                        "uniqueness")}
    return rows


def nll_ceiling(spec: TaskSpec, records: dict[str, dict]) -> float:
    if "pretrain" not in records:
        raise StudyError(f"{spec.study}: no pretrain record, so no NLL ceiling for the tuning rule")
    return NLL_CEILING_FACTOR * float(records["pretrain"]["metrics"]["pretrained"]["nll"])


def select_lr(rows: dict[float, dict], ceiling: float) -> tuple[float, bool]:
    """The tuning rule (module docstring): ``(lr, whether it met the ceiling and the validity floors)``."""
    ok = [lr for lr, r in rows.items()
          if r["nll"] <= ceiling and r["validity"] >= MIN_VALIDITY and r["uniqueness"] >= MIN_UNIQUENESS]
    if ok:
        return max(ok, key=lambda lr: rows[lr]["reward_median"]), True
    return min(rows, key=lambda lr: rows[lr]["nll"]), False


# ------------------------------------------------------------------------------------------------ the task

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


# ------------------------------------------------------------------------------------------------ stage: pretrain

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
        margin = spec.size(ctx, "stage_margin_s")
        noise = LogLinearSchedule()
        model.train()
        running, n_run, t_last = 0.0, 0, time.monotonic()
        while step < total:
            if ctx.time_left() < margin:
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


# ------------------------------------------------------------------------------------------------ fine-tuning unit

def finetune_unit(ctx: UnitContext) -> dict:
    """One (variant, lr, seed): fine-tune to the budget, evaluate on fresh samples (curve points at 1/4 and 1/2 of
    the budget on reported seeds, the final point on ``eval_samples``); asserts VIDD's iterations and refreshes."""
    from algos.vidd.finetune import finetune
    spec = spec_of(ctx.study)
    variant = VARIANTS[ctx.setting["variant"]]
    tuning = None
    if ctx.unit.role == "tune":
        lr = float(ctx.setting[GRID_KEY])
    else:
        records = ctx.records()
        rows = tuning_rows(spec, variant.name, records)
        ceiling = nll_ceiling(spec, records)
        lr, qualified = select_lr(rows, ceiling)
        tuning = {"nll_ceiling": ceiling, "qualified": qualified,
                  "grid": {lr_name(k): v for k, v in rows.items()}, "chosen": lr}
    task = Task(spec, ctx)
    cfg = variant_config(spec, ctx, variant, lr)
    budget = cfg.query_budget
    milestones = [] if ctx.unit.role == "tune" else [budget // 4, budget // 2]
    n_curve, n_eval = spec.size(ctx, "curve_samples"), spec.size(ctx, "eval_samples")
    curve_points: list[dict] = []

    def eval_fn(model) -> dict:
        return task.evaluate(model, ctx.seed, n_curve, stream=1 + len(curve_points))

    def log_fn(iteration: int, metrics: dict) -> None:
        if "eval/reward_median" in metrics:
            curve_points.append(metrics)
        if iteration % 10 == 0:
            ctx.progress(metrics["reward_queries"], budget, "queries", iteration=iteration)

    t0 = time.perf_counter()
    result = finetune(variant.method, task.pre, task.reward, cfg, seed=int(ctx.seed), log_fn=log_fn,
                      eval_fn=eval_fn if milestones else None, eval_at_queries=milestones, final_eval=False)
    train_s = time.perf_counter() - t0
    final = task.evaluate(result.model, ctx.seed, n_eval, stream=0)
    refreshes = sum(1 for h in result.history if h.get("teacher_refreshed"))
    if variant.family == "vidd":
        need_it, need_ref = spec.size(ctx, "min_iterations"), spec.size(ctx, "min_refreshes")
        if result.iterations < need_it or refreshes < need_ref:
            raise StudyError(f"{ctx.study}/{ctx.unit.name}: {result.iterations} iterations and {refreshes} teacher "
                             f"refreshes, fewer than the study's {need_it} / {need_ref}: not reported (VIDD with "
                             f"few refreshes is standard fine-tuning)")
    if result.reward_queries > budget:
        raise StudyError(f"{ctx.study}/{ctx.unit.name}: {result.reward_queries} queries exceed the budget {budget}")
    curves = {"queries": [p["reward_queries"] for p in curve_points] + [result.reward_queries],
              "trajectories": [p["trajectories"] for p in curve_points] + [result.trajectories],
              **{k: [p[f"eval/{k}"] for p in curve_points] + [final[k]]
                 for k in ("reward_median", "reward_top10", "nll")},
              "n_samples": [n_curve] * len(curve_points) + [n_eval]}
    metrics = {**final, "queries": result.reward_queries, "iterations": result.iterations,
               "teacher_refreshes": refreshes, "trajectories": result.trajectories, "lr": lr,
               "queries_per_output_sample": result.reward_queries / n_eval, "train_s": train_s}
    body = {"metrics": metrics, "curves": curves, "label": variant.label, "family": variant.family,
            "config": {k: v for k, v in dataclasses.asdict(cfg).items() if not isinstance(v, list)},
            "reward_info": {k: float(v) for k, v in result.reward_info.items()}}
    if tuning is not None:
        body["tuning"] = tuning
    log.info("%s: median %.3f NLL %.1f | %d queries, %d it, %d refreshes, %.0f s", ctx.unit.name,
             final["reward_median"], final["nll"], result.reward_queries, result.iterations, refreshes, train_s)
    return body


# ------------------------------------------------------------------------------------------------ best-of-N unit

def best_of_n_unit(ctx: UnitContext) -> dict:
    """Best-of-N from p_pre for N = 1, 2, 4, .., n_max on nested subsets of one draw of ``eval_samples x n_max``
    candidates (N = 1: the pretrained model's own samples). Each N costs N oracle calls per output sample."""
    import torch
    spec = spec_of(ctx.study)
    task = Task(spec, ctx)
    n_out, n_max = spec.size(ctx, "eval_samples"), spec.size(ctx, "best_of_n_max")
    t0 = time.perf_counter()
    tokens = task.sample(task.pre, n_out * n_max, ctx.seed, stream=0, ctx=ctx).reshape(n_out, n_max, -1)
    rewards, _ = task.reward(tokens.reshape(n_out * n_max, -1))
    rewards = torch.as_tensor(np.asarray(rewards, dtype=np.float64)).reshape(n_out, n_max)
    points, n = [], 1
    while n <= n_max:
        best = rewards[:, :n].nan_to_num(-math.inf).argmax(dim=1)
        rows = torch.arange(n_out)
        points.append({"N": n, **task.score(tokens[rows, best], rewards[rows, best].numpy())})
        n *= 2
    keys = ("reward_median", "reward_top10", "nll", "diversity", *(("eval_reward_median", "kmer3_corr")
                                                                    if spec.task == "dna" else ()))
    return {"metrics": {**points[-1], "queries_per_output_sample": float(points[-1]["N"]), "queries": 0,
                        "inference_queries": n_out * n_max, "wall_sample_s": time.perf_counter() - t0},
            "pretrained": points[0], "points": points,
            "curves": {"N": [p["N"] for p in points], **{k: [p[k] for p in points] for k in keys}}}
