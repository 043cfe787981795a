"""AttnRL's second model for the FCI gate (issue 38): the program-tracing task in its own units, a 4-layer model.

    python -m benchmarks.study attnrl_units status
    nice -n 19 python -m benchmarks.study attnrl_units run &
    python -m benchmarks.study attnrl_units report

Why: the attnrl study's deciding gate found FCI at chance on a 2-layer character model. One reading is that a model
whose tokens are the task's units (each name, operator and value one token) with more depth concentrates attention
where the data flows. Honest caveat: on the attnrl study's own task (one-letter names, one-digit values) the unit and
the character tokenizers coincide token for token, so that model *was* a unit-token model. This study therefore
writes the same cone programs with two-letter names and two-digit values (modulus 20: `envs/reasoning/tokens.py`),
where ~54 % of the tokens are units of two characters; the model differs from the attnrl study's in depth (4 layers
instead of 2), in its tokens and in the value range (0-19 instead of 0-9). A trace line is still 16 tokens (the
character model's lines on the one-digit task were 16 characters): the unit tokens change what a token carries, not
how many tokens a step has.

The plan, in run order:

1. ``sft``: supervised pretraining like attnrl's (same curriculum, stopping rule and learning rate), capped at
   ``SFT["max_steps"]`` so that it stays within ~1 core-hour (0.27 CPU-s per step measured on the full 2-8-step mix,
   4 layers, shared 2-core machine); resumable, checkpointing into ``artifacts/sft/checkpoint.pt`` before every
   call's 15-min deadline.
2. ``gate-intervention``: the deciding gate, declared here before it ran (``GATE``): the attnrl study's deciding
   statistic and rule (intervention influence at delta 2; per response, Spearman of FCI / earliest-first / random
   orderings with it; FCI must beat both, each paired 95 % t-interval above 0) on fresh problems (seed 779; attnrl's
   probe used 777, its deciding gate 778). Also the SFT model's evaluation and the per-head view of the attention.
3. ``<method>-s<seed>`` for attn_tree, earliest_tree and attnrl on seeds 10-14: the mechanism reading, run only if
   FCI beats both orderings here; otherwise each refuses in one line (the control of the attnrl study stands).
"""
from __future__ import annotations

import dataclasses
import logging

import torch

from benchmarks.study import attnrl as base
from benchmarks.study.core import REPORTED_SEEDS, Study, StudyError, Unit, UnitContext

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------------------ the settings
TASK = base.TASK | {"modulus": 20}  # the attnrl study's cone task with two-digit values (and two-letter names)
SFT_MIN_STEPS = base.SFT_MIN_STEPS
MODEL = {"n_layer": 4, "n_head": 4, "n_embd": 64}  # ~207k parameters: attnrl's width, twice its depth
SFT = base.SFT | {"max_steps": 12_000}  # ~0.3 CPU-s per step with evaluations: <= ~1 core-hour
SFT_INIT_SEED = 0
SFT_MARGIN_S = base.SFT_MARGIN_S

# The deciding gate, declared before it ran (2026-12-05): attnrl's GATE2 statistic and rule on fresh problems.
GATE_UNIT = "gate-intervention"
GATE = {"problems": 192, "seed": 779, "interventions": 3, "random_draws": 200}
RL = base.RL
RL_METHODS = ("attn_tree", "earliest_tree", "attnrl")
# No tuning round on this model (budget): the attnrl studies' first grid value, GRPO's best in the previous round.
RL_LR = 1e-4
TOKENS = base.TOKENS
EVAL_POINTS = base.EVAL_POINTS
COST_S = {"sft": 3600.0, "gate": 600.0, "rl": 300.0}  # RL: attnrl's tree estimate x 2 for twice the layers


# ------------------------------------------------------------------------------------------------ the plan

def units() -> list[Unit]:
    fn = "benchmarks.study.attnrl_units:"
    plan = [Unit("sft", "stage", "sft", None, fn + "run_sft", est_core_s=COST_S["sft"]),
            Unit(GATE_UNIT, "gate", "fci_gate", None, fn + "run_gate", after=("sft",), est_core_s=COST_S["gate"])]
    for seed in REPORTED_SEEDS:
        for method in RL_METHODS:
            plan.append(Unit(f"{method}-s{seed}", "report", method, seed, fn + "run_rl", {"lr": RL_LR},
                             after=(GATE_UNIT,), est_core_s=COST_S["rl"]))
    return plan


def start_files(artifacts) -> list:
    return [artifacts / "sft" / "model.pt"]


# ------------------------------------------------------------------------------------------------ task and model

def tasks():
    """(the RL and evaluation task, the SFT task with its curriculum range), both in unit tokens."""
    from envs.reasoning.task import ReasoningTaskConfig
    from envs.reasoning.tokens import UnitReasoningTask
    cfg = ReasoningTaskConfig(**TASK)
    return UnitReasoningTask(cfg), UnitReasoningTask(dataclasses.replace(cfg, min_steps=SFT_MIN_STEPS))


def new_policy(task):
    return base.new_policy(task, MODEL, SFT_INIT_SEED)


def load_sft(ctx: UnitContext):
    """(task, SFT policy, SFT info) from the start model (attnrl's loader with this study's model and task)."""
    return base.load_sft(ctx, MODEL, TASK, tasks, SFT_INIT_SEED)


# ------------------------------------------------------------------------------------------------ 1. SFT stage

def run_sft(ctx: UnitContext) -> dict | None:
    """Pretrain until the stopping rule or the step cap, checkpointing before the call's deadline (None: call
    again)."""
    import time

    from algos.attnrl.sft import SFTConfig, SFTRun
    task, sft_task = tasks()
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
    sample = task.evaluation_problems(16, seed=0)
    return {"metrics": {"steps": info["steps"], "stopped_by": "max_steps" if info["steps"] >= cfg.max_steps
                        else "rule", "step_error": last.get("step_error"), "greedy_accuracy": info["accuracy"],
                        "greedy_by_difficulty": {str(k): v for k, v in info["by_difficulty"].items()},
                        "last_call_s": time.perf_counter() - t0},
            "tokens": {"vocab_size": task.tokenizer.vocab_size, "unit_share": task.unit_share(sample),
                       "example": sample[-1].prompt + sample[-1].solution},
            "curves": {"sft": info["history"]},
            "settings": {"task": TASK, "sft_min_steps": SFT_MIN_STEPS, "model": MODEL, "sft": dataclasses.asdict(cfg),
                         "tokenizer": "unit"}}


# ------------------------------------------------------------------------------------------------ 2. the gate

def run_gate(ctx: UnitContext) -> dict:
    """The deciding gate (``GATE``): FCI, earliest-first and random orderings against the intervention influence on
    fresh problems, with attnrl's rule; also the SFT model's evaluation and the per-head correlations."""
    import time

    from algos.attnrl.config import RLConfig
    from algos.attnrl.diagnostics import branch_every_step, step_rank_correlations
    task, sft, info = load_sft(ctx)
    rl = RLConfig(**RL)
    t0 = time.perf_counter()
    per_difficulty = ctx.size("gate_problems", GATE["problems"])
    problems = task.evaluation_problems(per_difficulty, seed=GATE["seed"])
    records = branch_every_step(sft, task, problems, continuations=1, deltas=base.GATE_DELTAS,
                                zero_first_step=rl.zero_first_step, generator=torch.Generator().manual_seed(0),
                                interventions=ctx.size("probe_interventions", GATE["interventions"]))
    draws = GATE["random_draws"]
    difficulties = range(TASK["min_steps"], TASK["max_steps"] + 1)
    decision = base.gate_decision(step_rank_correlations(records, rl.delta, influence="intervention",
                                                         random_draws=draws), min(24, per_difficulty), difficulties)
    other_deltas = {str(d): base.gate_decision(step_rank_correlations(records, d, influence="intervention",
                                                                      random_draws=draws), 0)["overall"]
                    for d in base.GATE_DELTAS}
    branch_s = time.perf_counter() - t0
    spread = problems[::max(1, len(problems) // ctx.size("head_problems", 64))]  # every difficulty, not the first
    heads = base.head_correlations(sft, task, spread, rl.delta)
    sft_eval = base.evaluator(task, ctx)(sft)
    ctx.progress(1, 1, "gate", fci_beats_both=str(decision["fci_beats_both"]))
    return {"metrics": {"fci_beats_both": decision["fci_beats_both"], "beats_earliest": decision["beats_earliest"],
                        "beats_random": decision["beats_random"], "enough_responses": decision["enough_responses"],
                        "delta": rl.delta, "problems_per_difficulty": per_difficulty,
                        "responses_kept": {str(d): sum(r["difficulty"] == d for r in records) for d in difficulties},
                        "branch_s": branch_s},
            "influence": "intervention", "gate": GATE, "decision": decision, "other_deltas": other_deltas,
            "intervention_mean": base.intervention_shares(records), "heads": heads,
            "sft": {"eval": sft_eval, "steps": info["steps"], "history_tail": info["history"][-3:]}}


# ------------------------------------------------------------------------------------------------ 3. RL units

def require_room(ctx: UnitContext) -> dict:
    """The gate's record when FCI beat both orderings on this model; otherwise a one-line refusal."""
    gate = ctx.records().get(GATE_UNIT)
    if gate is None:
        raise StudyError(f"attnrl_units/{ctx.unit.name}: the FCI gate has no record yet; run {GATE_UNIT} first")
    if not gate["metrics"]["fci_beats_both"]:
        o = gate["decision"]["overall"]
        raise StudyError(f"attnrl_units/{ctx.unit.name}: refused: FCI does not beat both orderings on the unit-token "
                         f"model (FCI - earliest {o['fci_minus_earliest'][0]:+.3f}, FCI - random "
                         f"{o['fci_minus_random'][0]:+.3f}); the attnrl study's control reading stands")
    return gate


def run_rl(ctx: UnitContext) -> dict:
    """One RL run of attn_tree, earliest_tree or attnrl from this study's SFT model, if the gate gave FCI room."""
    from benchmarks.attnrl import run_one
    require_room(ctx)
    algo, overrides = base.algo_of(ctx.unit.method)
    task, sft, _ = load_sft(ctx)
    tokens = ctx.size("tokens", TOKENS)
    sizes = {"token_budget": tokens, "prompts_per_batch": ctx.size("prompts_per_batch", RL["prompts_per_batch"])}
    lr = float(ctx.setting["lr"])
    rl = {**RL, **sizes, "lr": lr, **overrides}
    run = run_one(algo, ctx.seed, sft, task, base.evaluator(task, ctx), rl, max(tokens // EVAL_POINTS, 1))
    curve = run.pop("curve")
    run["rl"] = dict(rl)
    end = curve[-1]
    ctx.progress(run["generated_tokens"], tokens, "tokens", sampled_longest=end["sampled_longest"])
    return {"metrics": {"sampled_longest_end": end["sampled_longest"], "greedy_end": end["greedy"],
                        "generated_tokens": run["generated_tokens"], "updates": run["updates"],
                        "train_cpu_s": run["train_cpu_s"]},
            "fci_room": True, "algo": algo, "lr": lr, "run": run, "curves": {"eval": curve}}


STUDY = Study(name="attnrl_units", title="AttnRL's FCI gate on a unit-token 4-layer model", units=units,
              start_files=start_files, report="benchmarks.attnrl_units_report:report")
