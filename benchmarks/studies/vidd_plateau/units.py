"""The units of ``vidd_plateau`` (plan.py says what each is for): a fine-tuning run to a CPU cap or its plateau
(pilot, tuning and reported units alike, through ``algos.vidd.finetune.finetune``, the learner code the experiment
and ``vidd_budget`` use), the two gates that turn records into the cap and the tuning choice, and best-of-N.

The task, oracles and scoring are ``vidd_budget``'s (``benchmarks.study.vidd_common``: ``Task``, ``TaskSpec``,
``experiment_config``; its sizes and base settings are copied into plan.py, since that study's modules moved while this
one was built); the evaluation adds the trajectory KL (``algos.vidd.closeness``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import time

from benchmarks.study.core import StudyError, UnitContext
from benchmarks.studies.vidd_plateau import plan, rules

log = logging.getLogger(__name__)

EVAL_SEED_BASE = 20_000  # evaluation draws: generators of their own, never the training one
MOL_BUNDLE = "pretrain_molecule/denoiser.pt"
MOL_SHA = "d5bf8208768a38c1278cc04664e54a40823350fcfb8842f74db0302686b36590"  # vidd_budget_molecule's denoiser.pt
QUERY_CEILING = 2**31  # the run stops on CPU, never on queries
STAGE_KEYS = ("reward_median", "reward_mean", "reward_top10", "kl", "kl_se", "kl_rb", "nll", "diversity", "validity",
              "uniqueness", "eval_reward_median", "kmer3_corr")
AXES = ("iteration", "queries", "trajectories", "adam_steps", "train_cpu_s")


def _specs():
    """(DNA spec, molecule spec) at this study's sizes (plan.SIZES, plan.MOL_SIZES)."""
    from benchmarks.study.vidd_common import TaskSpec
    dna = TaskSpec(study=plan.STUDY_NAME, title="DNA (liver-TF site proxy)", task="dna", reward="motif_sites",
                   reward_name="site proxy (JASPAR2024 training oracle)", sizes=plan.SIZES, variants=(), cost_s={})
    mol = TaskSpec(study=plan.STUDY_NAME, title="molecules (QED)", task="molecule", reward="qed",
                   reward_name="QED (MOSES molecules, RDKit)", sizes=plan.MOL_SIZES, variants=(), cost_s={})
    return dna, mol


def method_config(ctx: UnitContext | None, spec, method: str, lr: float, knob: float):
    """The VIDDConfig of ``method`` at one (lr, second knob) cell: ``vidd_budget``'s base settings, batch and T."""
    from benchmarks.study.vidd_common import experiment_config
    algo, overrides, steps, knob_field = plan.METHODS[method]
    k = {"all": None, "ddpo": spec.size(ctx, "ddpo_steps"), "one": 1}[steps]
    fields = {**plan.BASE, **overrides, "lr": lr, knob_field: knob, "timesteps_per_trajectory": k,
              "query_budget": QUERY_CEILING, "max_iterations": 10**9, "eval_every": 1}
    if fields.get("value_scheme", "custom") != "custom":  # the scheme sets them; the experiment's own are not given
        fields.setdefault("next_value", None)
        fields.setdefault("value_model", None)
    return dataclasses.replace(experiment_config(spec, ctx), **fields)


# ------------------------------------------------------------------------------------------------ evaluation

def evaluate(task, model, seed: int, stream: int, n: int) -> dict:
    """``n`` fresh samples of ``model`` with their trajectories: the task's scores plus the trajectory KL to p_pre."""
    import torch

    from algos.vidd.closeness import trajectory_kl_summary
    from algos.vidd.sampling import sample
    gen = torch.Generator().manual_seed(EVAL_SEED_BASE + 1000 * stream + int(seed))
    drawn = sample(model, n, task.seq_len, task.T, gen, record_trajectory=True)
    out = task.score(drawn.tokens)
    out.update(trajectory_kl_summary(model, task.pre, drawn.states))
    return out


def load_task(ctx: UnitContext, task_name: str):
    """(spec, Task) of ``dna`` (the study's start model) or ``molecule`` (its second denoiser, checked by sha)."""
    from benchmarks.study.vidd_common import Task
    dna, mol = _specs()
    if task_name == "dna":
        return dna, Task(dna, ctx)
    path = ctx.artifacts / MOL_BUNDLE
    if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != MOL_SHA:
        raise StudyError(f"{plan.STUDY_NAME}: the molecule denoiser {path} is missing or not vidd_budget_molecule's "
                         f"(sha256 {MOL_SHA[:12]})")
    return mol, Task(mol, ctx, ctx.load_artifact(MOL_BUNDLE))


# ------------------------------------------------------------------------------------------------ choices

def _record(records: dict, name: str) -> dict:
    if name not in records:
        raise StudyError(f"{plan.STUDY_NAME}: no record {name}; run it first (a unit never falls back to a default)")
    return records[name]


def tuning_scores(method: str, records: dict, cells: list[tuple[float, float]], kappa: float) -> dict:
    out = {}
    for lr, knob in cells:
        runs = [_record(records, plan.tune_name(method, lr, knob, s))["curves"] for s in plan.TUNE_SEEDS]
        out[(lr, knob)] = rules.cell_score([(c["kl"], c["reward_median"]) for c in runs], kappa)
    return out


def tuning_choice(method: str, records: dict, extended: bool = True) -> dict:
    """The tuning rule's cell for ``method`` (the primary's for Algorithm 1 and the no-refresh control) over its base
    grid, or the extended one once the tuning gate ran."""
    source = plan.PRIMARY if method in plan.USES_PRIMARY_CHOICE else method
    kappa = _record(records, "cap")["metrics"]["kappa"]
    sides = [tuple(s) for s in _record(records, "tuning")["metrics"]["extend_sides"]] if extended else []
    base, ext = plan.grid_cells(source, sides)
    scores = tuning_scores(source, records, base + ext, kappa)
    (lr, knob), reached = rules.choose_cell(scores)
    lrs = sorted({c[0] for c in scores})
    knobs = sorted({c[1] for c in scores})
    return {"from": source, "lr": lr, "knob": knob, "reached_kappa": reached, "kappa": kappa,
            "edges": rules.edge_sides((lr, knob), lrs, knobs), "extended": sides,
            "scores": {plan.cell_key(*c): s for c, s in scores.items()}}


def _posthoc_grid_choice(method: str, records: dict) -> dict:
    """POST-HOC (plan.POSTHOC_STEP): the tuning rule over the extended grid plus the post-hoc step's cells."""
    declared = tuning_choice(method, records)
    kappa, sides = declared["kappa"], [tuple(s) for s in declared["extended"]]
    edges = [tuple(e) for e in _record(records, "posthoc_edges")["metrics"]["sides"][method]]
    base, ext = plan.grid_cells(method, sides)
    added = plan.posthoc_cells(method, sides, edges)
    scores = tuning_scores(method, records, base + ext + added, kappa)
    (lr, knob), reached = rules.choose_cell(scores)
    lrs, knobs = sorted({c[0] for c in scores}), sorted({c[1] for c in scores})
    return {"from": method, "lr": lr, "knob": knob, "reached_kappa": reached, "kappa": kappa, "posthoc": True,
            "edges": rules.edge_sides((lr, knob), lrs, knobs), "extended": declared["extended"],
            "posthoc_sides": edges, "declared": {"lr": declared["lr"], "knob": declared["knob"]},
            "posthoc_cells": [plan.cell_key(*c) for c in added],
            "moved": (lr, knob) != (declared["lr"], declared["knob"]),
            "scores": {plan.cell_key(*c): s for c, s in scores.items()}}


def posthoc_choice(method: str, records: dict) -> dict:
    """The post-hoc choice a ``posthoc-<method>`` run uses: the ``posthoc_choice`` gate's record."""
    _record(records, "posthoc_choice")
    return _posthoc_grid_choice(method, records)


# ------------------------------------------------------------------------------------------------ fine-tuning

def finetune_unit(ctx: UnitContext) -> dict:
    """A fine-tuning run to a training-CPU cap, with evaluation points on the CPU grid (and at oracle-query points
    for the pilot and reported runs); reported runs also stop at their plateau (``rules.plateau_reached``)."""
    from algos.vidd.finetune import finetune
    method, role = ctx.setting["method"], ctx.unit.role
    pilot = bool(ctx.setting.get("pilot"))
    records = ctx.records() if not pilot else {}
    spec, task = load_task(ctx, ctx.setting.get("task", "dna"))
    choice = None
    if role == "tune":
        lr, knob = float(ctx.setting["lr"]), float(ctx.setting["knob"])
    else:
        choice = posthoc_choice(method, records) if role == "posthoc" else tuning_choice(method, records)
        lr, knob = choice["lr"], choice["knob"]
    if pilot:
        cap_s, n_grid = float(spec.size(ctx, "pilot_s")), plan.CAP_GRID
    else:
        cap = float(_record(records, "cap")["metrics"]["cap_s"])
        cap_s, n_grid = (cap / 4, plan.TUNE_GRID) if role == "tune" else (cap, plan.CAP_GRID)
    query_points = list(plan.QUERY_POINTS) if role != "tune" or pilot else []
    stop_at_plateau = role in ("report", "posthoc")
    cfg = method_config(ctx, spec, method, lr, knob)
    n_eval, seed = int(spec.size(ctx, "eval_samples")), int(ctx.seed)
    inner = cfg.ddpo_inner_steps if plan.METHODS[method][0] == "ddpo" else cfg.updates_per_batch

    points: list[dict] = []
    state = {"queries": 0, "eval_cpu": 0.0, "next_grid": cap_s / n_grid, "pending": None, "reason": None,
             "last_progress": time.monotonic()}
    cpu0 = time.process_time()

    def train_cpu() -> float:
        return time.process_time() - cpu0 - state["eval_cpu"]

    def measure(model, kind: str, at_cpu: float) -> dict:
        t0 = time.process_time()
        out = {**evaluate(task, model, seed, len(points), n_eval), "kind": kind, "train_cpu_s": at_cpu}
        state["eval_cpu"] += time.process_time() - t0
        return out

    points.append({**measure(task.pre, "start", 0.0), "iteration": 0, "queries": 0, "trajectories": 0,
                   "adam_steps": 0})

    def eval_fn(model) -> dict:
        c = train_cpu()
        on_grid = c >= state["next_grid"]
        on_query = bool(query_points) and state["queries"] >= query_points[0]
        if not (on_grid or on_query):
            return {}
        while state["next_grid"] <= c:
            state["next_grid"] += cap_s / n_grid
        while query_points and state["queries"] >= query_points[0]:
            query_points.pop(0)
        state["pending"] = measure(model, "cpu" if on_grid else "query", c)
        return {"reward_median": state["pending"]["reward_median"]}

    def log_fn(iteration: int, metrics: dict) -> None:
        state["queries"] = metrics["reward_queries"]
        if state["pending"] is not None:
            points.append({**state["pending"], "iteration": iteration, "queries": metrics["reward_queries"],
                           "trajectories": metrics["trajectories"], "adam_steps": iteration * inner})
            state["pending"] = None
        if time.monotonic() - state["last_progress"] > 60:
            state["last_progress"] = time.monotonic()
            ctx.progress(train_cpu(), cap_s, "train CPU-s", iteration=iteration, reward=points[-1]["reward_median"],
                         kl=points[-1]["kl"])

    def stop_fn(iteration: int, metrics: dict) -> bool:
        if train_cpu() >= cap_s:
            state["reason"] = "cap"
        elif stop_at_plateau and points[-1]["iteration"] == iteration and points[-1]["kind"] == "cpu":
            grid = [p for p in points if p["kind"] in ("start", "cpu")]
            if rules.plateau_reached([p["train_cpu_s"] for p in grid], [p["reward_median"] for p in grid], cap_s):
                state["reason"] = "plateau"
        return state["reason"] is not None

    result = finetune(plan.METHODS[method][0], task.pre, task.reward, cfg, seed=seed, log_fn=log_fn,
                      eval_fn=eval_fn, stop_fn=stop_fn, final_eval=False)
    if points[-1]["iteration"] != result.iterations:
        points.append({**measure(result.model, "final", train_cpu()), "iteration": result.iterations,
                       "queries": result.reward_queries, "trajectories": result.trajectories,
                       "adam_steps": result.iterations * inner})
    curves = {k: [p.get(k, math.nan) for p in points] for k in (*AXES, *STAGE_KEYS, "kind")}
    grid = [p for p in points if p["kind"] in ("start", "cpu")] + [points[-1]]
    refreshes = sum(1 for h in result.history if h.get("teacher_refreshed"))
    final = points[-1]
    metrics = {**{k: final.get(k, math.nan) for k in STAGE_KEYS}, **{k: final[k] for k in AXES},
               "stopped": state["reason"] or "cap", "cap_s": cap_s, "lr": lr, "knob": knob,
               "teacher_refreshes": refreshes, "cpu_per_iteration": final["train_cpu_s"] / max(1, result.iterations),
               "eval_cpu_s": state["eval_cpu"], "n_points": len(points),
               "largest_drop": rules.largest_drop([p["reward_median"] for p in grid])}
    log.info("%s: %s at %.0f CPU-s, %d it, median %.3f, KL %.2f", ctx.unit.name, metrics["stopped"],
             final["train_cpu_s"], result.iterations, final["reward_median"], final["kl"])
    body = {"metrics": metrics, "curves": curves, "task": ctx.setting.get("task", "dna"),
            "config": {k: v for k, v in dataclasses.asdict(cfg).items() if not isinstance(v, list)}}
    if choice is not None:
        body["tuning"] = choice
    if ctx.setting.get("task") == "molecule":
        body["molecule_sha"] = MOL_SHA
    return body


# ------------------------------------------------------------------------------------------------ gates

def cap_unit(ctx: UnitContext) -> dict:
    """The cap rule on the pilot records, and the declared KL values (kappa and the matched-KL points)."""
    records = ctx.records()
    dna, _ = _specs()
    pilots = [_record(records, f"pilot-s{s}")["curves"] for s in plan.TUNE_SEEDS]
    grid_of = lambda c: [i for i, k in enumerate(c["kind"]) if k in ("start", "cpu", "final")]  # noqa: E731
    curves = [([c["train_cpu_s"][i] for i in grid_of(c)], [c["reward_median"][i] for i in grid_of(c)])
              for c in pilots]
    pilot_s = float(dna.size(ctx, "pilot_s"))
    out = rules.cap_from_pilot(curves, pilot_s, n_grid=plan.CAP_GRID, round_s=float(dna.size(ctx, "cap_round_s")),
                               bounds=tuple(dna.size(ctx, "cap_bounds_s")))
    kls = [([c["train_cpu_s"][i] for i in grid_of(c)], [c["kl"][i] for i in grid_of(c)]) for c in pilots]
    kappa = float(rules.mean_curve(kls, [out["cap_s"] / 4])[0])
    at_cap = float(rules.mean_curve(curves, [out["cap_s"]])[0])
    return {"metrics": {**{k: v for k, v in out.items() if not isinstance(v, list)}, "kappa": kappa,
                        "kl_match": [f * kappa for f in plan.KL_MATCH_FACTORS], "pilot_s": pilot_s,
                        "pilot_reward_at_cap": at_cap, "pilot_reward_at_end": out["mean_reward_median"][-1]},
            "curves": {"grid_s": out["grid"], "mean_reward_median": out["mean_reward_median"]}}


def tuning_unit(ctx: UnitContext) -> dict:
    """Each tuned method's choice on its base grid and the edges it sits on: the sides every grid extends by."""
    records = ctx.records()
    choices = {m: tuning_choice(m, records, extended=False) for m in plan.TUNED}
    sides = sorted({tuple(e) for c in choices.values() for e in c["edges"]})
    return {"metrics": {"extend_sides": [list(s) for s in sides],
                        "choices": {m: {"lr": c["lr"], "knob": c["knob"], "edges": c["edges"],
                                        "reached_kappa": c["reached_kappa"]} for m, c in choices.items()}},
            "scores": {m: c["scores"] for m, c in choices.items()}}


def posthoc_edges_unit(ctx: UnitContext) -> dict:
    """POST-HOC (plan.POSTHOC_STEP): the edges of the extended grid that each claim-deciding method's choice sits on."""
    records = ctx.records()
    choices = {m: tuning_choice(m, records) for m in plan.POSTHOC_METHODS}
    return {"metrics": {"sides": {m: [list(e) for e in c["edges"]] for m, c in choices.items()},
                        "choices": {m: {"lr": c["lr"], "knob": c["knob"]} for m, c in choices.items()}}}


def posthoc_choice_unit(ctx: UnitContext) -> dict:
    """POST-HOC: each claim-deciding method's choice over its extended grid plus the post-hoc step's cells, and whether
    it moved from the declared choice (then its ``posthoc-`` runs follow)."""
    records = ctx.records()
    choices = {m: _posthoc_grid_choice(m, records) for m in plan.POSTHOC_METHODS}
    keys = ("lr", "knob", "reached_kappa", "edges", "moved", "declared", "posthoc_sides", "posthoc_cells")
    return {"metrics": {"choices": {m: {k: c[k] for k in keys} for m, c in choices.items()}},
            "scores": {m: c["scores"] for m, c in choices.items()}}


# ------------------------------------------------------------------------------------------------ best-of-N

def best_of_n_unit(ctx: UnitContext) -> dict:
    """Best-of-N from p_pre for N = 1, 2, .., ``bon_max`` on nested subsets of one draw (N = 1: p_pre itself); its
    closeness is the bound log N - (N - 1)/N; it costs N queries and N sampled trajectories per output."""
    from algos.vidd.closeness import best_of_n_kl_bound
    from benchmarks.study.vidd_common import best_of_n_ladder
    spec, task = load_task(ctx, "dna")
    n_out, n_max = int(spec.size(ctx, "bon_outputs")), int(spec.size(ctx, "bon_max"))
    points = [{**p, "kl": best_of_n_kl_bound(p["N"]), "queries": p["N"] * n_out, "trajectories": p["N"] * n_out}
              for p in best_of_n_ladder(task, n_out, n_max, ctx)]
    keys = ("N", "queries", "trajectories", "kl", "reward_median", "reward_mean", "nll", "diversity",
            "eval_reward_median", "kmer3_corr")
    return {"metrics": {**points[-1], "n_outputs": n_out}, "points": points,
            "curves": {k: [p[k] for p in points] for k in keys}}
