"""LIFT in the tour: pretraining on a fast MuJoCo task, then finetuning in a changed version of it (a world model
from the pretraining replay) against stochastic-SAC finetuning; its report section and the tour test's check."""
from __future__ import annotations

from pathlib import Path

from experiments.tour import TourPart, TourStage
from experiments.tour_report import copy_plots, fmt, load_summary, paired_verdict, ratio

# the run stops once the evaluation reaches the preset's stop_return (seed 0 alone: 1000 at ~14k env steps); gravity
# x9: policies that reach 1000 here keep it up to x6 (one of them up to x8) and drop to 4-43 at x9; with LIFT's
# finetuning coefficients and the preset's update budget LIFT recovers in 5000-6000 real steps, SAC in ~2000 (one seed)
TOUR = TourPart(
    title="LIFT",
    stages=(
        TourStage("lift_pretrain",
                  overrides=("env=inverted_pendulum", "experiment.total_env_steps=20000",
                             "experiment.eval_every_steps=2000"),
                  tiny=("experiment.total_env_steps=1536", "experiment.eval_every_steps=512",
                        "experiment.eval_episodes=3")),
        TourStage("lift_finetune",
                  overrides=("env=inverted_pendulum", "experiment.pretrain_run=<run_dir:lift_pretrain>",
                             "experiment.methods=[lift,sac_finetune]", "experiment.change={name:gravity,scale:9.0}"),
                  tiny=("experiment.change=null",  # the task's default change, as the tour test always used
                        "experiment.epochs=2", "experiment.real_steps_per_epoch=200", "experiment.prefill_steps=200",
                        "experiment.wm_pretrain_steps=100", "experiment.wm_retrain_steps=50",
                        "experiment.hupt_schedule=[0,1,2,2]", "experiment.eval_episodes=2")),
    ),
    section="experiments.lift.tour:section",
    paper_scale="python -m experiments.run experiment=lift_pretrain env=humanoid_state scale=paper cluster=remote; "
                "then experiment=lift_finetune env=humanoid_state scale=paper experiment.pretrain_run=<run dir>",
    check="experiments.lift.tour:check",
)


# The tour runs one seed of a small change; the claim itself is tested seed-paired on Walker2d by the study.
STUDY_POINTER = ("one seed, a smoke run; the claim is tested on Walker2d, seeds 10-14, with the loop a cluster job "
                 "runs, in benchmarks/RESULTS.md ('LIFT on its own change', "
                 "`python -m benchmarks.study lift_command_warm report`)")


def section(stages, out: Path) -> tuple[list[str], list[dict], list[str]]:
    pre, fin = stages
    lines, claims, plots = ["## LIFT (humanoid-control recipe on a fast MuJoCo task)", ""], [], []
    s_pre = load_summary(pre.run_dir) if pre.ok else None
    if s_pre:
        plots += copy_plots([s_pre.get("plot")], out, "lift")
        lines += [f"Pretraining on **{s_pre['task']}**: eval return {fmt(s_pre['final_eval_return'])} "
                  f"(best {fmt(s_pre['best_eval_return'])}) after {s_pre['env_steps']} env steps and "
                  f"{s_pre['updates']} SAC updates in {fmt(s_pre['wall_s'])} s. Source: `{pre.run_dir}/metrics`.", ""]
        claims.append({"paper": "LIFT", "claim": "large-batch high-UTD SAC pretraining learns the task",
                       "observed": f"eval return {fmt(s_pre['first_eval_return'])} -> {fmt(s_pre['best_eval_return'])} "
                                   f"in {s_pre['env_steps']} env steps",
                       "holds": "yes" if s_pre["best_eval_return"] is not None and s_pre["first_eval_return"]
                       is not None and s_pre["best_eval_return"] > s_pre["first_eval_return"] else "no"})
    s_fin = load_summary(fin.run_dir) if fin.ok else None
    if s_fin:
        plots += copy_plots([s_fin.get("plot")], out, "lift")
        methods = s_fin["methods"]
        lines += [f"Finetuning in the changed task (**{s_fin['change']}**): pre-change return "
                  f"{fmt(s_fin['pre_change_return'])}, zero-shot in the changed task {fmt(s_fin['zero_shot_return'])}. "
                  f"Source: `{fin.run_dir}/metrics`.", "",
                  "| method | real steps to recover 80% | final return | best return | real-env falls | real steps |",
                  "|---|---|---|---|---|---|"]
        for name, m in methods.items():
            lines.append(f"| {name} | {fmt(m['real_steps_to_recover'])} | {fmt(m['final_return'])} | "
                         f"{fmt(m['best_return'])} | {m['falls']} | {m['real_steps']} |")
        lines.append("")
        lift, sac = methods.get("lift"), methods.get("sac_finetune")
        if lift and sac:
            a, b = lift["real_steps_to_recover"], sac["real_steps_to_recover"]
            pre_c, zero = s_fin["pre_change_return"], s_fin["zero_shot_return"]
            # a change that costs the pretrained policy under 10 % of its return leaves nothing to recover
            unhurt = zero >= pre_c - 0.1 * abs(pre_c)
            observed = f"{fmt(a)} vs {fmt(b)} real steps ({ratio(a, b)}); {STUDY_POINTER}"
            if unhurt:
                observed += (f"; the change did not hurt the pretrained policy (zero-shot {fmt(zero)} vs "
                             f"{fmt(pre_c)}): pick a harsher experiment.change")
            claims.append({"paper": "LIFT", "claim": "finetuning recovers with fewer real steps than stochastic SAC "
                                                     "finetuning", "observed": observed,
                           "holds": "n/a" if unhurt else _recovery_verdict(a, b)})
            claims.append({"paper": "LIFT", "claim": "safer: fewer real-env falls than stochastic SAC finetuning",
                           "observed": f"{lift['falls']} vs {sac['falls']} falls; {STUDY_POINTER}",
                           "holds": paired_verdict([lift["falls"] - sac["falls"]], higher_is_better=False)})
    return lines, claims, plots


def check(tour_run: Path, report: str, data: dict) -> None:
    """The LIFT section's numbers are the runs' own (the tour test and the rehearsal call this)."""
    import json
    import math
    import re

    from cluster.metrics import read_metrics
    assert "## LIFT" in report and "env" in data["pool"]["per_sampler"], data["pool"]["per_sampler"]
    runs = tour_run / "runs"
    pre = json.loads((runs / "lift_pretrain" / "lift_pretrain" / "summary.json").read_text())
    df = read_metrics(runs / "lift_pretrain" / "lift_pretrain").dropna(subset=["eval_return"])
    assert math.isclose(pre["final_eval_return"], df["eval_return"].iloc[-1], rel_tol=1e-6, abs_tol=1e-9)
    assert f"eval return {pre['final_eval_return']:.3g}" in report
    fin = json.loads((runs / "lift_finetune" / "lift_finetune" / "summary.json").read_text())
    assert set(fin["methods"]) == {"lift", "sac_finetune"}
    for name, m in fin["methods"].items():
        row = re.search(rf"^\| {name} \| [^|]+ \| ([^|]+) \|", report, re.M)
        assert row and row.group(1).strip() == f"{m['final_return']:.3g}"


def _recovery_verdict(lift_steps: int | None, sac_steps: int | None) -> str:
    """The recovery claim's verdict; a run that never recovered has no step count to pair."""
    missing = [name for name, steps in (("LIFT", lift_steps), ("SAC", sac_steps)) if steps is None]
    if missing:
        what = "neither LIFT nor SAC recovered" if len(missing) == 2 else f"{missing[0]} did not recover"
        return f"not shown at this budget ({what} within the run)"
    return paired_verdict([lift_steps - sac_steps], higher_is_better=False)
