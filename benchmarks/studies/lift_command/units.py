"""lift_command's gates and method units (the plan in ``plan.py`` declares them; the start model comes from
``stage.py``).

  check-start   the hold verdict of pretraining (declared in ``plan.hold_verdict``), and the start model's reference
                returns in the unchanged, unrandomised env: at the edge of the command range (the command change's
                100 %) and at the in-range command (the no-change arm's and the rigid-body change's 100 %).
  gate-<cond>   zero-shot in the changed env against its reference: the command outside the range against the edge;
                gear rungs (mildest first) against the unchanged env, the first that keeps <= GATE_KEEP chosen. A gate
                that no rung passes leaves its condition unrun.
  <cond>-<method>-s<seed>  the learner a cluster job runs (``finetune_learner.run_one_rank``) for ``EPOCHS`` epochs
                of LIFT's horizon ramp; refuses unless the start model held and the condition's gate passed.

The start model's policy, the finetuning run and its record body come from the shared LIFT stages
(``benchmarks/study/lift_stages.py``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.study import lift_stages
from benchmarks.study.core import StudyError, UnitContext
from benchmarks.studies.lift_command import plan

GATE_SEED, REFERENCE_SEED = 2025, 2024  # evaluation seeds: the same episodes for every reference and gate


def mean_return(ctx: UnitContext, act, env: dict, seed: int) -> tuple[float, dict]:
    from envs.control.rollout import evaluate
    stats = evaluate(plan.TASK, act, ctx.size("gate_episodes", ctx.setting.get("episodes", plan.EVAL_EPISODES)),
                     seed, env)
    return float(np.mean(stats.returns)), {"returns": list(map(float, stats.returns)), "falls": stats.terminations}


def run_check_start(ctx: UnitContext) -> dict:
    """The hold verdict of the pretraining record, and the reference returns every later unit reads."""
    pretrain = ctx.records()["pretrain"]
    hold = plan.hold_verdict(pretrain["curves"]["eval_return"])
    act = lift_stages.policy_of(ctx)
    edge, edge_eps = mean_return(ctx, act, {"target_velocity": plan.command(plan.EDGE_COMMAND)}, REFERENCE_SEED)
    inside, inside_eps = mean_return(ctx, act, plan.condition_env("nochange"), REFERENCE_SEED)
    return {"metrics": {"holds": hold["holds"], "hold": hold, "edge_return": edge, "in_range_return": inside,
                        "edge_command": plan.EDGE_COMMAND, "in_range_command": plan.IN_RANGE_COMMAND},
            "episodes": {"edge": edge_eps, "in_range": inside_eps}}


def gate_verdict(reference: float, zero_shot: float, keep: float = plan.GATE_KEEP) -> dict:
    """A condition runs when the start model zero-shot reaches <= ``keep`` of its reference return."""
    kept = zero_shot / reference if reference > 0 else float("nan")
    return {"reference_return": reference, "zero_shot_return": zero_shot, "kept": kept,
            "passed": bool(np.isfinite(kept) and kept <= keep)}


def run_gate(ctx: UnitContext) -> dict:
    records = ctx.records()
    why = refusal(records, "nochange")  # the start model's verdict alone: a failed hold stops the study here
    if why is not None:
        raise StudyError(f"{ctx.study}/{ctx.unit.name}: refused: {why}")
    check = records["check-start"]["metrics"]
    act = lift_stages.policy_of(ctx)
    condition = ctx.setting["condition"]
    if condition == "command":
        zero, eps = mean_return(ctx, act, plan.condition_env("command"), GATE_SEED)
        verdict = gate_verdict(check["edge_return"], zero, ctx.setting["keep"])
        chosen = {"label": f"command {plan.COMMAND_OOD} m/s (range {list(plan.COMMAND_RANGE)})",
                  "env": plan.condition_env("command"), "rung": plan.COMMAND_OOD}
        return {"metrics": {**verdict, "reference": "edge_return"}, "chosen": chosen, "ladder": [{**verdict, **eps}]}
    tried = []
    for rung in ctx.setting["ladder"]:
        zero, eps = mean_return(ctx, act, plan.condition_env(condition, rung), GATE_SEED)
        tried.append({"rung": rung, **gate_verdict(check["in_range_return"], zero, ctx.setting["keep"]), **eps})
        ctx.progress(len(tried), len(ctx.setting["ladder"]), "rungs", kept=tried[-1]["kept"])
        if tried[-1]["passed"]:
            break
    last = tried[-1]
    chosen = {"label": f"actuator gear x{last['rung']}", "env": plan.condition_env(condition, last["rung"]),
              "rung": last["rung"]}
    metrics = {k: last[k] for k in ("reference_return", "zero_shot_return", "kept", "passed")}
    return {"metrics": {**metrics, "reference": "in_range_return"}, "chosen": chosen, "ladder": tried}


def refusal(records: dict[str, dict], condition: str) -> str | None:
    """Why a method unit of ``condition`` may not run (None: it may)."""
    check = records.get("check-start")
    if check is None:
        return "check-start has no record yet"
    if not check["metrics"]["holds"]:
        return f"the start model did not hold ({check['metrics']['hold']['why']}); the study stops there"
    if condition != "nochange":
        gate = records.get(f"gate-{condition}")
        if gate is None:
            return f"gate-{condition} has no record yet"
        if not gate["metrics"]["passed"]:
            return (f"gate-{condition} failed: zero-shot kept {gate['metrics']['kept']:.0%} of its reference "
                    f"(> {plan.GATE_KEEP:.0%}); the condition is reported as such and not run")
    return None


def steps_to_fraction(real_steps: list[int], returns: list[float], reference: float,
                      fraction: float = plan.RECOVER_FRACTION) -> int | None:
    """The first real-step count whose evaluation reaches ``fraction`` x ``reference`` (None: never, censored)."""
    for s, r in zip(real_steps, returns):
        if r is not None and np.isfinite(r) and r >= fraction * reference:
            return int(s)
    return None


def run_method(ctx: UnitContext) -> dict:
    """One method x condition x seed over the whole horizon ramp, LIFT's finetuning coefficients for every method."""
    import dataclasses

    from experiments.lift.finetune_config import METHOD_SPECS, Config
    records = ctx.records()
    condition = ctx.setting["condition"]
    why = refusal(records, condition)
    if why is not None:
        raise StudyError(f"{ctx.study}/{ctx.unit.name}: refused: {why}")
    check = records["check-start"]["metrics"]
    reference = check[plan.REFERENCE[condition]]
    if condition == "nochange":
        env, zero = plan.condition_env("nochange"), check["in_range_return"]
    else:
        gate = records[f"gate-{condition}"]
        env, zero = gate["chosen"]["env"], gate["metrics"]["zero_shot_return"]
    exp = Config(**{**plan.STUDY_EXP, **ctx.size("exp", {}), "epochs": ctx.size("epochs", ctx.setting["epochs"])})
    kind = METHOD_SPECS[ctx.unit.method].model
    stage2 = ctx.artifacts / "stage2" / f"{kind}.pt" if kind else None
    body = lift_stages.finetune(ctx.unit.method, env, exp, ctx.seed, ctx.artifacts / "pretrain" / "agent.pt", stage2,
                              reference, zero, ctx.work_dir / "run", plan.TASK,
                              fixed_steps=ctx.size("fixed_steps", plan.FIXED_STEPS))
    curves, metrics = body["curves"], body["metrics"]
    reached = steps_to_fraction(curves["real_steps"], curves["eval_return"], reference)
    metrics.update(steps_to_80=reached, reached_80=reached is not None,
                   steps_to_80_censored=float(reached if reached is not None else metrics["real_steps"]),
                   reference_return=reference, reference=plan.REFERENCE[condition],
                   sac_steps_per_real_step_last_epoch=_last_epoch_ratio(curves, exp.real_steps_per_epoch))
    return {**body, "condition_env": env, "schedule": dataclasses.asdict(exp)}


def _last_epoch_ratio(curves: dict[str, Any], real_steps_per_epoch: int) -> float | None:
    """SAC steps per real step in the last epoch (the ramp's end point: LIFT's full schedule reaches 20)."""
    sac = curves.get("sac_steps") or []
    return float(sac[-1] - sac[-2]) / real_steps_per_epoch if len(sac) >= 2 else None
