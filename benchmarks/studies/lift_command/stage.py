"""The start model of lift_command: the pretraining learner users run (``pretrain_learner.run_one_rank``, one rank in
this process, its env samplers in a ``LocalPool``), in calls of <= 15 min, then stage 2 on its own Parquet replay
(``world_models.pretrain_world_model``, the stage-2-from-file path a finetuning job takes).

The learner's run directory (checkpoints with the replay ring, Parquet replay, metric rows) lives in the unit's work
folder, which survives on this machine; the record gets the evaluation curve, the hold verdict and the CPU the
learner spent, its env workers included (they run in this process).
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.study.core import UnitContext

ROOT = Path(__file__).resolve().parents[3]


def learner_config(ctx: UnitContext, run_path: Path) -> dict[str, Any]:
    """The learner's config: ``experiment.*`` of ``configs/env_preset/<preset>.yaml`` over lift_pretrain's defaults
    (as ``experiments.run experiment=lift_pretrain env=walker2d_command`` composes it), the study's step budget and
    evaluation size; tests shrink it through ``ctx.size("learner", {...})``."""
    from experiments.lift.pretrain_config import Config
    setting = ctx.setting
    raw = yaml.safe_load((ROOT / "configs" / "env_preset" / f"{setting['preset']}.yaml").read_text())
    if raw.get("change") != setting["change"]:
        raise ValueError(f"configs/env_preset/{setting['preset']}.yaml's change differs from the study's declared "
                         f"one ({setting['change']}): the record would not say what ran")
    small = dict(ctx.size("learner", {}))
    sac = {**raw.get("sac", {}), **small.pop("sac", {}), "bf16": False}  # fp32: no machine-dependent float path
    exp = {**raw, "sac": sac, "total_env_steps": setting["env_steps"], "eval_episodes": setting["eval_episodes"],
           **small}
    if setting.get("init_agent"):
        exp["init_agent"] = str(declared_file(setting["init_agent"]))
    Config(**exp)  # refuses an unknown key here, not inside the learner
    return {"experiment": exp, "pool": {}, "run_path": str(run_path), "run_id": f"{ctx.study}-pretrain-s{ctx.seed}",
            "task": "walker2d", "seed": ctx.seed, "torch_threads": 1, "change": exp["change"]}


def declared_file(spec: dict[str, str]) -> Path:
    """A file the plan declared by repo-relative path and SHA-256 (the start a study continues from): refused if it
    is missing or not the declared bytes, so the record cannot say one thing and the run use another."""
    import hashlib
    path = ROOT / spec["path"]
    if not path.is_file():
        raise FileNotFoundError(f"the declared start file {spec['path']} is missing")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != spec["sha256"]:
        raise ValueError(f"{spec['path']} has SHA-256 {digest}, not the declared {spec['sha256']}")
    return path


def eval_curve(run_path: Path) -> tuple[list[int], list[float], dict[str, Any]]:
    """(env steps, evaluation returns, last row's counters) from the learner's metric rows."""
    from cluster.metrics import read_metrics
    try:
        df = read_metrics(run_path)
    except FileNotFoundError:  # paused before its first round: no metric row yet
        return [], [], {"env_steps": 0, "updates": 0}
    ev = df.dropna(subset=["eval_return"]) if "eval_return" in df else df.iloc[:0]
    last = df.iloc[-1]
    return ([int(v) for v in ev["env_steps"]], [float(v) for v in ev["eval_return"]],
            {"env_steps": int(last["env_steps"]), "updates": int(last["updates"])})


def run_pretrain(ctx: UnitContext) -> dict | None:
    """Stage 1 by the learner until its budget (None while it has more to do), then stage 2 (each model saved as it
    is fitted), then the record with the hold verdict the plan declared."""
    from benchmarks.studies.lift_command.plan import STUDY_EXP, TASK, hold_verdict
    from experiments.lift.finetune_config import Config as FinetuneConfig
    from experiments.lift.pretrain_learner import run_one_rank
    from experiments.lift.world_models import pretrain_world_model
    run_path = ctx.work_dir / "learner"
    agent_file = ctx.artifacts / "pretrain" / "agent.pt"
    reserve = ctx.size("reserve_s", 120.0)  # the checkpoint (replay ring included) must fit before the deadline
    spent = ctx.read_json_artifact("pretrain/cpu.json") or {"learner_cpu_s": 0.0, "learner_wall_s": 0.0, "calls": 0}
    if not agent_file.exists():
        cpu0, wall0 = time.process_time(), time.perf_counter()
        done = run_one_rank(learner_config(ctx, run_path), should_stop=lambda: ctx.time_left() < reserve)
        spent = {"learner_cpu_s": spent["learner_cpu_s"] + time.process_time() - cpu0,
                 "learner_wall_s": spent["learner_wall_s"] + time.perf_counter() - wall0, "calls": spent["calls"] + 1}
        ctx.write_json_artifact("pretrain/cpu.json", spent)
        steps, returns, last = eval_curve(run_path)
        ctx.progress(last["env_steps"], ctx.setting["env_steps"], "env steps",
                     eval_return=returns[-1] if returns else float("nan"))
        if not done:
            return None
        agent_file.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(run_path / "agent.pt", agent_file)
        ctx.write_json_artifact("pretrain/summary.json", {"eval_steps": steps, "eval_returns": returns, **last})
    summary = ctx.read_json_artifact("pretrain/summary.json")
    exp = FinetuneConfig(**{**STUDY_EXP, "wm_eval_every": 100, **ctx.size("exp", {})})  # stage 2 to convergence
    stage2 = {}
    for kind in ctx.setting["wm_kinds"]:
        path = ctx.artifacts / "stage2" / f"{kind}.pt"
        if not path.exists() and ctx.time_left() < ctx.size("stage2_fit_s", 300.0):
            return None
        t0, c0 = time.perf_counter(), time.process_time()
        fresh = not path.exists()
        _, metrics = pretrain_world_model(kind, TASK, exp, [run_path / "data" / "replay-rank0"], path)
        if fresh:
            spent[f"stage2_{kind}_cpu_s"] = time.process_time() - c0
            spent[f"stage2_{kind}_wall_s"] = time.perf_counter() - t0
            ctx.write_json_artifact("pretrain/cpu.json", spent)
        stage2[kind] = {k: (float(v) if isinstance(v, (int, float)) else v) for k, v in metrics.items()}
    hold = hold_verdict(summary["eval_returns"])
    shutil.rmtree(run_path / "checkpoints", ignore_errors=True)  # the start model supersedes the resumable state
    return {"metrics": {"env_steps": summary["env_steps"], "updates": summary["updates"],
                        "final_eval_return": summary["eval_returns"][-1], "hold": hold, "holds": hold["holds"],
                        "stage2": stage2, "learner_cpu_s": spent["learner_cpu_s"],
                        "learner_wall_s": spent["learner_wall_s"], "learner_calls": spent["calls"],
                        "stage2_cpu_s": sum(v for k, v in spent.items() if k.startswith("stage2_") and "cpu" in k)},
            "curves": {"env_steps": summary["eval_steps"], "eval_return": summary["eval_returns"]},
            "learner": json.loads(json.dumps(learner_config(ctx, run_path)["experiment"]))}
