"""LIFT's finetuning as its authors run it, on Walker2d (issue 36): the learner's own loop, the official model buffer,
refit and noise, a start model that holds, and changes where the model has room. Supersedes ``lift`` (issue 23),
whose records and section stay as they are.

    python -m benchmarks.study lift_official run
    python -m benchmarks.study lift_official status
    python -m benchmarks.study lift_official report

Declared before any seed runs (this file's history is the record of when):
  pretrain (stage)  SAC on Walker2d with a velocity command v* ~ U(0, 1.5) (the ``lift`` study's preset), target
                    ``PRETRAIN_TARGET`` env steps, evaluated every 10k steps on ``EVAL_EPISODES`` deterministic
                    episodes. The start model must hold: while the last three evaluations spread by more than
                    ``HOLD_SPREAD`` of their mean, pretraining extends by ``EXTEND_STEPS`` (``pretrain_target``), up to
                    ``PRETRAIN_CAP``. Then stage 2 fits the physics world model on the newest 20k transitions.
"""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.study import lift as first_study
from benchmarks.study.core import Study, Unit, UnitContext

TASK = first_study.TASK
PRETRAIN_SEED = 0
PRETRAIN_TARGET = 200_000  # the preset's own budget (configs/env_preset/lift_pretrain_walker2d.yaml)
PRETRAIN_CAP = 300_000
EXTEND_STEPS = 20_000
HOLD_SPREAD = 0.15  # (max - min) / mean of the last three evaluations
EVAL_EPISODES = 10
WM_KINDS = ("physics",)


def start_files(artifacts: Path) -> list[Path]:
    return [artifacts / "pretrain" / "agent.pt", *(artifacts / "stage2" / f"{k}.pt" for k in WM_KINDS)]


def pretrain_target(eval_returns: list[float], target: int, extend: int = EXTEND_STEPS, cap: int = PRETRAIN_CAP
                    ) -> int:
    """The step budget after an evaluation at ``target``: unchanged when the last three evaluations agree within
    ``HOLD_SPREAD`` of their mean (or at the cap), else ``target + extend``."""
    last = eval_returns[-3:]
    if target >= cap:
        return target
    if len(last) < 3:
        return min(target + extend, cap)  # three evaluations are the rule's minimum
    mean = sum(last) / 3
    spread = (max(last) - min(last)) / abs(mean) if mean else float("inf")
    return target if spread <= HOLD_SPREAD else min(target + extend, cap)


def units() -> list[Unit]:
    return [Unit("pretrain", "stage", "pretrain", PRETRAIN_SEED, "benchmarks.study.lift_official:run_pretrain",
                 {"target": PRETRAIN_TARGET, "cap": PRETRAIN_CAP, "extend": EXTEND_STEPS, "hold_spread": HOLD_SPREAD,
                  "eval_episodes": EVAL_EPISODES, "wm_kinds": list(WM_KINDS)}, est_core_s=4 * 3600.0)]


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
        body = first_study.run_pretrain(sub, wm_kinds=WM_KINDS, stop_after_stage1=True)
        if body is None:
            return None
        summary = ctx.read_json_artifact("pretrain/summary.json")
        new = pretrain_target(summary["eval_returns"], targets["target"], extend, cap)
        if new == targets["target"]:
            break
        targets["history"].append({"at": targets["target"], "last3": summary["eval_returns"][-3:], "to": new})
        targets["target"] = new
        ctx.write_json_artifact("pretrain/target.json", targets)
        first_study.reopen_pretrain(ctx)  # the agent goes back to a checkpoint and pretraining goes on
    ctx.write_json_artifact("pretrain/target.json", targets | {"held": True})
    body = first_study.run_pretrain(sub, wm_kinds=WM_KINDS)
    if body is None:
        return None
    body["metrics"]["target_history"] = json.loads(json.dumps(targets["history"]))
    return body


def report(records: list[dict], out_dir: Path) -> str:  # the method units and their report come with the loop's fix
    done = [r for r in records if r["unit"] == "pretrain"]
    lines = ["## LIFT finetuning as its authors run it (issue 36)", ""]
    if done:
        m = done[0]["metrics"]
        lines.append(f"Start model: {m['env_steps']} env steps, final evaluation {m['final_eval_return']:.0f}.")
    else:
        lines.append("Start model: pretraining in progress.")
    return "\n".join(lines) + "\n"


STUDY = Study(name="lift_official", title="LIFT finetuning as its authors run it (issue 36)", units=units,
              start_files=start_files, report="benchmarks.study.lift_official:report")
