"""The units of ``lift_official`` (plan: ``plan.py``): its start model, the gates that check it and the changes, and the
method runs, each through the shared LIFT stages of ``benchmarks.study.lift_stages``."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.studies.lift_official.plan import (CONTROL_METHOD, EVAL_EPISODES, EXTEND_STEPS, FIXED_STEPS,
                                                   PRETRAIN_CAP, PRETRAIN_TARGET, STUDY_EXP, TASK, WM_KINDS, command,
                                                   ladder, pretrain_target, room_verdict, start_accepted)
from benchmarks.study import lift_stages
from benchmarks.study.core import StudyError, UnitContext


def resume_from_start_model(artifacts: Path, target: int, reason: str) -> None:
    """Turn a finished start model back into a pretraining checkpoint that runs on to ``target`` env steps: the
    agent (weights, optimisers, normalizer) of ``pretrain/agent.pt``, the run's counters and evaluations of
    ``pretrain/summary.json``; agent.pt, summary.json and the stage-2 fits are removed (the stage makes them anew)."""
    import torch
    pre = artifacts / "pretrain"
    summary = json.loads((pre / "summary.json").read_text())
    gen = torch.Generator().manual_seed(summary["env_steps"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(summary["env_steps"])
        rng = torch.get_rng_state()
    state = {"env_steps": summary["env_steps"], "rounds": summary["env_steps"] // summary["sac"]["num_envs"],
             "chunks": summary["chunks"], "refills": summary["refills"], "refill_until": 0,
             "eval_steps": summary["eval_steps"], "eval_returns": summary["eval_returns"],
             "train_returns": summary["train_returns"], "falls": summary["falls"]}
    agent = torch.load(pre / "agent.pt", weights_only=True, map_location="cpu")
    torch.save({"agent": agent, "gen": gen.get_state(), "torch_rng": rng, "state": state}, pre / "checkpoint.pt")
    targets = json.loads((pre / "target.json").read_text())
    targets = {"target": target, "history": targets.get("history", []) + [
        {"at": summary["env_steps"], "last3": summary["eval_returns"][-3:], "to": target, "reason": reason}]}
    (pre / "target.json").write_text(json.dumps(targets))
    for path in (pre / "agent.pt", pre / "summary.json", *(artifacts / "stage2").glob("*.pt")):
        path.unlink()


def exp_config(ctx: UnitContext, **extra):
    from experiments.lift.finetune_config import Config
    return Config(**{**STUDY_EXP, **ctx.size("exp", {}), **extra})


def _finetune(ctx: UnitContext, method: str, env: dict, seed: int, pre: float, zero: float, **extra) -> dict:
    from experiments.lift.finetune_config import METHOD_SPECS
    exp = exp_config(ctx, **extra)
    kind = METHOD_SPECS[method].model
    return lift_stages.finetune(method, env, exp, seed, ctx.artifacts / "pretrain" / "agent.pt",
                                ctx.artifacts / "stage2" / f"{kind}.pt" if kind else None, pre, zero,
                                ctx.work_dir / f"run-{method}-s{seed}", fixed_steps=FIXED_STEPS)


def control_run(ctx: UnitContext, seed: int, pre: float) -> dict:
    """The matched SAC finetune in the unchanged env from the start model: 1000 real steps, no prefill."""
    return _finetune(ctx, CONTROL_METHOD, {"target_velocity": command()}, seed, pre, pre, prefill_steps=0,
                     epochs=ctx.size("control_epochs", 2))


def run_check_start(ctx: UnitContext) -> dict:
    """The start model holds: the last three pretraining evaluations within ``hold_spread`` of their mean, and the
    matched SAC finetune in the unchanged env keeps a mean >= ``keep`` of the pre-change return over the seeds."""
    from envs.control.rollout import evaluate
    pretrain = ctx.records()["pretrain"]
    last3 = pretrain["curves"]["eval_return"][-3:]
    spread = (max(last3) - min(last3)) / (sum(last3) / 3)
    episodes = ctx.size("gate_episodes", EVAL_EPISODES)
    pre = float(np.mean(evaluate(TASK, lift_stages.policy_of(ctx), episodes, 2024,
                                 {"target_velocity": command()}).returns))
    kept, runs = {}, {}
    for seed in ctx.setting["control_seeds"]:
        runs[str(seed)] = control_run(ctx, seed, pre)
        kept[str(seed)] = runs[str(seed)]["metrics"]["final_return"] / pre if pre > 0 else float("nan")
    mean_kept = float(np.mean(list(kept.values())))
    holds = spread <= ctx.setting["hold_spread"] and mean_kept >= ctx.setting["keep"]
    return {"metrics": {"last3": last3, "spread": spread, "pre_change_return": pre, "kept_by_seed": kept,
                        "mean_kept": mean_kept, "control_real_steps": runs[next(iter(runs))]["metrics"]["real_steps"],
                        "control_sac_steps": runs[next(iter(runs))]["metrics"]["sac_steps"], "holds": bool(holds)},
            "controls": runs}


def run_gate(ctx: UnitContext) -> dict:
    return lift_stages.run_gate(ctx, ladder, ctx.setting["keep_limit"])


def run_room(ctx: UnitContext) -> dict:
    """LIFT on the gate's change for ``epochs`` epochs (tuning seed): the refit's error against the frozen model's."""
    gate = ctx.records()[f"gate-{ctx.setting['change']}"]
    body = _finetune(ctx, "lift", gate["chosen"]["env"], ctx.setting["seed"], gate["metrics"]["pre_change_return"],
                     gate["metrics"]["zero_shot_return"], epochs=ctx.size("epochs", ctx.setting["epochs"]))
    verdict = room_verdict(body["curves"], min(2, ctx.size("epochs", ctx.setting["epochs"]) - 1))
    return {"metrics": verdict, "run": body, "change_spec": gate["chosen"]}


def run_method(ctx: UnitContext) -> dict:
    """One method x change x seed, after the start model held and the change's model had room; refuses otherwise."""
    records = ctx.records()
    change = ctx.setting["change"]
    for gate in ("check-start", f"room-{change}"):
        if gate not in records:
            raise StudyError(f"lift_official/{ctx.unit.name}: {gate} has no record yet")
    accepted, why = start_accepted(records["check-start"]["metrics"], records["pretrain"]["metrics"]["env_steps"],
                                   ctx.size("pretrain_cap", PRETRAIN_CAP))
    if not accepted:
        raise StudyError(f"lift_official/{ctx.unit.name}: refused: {why}")
    if not records[f"room-{change}"]["metrics"]["passed"]:
        raise StudyError(f"lift_official/{ctx.unit.name}: refused: the refit is worse than the frozen model on "
                         f"{change} ({records[f'room-{change}']['metrics']}); fix the refit first")
    gate = records[f"gate-{change}"]
    body = _finetune(ctx, ctx.unit.method, gate["chosen"]["env"], ctx.seed, gate["metrics"]["pre_change_return"],
                     gate["metrics"]["zero_shot_return"], epochs=ctx.size("epochs", STUDY_EXP["epochs"]))
    return {**body, "change_spec": gate["chosen"], "schedule": dict(STUDY_EXP)}


def run_pretrain(ctx: UnitContext) -> dict | None:
    """The first study's chunked stage with this study's target rule: each time the budget is reached the rule may
    raise it (recorded in ``pretrain/target.json``), and only a held budget goes on to stage 2."""
    extend, cap = ctx.size("extend_steps", EXTEND_STEPS), ctx.size("pretrain_cap", PRETRAIN_CAP)
    targets = (ctx.read_json_artifact("pretrain/target.json")
               or {"target": ctx.size("pretrain_target", PRETRAIN_TARGET), "history": []})
    summary = ctx.read_json_artifact("pretrain/summary.json")
    if summary is not None and not (ctx.artifacts / "pretrain" / "agent.pt").exists():
        summary = None
    while True:
        overrides = {"pretrain_eval_every": 10_000, "pretrain_eval_episodes": EVAL_EPISODES, **ctx.overrides,
                     "pretrain_steps": targets["target"]}
        sub = UnitContext(ctx.study, ctx.unit, ctx.results_dir, ctx.work_dir, ctx.start_sha, ctx.deadline, overrides)
        body = lift_stages.run_pretrain(sub, wm_kinds=WM_KINDS, stop_after_stage1=True)
        if body is None:
            return None
        summary = ctx.read_json_artifact("pretrain/summary.json")
        new = pretrain_target(summary["eval_returns"], targets["target"], extend, cap)
        if new == targets["target"]:
            break
        targets["history"].append({"at": targets["target"], "last3": summary["eval_returns"][-3:], "to": new})
        targets["target"] = new
        ctx.write_json_artifact("pretrain/target.json", targets)
        lift_stages.reopen_pretrain(ctx)  # the agent goes back to a checkpoint and pretraining goes on
    ctx.write_json_artifact("pretrain/target.json", targets | {"held": True})
    body = lift_stages.run_pretrain(sub, wm_kinds=WM_KINDS)
    if body is None:
        return None
    body["metrics"]["target_history"] = json.loads(json.dumps(targets["history"]))
    return body
