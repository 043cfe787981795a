"""The units of the attnrl study (plan: ``plan.py``): the SFT stage, the FCI gates and the RL runs."""
from __future__ import annotations

import dataclasses
import statistics

import torch

from benchmarks.studies.attnrl.plan import (DECIDING_GATE, EVAL, EVAL_POINTS, GATE2, GATE_CONTINUATIONS, GATE_DELTAS,
                                            GATE_PROBLEMS, MODEL, PROBE_INTERVENTIONS, PROBE_VARIANTS, RL, SFT,
                                            SFT_INIT_SEED, SFT_MARGIN_S, SFT_MIN_STEPS, TASK, TOKENS, algo_of,
                                            chosen_lr, gate_decision, log)
from benchmarks.study.core import StudyError, UnitContext


def tasks():
    """(the RL and evaluation task, the SFT task with its curriculum range)."""
    from envs.reasoning.task import ReasoningTask, ReasoningTaskConfig
    task = ReasoningTask(ReasoningTaskConfig(**TASK))
    return task, ReasoningTask(dataclasses.replace(task.cfg, min_steps=SFT_MIN_STEPS))


def new_policy(task, model: dict | None = None, seed: int = SFT_INIT_SEED):
    """A freshly initialised GPT of ``model``'s shape (default this study's ``MODEL``) on ``task``'s tokenizer."""
    from algos.attnrl.gpt import GPT, GPTConfig
    from algos.attnrl.lm import Policy
    torch.manual_seed(seed)
    return Policy(GPT(GPTConfig(vocab_size=task.tokenizer.vocab_size, **(model or MODEL))), task.tokenizer)


def load_sft(ctx: UnitContext, model: dict | None = None, task_spec: dict | None = None, make_tasks=None,
             seed: int = SFT_INIT_SEED):
    """(task, SFT policy, SFT info) from the start model; another study passes its own model, task and ``tasks``."""
    model, task_spec, make_tasks = model or MODEL, task_spec or TASK, make_tasks or tasks
    saved = ctx.load_artifact("sft/model.pt")
    if saved is None:
        raise StudyError(f"{ctx.study}/{ctx.unit.name}: no start model at {ctx.artifacts / 'sft' / 'model.pt'}; run "
                         "the sft stage first")
    if saved["model"] != model or saved["task"] != task_spec:
        raise StudyError(f"{ctx.study}/{ctx.unit.name}: the start model was made for model {saved['model']} and "
                         f"task {saved['task']}, this study uses {model} and {task_spec}")
    task, _ = make_tasks()
    policy = new_policy(task, model, seed)
    policy.model.load_state_dict(saved["state_dict"])
    policy.model.eval()
    return task, policy, saved["info"]


def evaluator(task, ctx: UnitContext):
    from benchmarks.studies.attnrl.runs import Evaluator
    return Evaluator(task, ctx.size("eval_per_difficulty", EVAL["per_difficulty"]),
                     ctx.size("eval_longest_extra", EVAL["longest_extra"]), ctx.size("eval_samples", EVAL["samples"]),
                     EVAL["temperature"])


def run_sft(ctx: UnitContext) -> dict | None:
    """Pretrain until the stopping rule fires, checkpointing before the call's deadline (None: call again)."""
    import time

    from algos.attnrl.sft import SFTConfig, SFTRun
    _, sft_task = tasks()
    policy = new_policy(sft_task)
    cfg = SFTConfig(**(SFT | {"max_steps": ctx.size("sft_max_steps", SFT["max_steps"]),
                              "eval_problems_per_difficulty": ctx.size("sft_eval_problems", 32)}))
    run = SFTRun(policy, sft_task, cfg,
                 log_fn=lambda r: ctx.progress(r["step"], cfg.max_steps, "steps",
                                               **{k: v for k, v in r.items() if k != "step"}))
    state = ctx.load_artifact("sft/checkpoint.pt")
    if state is not None:
        run.load_state_dict(state)
        log.info("sft resumed at step %d (difficulty cap %d)", run.step, run.cap)
    t0 = time.perf_counter()
    finished = run.advance(until=ctx.deadline - ctx.size("sft_margin_s", SFT_MARGIN_S))
    ctx.save_artifact("sft/checkpoint.pt", run.state_dict())
    if not finished:
        return None
    info = run.result()
    ctx.save_artifact("sft/model.pt", {"state_dict": policy.model.state_dict(), "info": info, "model": MODEL,
                                        "task": TASK, "sft": dataclasses.asdict(cfg)})
    last = info["history"][-1] if info["history"] else {}
    return {"metrics": {"steps": info["steps"], "stopped_by": "max_steps" if info["steps"] >= cfg.max_steps
                        else "rule", "step_error": last.get("step_error"), "greedy_accuracy": info["accuracy"],
                        "greedy_by_difficulty": {str(k): v for k, v in info["by_difficulty"].items()},
                        "last_call_s": time.perf_counter() - t0},
            "curves": {"sft": info["history"]},
            "settings": {"task": TASK, "sft_min_steps": SFT_MIN_STEPS, "model": MODEL, "sft": dataclasses.asdict(cfg)}}


def run_gate(ctx: UnitContext) -> dict:
    """Branch the SFT model at every step of its own responses and rank the steps by FCI, earliness and chance
    against their measured influence on the answer (module docstring, 2.); also the SFT model's evaluation."""
    import time

    from algos.attnrl.config import RLConfig
    from algos.attnrl.diagnostics import branch_every_step, step_rank_correlations, summarize_branching
    task, sft, info = load_sft(ctx)
    rl = RLConfig(**RL)
    t0 = time.perf_counter()
    per_difficulty = ctx.size("gate_problems", GATE_PROBLEMS)
    problems = task.evaluation_problems(per_difficulty, seed=777)
    continuations = ctx.size("gate_continuations", GATE_CONTINUATIONS)
    records = branch_every_step(sft, task, problems, continuations,
                                deltas=GATE_DELTAS, zero_first_step=rl.zero_first_step,
                                generator=torch.Generator().manual_seed(0))
    branch_s = time.perf_counter() - t0
    summary = summarize_branching(records, GATE_DELTAS, rl.branch_points, rl.rho)
    difficulties = range(TASK["min_steps"], TASK["max_steps"] + 1)
    decision = gate_decision(step_rank_correlations(records, rl.delta, influence="marginal"), min(24, per_difficulty),
                             difficulties)
    suffix = gate_decision(step_rank_correlations(records, rl.delta, influence="suffix"), 0)["overall"]
    other_deltas = {str(d): gate_decision(step_rank_correlations(records, d), 0)["overall"] for d in GATE_DELTAS}
    kept = {str(d): sum(r["difficulty"] == d for r in records) for d in difficulties}
    sft_eval = evaluator(task, ctx)(sft)
    ctx.progress(1, 1, "gate", fci_beats_both=str(decision["fci_beats_both"]))
    return {"metrics": {"fci_beats_both": decision["fci_beats_both"], "beats_earliest": decision["beats_earliest"],
                        "beats_random": decision["beats_random"], "enough_responses": decision["enough_responses"],
                        "delta": rl.delta, "problems_per_difficulty": per_difficulty, "responses_kept": kept,
                        "continuations": continuations,
                        "branch_s": branch_s},
            "influence": "marginal", "decision": decision, "suffix_flip": suffix, "other_deltas": other_deltas,
            "summary": summary,
            "sft": {"eval": sft_eval, "steps": info["steps"], "history_tail": info["history"][-3:]}}


def head_correlations(policy, task, problems, delta: int) -> dict[str, float]:
    """Per layer and head (and for FCI's max over them, and earliness): mean per-problem Spearman of the column sums
    y_k (attention later steps pay to step k) with membership in the answer's cone, teacher-forced on the reference
    solutions; candidates as in the gate. Does any head see the dependency that the max over heads misses?"""
    import math

    from algos.attnrl.diagnostics import spearman
    from algos.attnrl.fci import later_attention
    from algos.attnrl.scoring import forward_scores
    codec = policy.codec
    with torch.no_grad():
        alphas = forward_scores(policy, [codec.encode(p.prompt) for p in problems],
                                [codec.encode(p.solution) + [codec.eos_id] for p in problems],
                                output_step_attention=True).step_attention
    out: dict[str, list[float]] = {}
    for problem, alpha in zip(problems, alphas):
        layers, heads, S, _ = alpha.shape
        y = later_attention(alpha, delta)  # (L, H, S)
        cone = task.dependency_cone(problem)  # per response line; alpha index 0 is the prompt
        candidates = range(2, S - 1)  # response lines 2..K (the first line and the answer line are not candidates)
        target = [float(cone[c - 1]) for c in candidates]
        if len(set(target)) < 2:
            continue
        columns = {f"L{l}H{h}": y[l, h] for l in range(layers) for h in range(heads)}
        columns["max (FCI)"] = y.flatten(0, 1).amax(dim=0)
        for name, col in columns.items():
            c = spearman([float(col[k]) for k in candidates], target)
            out.setdefault(name, []).append(0.0 if math.isnan(c) else c)
        out.setdefault("earliness", []).append(spearman([-k for k in candidates], target))
    return {k: statistics.fmean(v) for k, v in out.items()}


def intervention_shares(records: list[dict]) -> dict[str, float | None]:
    """Mean share of forced result changes that moved the answer, over cone steps and over distractor steps."""
    steps = [s for r in records for s in r["steps"][:-1]]
    shares = {kind: [s["intervention"] for s in steps if s["in_cone"] == (kind == "cone")]
              for kind in ("cone", "distractor")}
    return {k: statistics.fmean(v) if v else None for k, v in shares.items()}


def run_gate_probe(ctx: UnitContext) -> dict:
    """The gate's question again with a measure that needs no model error (forced result changes), on the study task
    and two dead-end-distractor variants (``PROBE_VARIANTS``), plus a per-head look at the attention."""
    from algos.attnrl.config import RLConfig
    from algos.attnrl.diagnostics import branch_every_step, step_rank_correlations
    from envs.reasoning.task import ReasoningTask, ReasoningTaskConfig
    _, sft, _ = load_sft(ctx)
    rl = RLConfig(**RL)
    per_difficulty = ctx.size("gate_problems", GATE_PROBLEMS)
    difficulties = range(TASK["min_steps"], TASK["max_steps"] + 1)
    variants = {}
    for i, (name, change) in enumerate(PROBE_VARIANTS.items()):
        task = ReasoningTask(ReasoningTaskConfig(**(TASK | change)))
        problems = task.evaluation_problems(per_difficulty, seed=777)
        records = branch_every_step(sft, task, problems, continuations=1, deltas=GATE_DELTAS,
                                    zero_first_step=rl.zero_first_step, generator=torch.Generator().manual_seed(0),
                                    interventions=ctx.size("probe_interventions", PROBE_INTERVENTIONS))
        candidates = [s for r in records for s in r["steps"][:-1]]
        variants[name] = {
            "task": TASK | change, "responses": len(records), "intervention_mean": intervention_shares(records),
            "steps": {"cone": sum(s["in_cone"] for s in candidates),
                      "distractor": sum(not s["in_cone"] for s in candidates)},
            "decision": gate_decision(step_rank_correlations(records, rl.delta, influence="intervention"),
                                      min(24, per_difficulty), difficulties),
            "other_deltas": {str(d): gate_decision(step_rank_correlations(records, d, influence="intervention"),
                                                   0)["overall"] for d in GATE_DELTAS},
            "heads": head_correlations(sft, task, problems, rl.delta)}
        ctx.progress(i + 1, len(PROBE_VARIANTS), "variants", **{name: variants[name]["decision"]["fci_beats_both"]})
    return {"metrics": {name: {"fci_beats_both": v["decision"]["fci_beats_both"],
                               "fci": v["decision"]["overall"]["fci"][0],
                               "earliest": v["decision"]["overall"]["earliest"][0],
                               "random": v["decision"]["overall"]["random"][0]} for name, v in variants.items()},
            "influence": "intervention", "delta": rl.delta, "problems_per_difficulty": per_difficulty,
            "variants": variants}


def run_gate_intervention(ctx: UnitContext) -> dict:
    """The deciding gate (``GATE2``): FCI, earliest-first and random orderings against the intervention influence on
    fresh problems; RL units run only if FCI beats both."""
    import time

    from algos.attnrl.config import RLConfig
    from algos.attnrl.diagnostics import branch_every_step, step_rank_correlations
    task, sft, _ = load_sft(ctx)
    rl = RLConfig(**RL)
    t0 = time.perf_counter()
    per_difficulty = ctx.size("gate_problems", GATE2["problems"])
    records = branch_every_step(sft, task, task.evaluation_problems(per_difficulty, seed=GATE2["seed"]),
                                continuations=1, deltas=GATE_DELTAS, zero_first_step=rl.zero_first_step,
                                generator=torch.Generator().manual_seed(0),
                                interventions=ctx.size("probe_interventions", GATE2["interventions"]))
    draws = GATE2["random_draws"]
    difficulties = range(TASK["min_steps"], TASK["max_steps"] + 1)
    decision = gate_decision(step_rank_correlations(records, rl.delta, influence="intervention", random_draws=draws),
                             min(24, per_difficulty), difficulties)
    other_deltas = {str(d): gate_decision(step_rank_correlations(records, d, influence="intervention",
                                                                 random_draws=draws), 0)["overall"]
                    for d in GATE_DELTAS}
    ctx.progress(1, 1, "gate", fci_beats_both=str(decision["fci_beats_both"]))
    return {"metrics": {"fci_beats_both": decision["fci_beats_both"], "beats_earliest": decision["beats_earliest"],
                        "beats_random": decision["beats_random"], "enough_responses": decision["enough_responses"],
                        "delta": rl.delta, "problems_per_difficulty": per_difficulty,
                        "responses_kept": {str(d): sum(r["difficulty"] == d for r in records) for d in difficulties},
                        "branch_s": time.perf_counter() - t0},
            "influence": "intervention", "gate": GATE2, "decision": decision, "other_deltas": other_deltas,
            "intervention_mean": intervention_shares(records)}


def require_gate(ctx: UnitContext) -> dict:
    """The deciding gate's record. Its failure no longer stops the RL units (issue 38): they run as the
    mechanism-absent control that ``PREDICTIONS`` describes, and every record says so (``fci_room``)."""
    gate = ctx.records().get(DECIDING_GATE)
    if gate is None:
        raise StudyError(f"attnrl/{ctx.unit.name}: the FCI gate has no record yet; run the {DECIDING_GATE} unit "
                         "first")
    return gate


def run_rl(ctx: UnitContext) -> dict:
    """One RL run of one study method and seed from the SFT model, evaluated along the way."""
    from algos.attnrl.config import AdaptiveSamplingConfig
    from benchmarks.studies.attnrl.runs import run_one
    gate = require_gate(ctx)
    method = ctx.unit.method
    algo, overrides = algo_of(method)
    if ctx.unit.role == "tune":
        lr, scores = float(ctx.setting["lr"]), {}
    else:
        lr, scores = chosen_lr(ctx.records(), method)
    task, sft, _ = load_sft(ctx)
    tokens = ctx.size("tokens", TOKENS)
    sizes = {"token_budget": tokens, "prompts_per_batch": ctx.size("prompts_per_batch", RL["prompts_per_batch"])}
    rl = {**RL, **sizes, "lr": lr, **overrides}
    if rl.get("ads") == "off":
        rl["ads"] = AdaptiveSamplingConfig(difficulty_expansion=False, attention_filter=False,
                                           zero_advantage_filter=False, adaptive_batch=False)
    eval_tokens = max(tokens // EVAL_POINTS, 1)
    run = run_one(algo, ctx.seed, sft, task, evaluator(task, ctx), rl, eval_tokens)
    curve = run.pop("curve")
    run["rl"] = {**RL, **sizes, "lr": lr, **overrides}
    end = curve[-1]
    ctx.progress(run["generated_tokens"], tokens, "tokens", sampled_longest=end["sampled_longest"])
    return {"metrics": {"sampled_longest_end": end["sampled_longest"], "greedy_end": end["greedy"],
                        "generated_tokens": run["generated_tokens"], "updates": run["updates"],
                        "train_cpu_s": run["train_cpu_s"]},
            "fci_room": bool(gate["metrics"]["fci_beats_both"]),
            "algo": algo, "lr": lr, "lr_scores": {f"{k:g}": v for k, v in scores.items()},
            "run": run, "curves": {"eval": curve}}
