"""The lift_command study (issue 47): its plan and declared rules, its gates' and refusals' logic, and its report on
synthetic partial records (written into tmp_path, never into benchmarks/)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from benchmarks.study.core import REPORTED_SEEDS
from benchmarks.studies.lift_command import plan, report, units
from envs.control.lift_kind import lift_kind_pretrain
from experiments.lift.finetune_config import METHOD_SPECS


def test_plan_declares_every_condition_method_and_seed_within_the_budget():
    plan_units = plan.STUDY.plan()
    assert plan_units[0].name == "pretrain" and plan_units[0].role == "stage"
    reported = [u for u in plan_units if u.role == "report"]
    for condition, methods in plan.METHODS.items():
        for m in methods:
            assert m in METHOD_SPECS
            seeds = sorted(u.seed for u in reported if u.method == m and u.setting["condition"] == condition)
            assert seeds == list(REPORTED_SEEDS), (condition, m)
    assert {u.setting["condition"] for u in reported if u.method == "lift_frozen_model"} == {"gear"}
    assert all("check-start" in u.after for u in reported)
    assert sum(u.est_core_s for u in plan_units) / 3600 <= plan.BUDGET_CORE_H
    # the whole ramp: LIFT's horizon schedule reaches H = 20 in the last epoch, for every method alike
    from algos.lift.finetune import LinearSchedule
    assert LinearSchedule(*plan.STUDY_EXP["horizon_schedule"])(plan.EPOCHS - 1) == 20
    # the command change is outside the training range, the gear rungs outside any randomised range
    assert plan.COMMAND_OOD > plan.COMMAND_RANGE[1] and all(r < 1.0 for r in plan.GEAR_LADDER)


def test_the_learner_runs_the_preset_the_plan_declares():
    raw = yaml.safe_load(open(plan_path := "configs/env_preset/lift_pretrain_walker2d_command.yaml"))
    assert raw["change"] == lift_kind_pretrain() == plan.STUDY.plan()[0].setting["change"], plan_path


@pytest.mark.parametrize("returns, holds", [
    ([100.0, 2800.0, 2900.0, 2850.0], True),     # within 15 % and at the peak
    ([100.0, 2000.0, 2900.0, 2500.0], False),    # 36 % apart
    ([3500.0, 2800.0, 2900.0, 2850.0], False),   # steady but 81 % of an earlier best
    ([2800.0, 2900.0], False),                   # fewer than three evaluations
])
def test_the_hold_rule(returns, holds):
    assert plan.hold_verdict(returns)["holds"] is holds


def test_gates_and_refusals():
    assert units.gate_verdict(3000.0, 2400.0)["passed"]  # exactly 80 % passes (<=)
    assert not units.gate_verdict(3000.0, 2500.0)["passed"]
    held = {"check-start": {"metrics": {"holds": True, "hold": {"why": "-"}}},
            "gate-command": {"metrics": {"passed": False, "kept": 0.9}}}
    assert units.refusal(held, "nochange") is None
    assert "gate-command failed" in units.refusal(held, "command")
    assert "no record" in units.refusal(held, "gear")
    failed = {"check-start": {"metrics": {"holds": False, "hold": {"why": "spread 40%"}}}}
    assert "did not hold (spread 40%)" in units.refusal(failed, "nochange")
    assert units.steps_to_fraction([0, 2000, 4000], [100.0, 2300.0, 2500.0], 3000.0) == 4000
    assert units.steps_to_fraction([0, 2000], [100.0, 2300.0], 3000.0) is None


@pytest.mark.parametrize("stat, lower, said", [
    ((-2000.0, -3000.0, -1500.0), True, "a better"),   # fewer steps beyond the 1000 margin
    ((200.0, -300.0, 600.0), True, "equivalent"),
    ((-900.0, -1800.0, 100.0), True, "undecided"),
    ((1500.0, 1200.0, 1800.0), True, "b better"),
    ((300.0, float("nan"), float("nan")), False, "too few seeds"),
])
def test_prediction_verdicts_use_the_margin(stat, lower, said):
    assert report.prediction_verdict(stat, 1000.0, lower) == said


def _method(condition: str, method: str, seed: int, final: float, steps: float, falls: float) -> dict:
    curve = [800.0, final / 2, final]
    return {"unit": f"{condition}-{method}-s{seed}", "role": "report", "method": method, "seed": seed,
            "setting": {"condition": condition, "epochs": plan.EPOCHS}, "cpu_s": 300.0,
            "metrics": {"return_at": {str(plan.REAL_STEPS): final, "2000": final / 2}, "steps_to_80_censored": steps,
                        "reached_80": steps < plan.REAL_STEPS, "falls_per_1000": falls, "reference_return": 3000.0,
                        "sac_steps_per_real_step_last_epoch": 2.0},
            "curves": {"real_steps": [0, 6000, plan.REAL_STEPS], "eval_return": curve}}


def test_return_over_the_run_is_the_area_under_the_evaluation_curve():
    record = {"curves": {"real_steps": [0, 2000, 3000, 4000], "eval_return": [100.0, 300.0, 300.0, 0.0]}}
    # (2000 x 200 + 1000 x 300 + 1000 x 150) / 4000: uneven spacing weighs each stretch by its real steps
    assert report.run_mean_return(record) == pytest.approx(212.5)
    assert report.value(record, "run_mean_return") == pytest.approx(212.5)
    assert report.run_mean_return({"curves": {"real_steps": [0], "eval_return": [5.0]}}) is None


def test_the_report_renders_partial_records(tmp_path):
    pretrain = {"unit": "pretrain", "role": "stage", "method": "pretrain", "seed": 0, "setting": {}, "cpu_s": 7000.0,
                "metrics": {"env_steps": 600_000, "updates": 600_000, "learner_cpu_s": 6800.0, "stage2_cpu_s": 60.0,
                            "hold": plan.hold_verdict([2800.0, 2900.0, 2850.0]), "holds": True},
                "curves": {"env_steps": [1, 2, 3], "eval_return": [2800.0, 2900.0, 2850.0]}}
    text = report.report([pretrain], tmp_path)
    assert text.startswith("## ") and "The start model holds" in text and "first objection" in text
    assert "no paired seeds yet" in text
    check = {"unit": "check-start", "role": "gate", "method": "check", "seed": None, "setting": {}, "cpu_s": 60.0,
             "metrics": {"holds": True, "edge_return": 3000.0, "in_range_return": 2900.0, "edge_command": 1.5,
                         "in_range_command": 1.0}}
    gate = {"unit": "gate-command", "role": "gate", "method": "gate", "seed": None, "setting": {}, "cpu_s": 20.0,
            "metrics": {"zero_shot_return": 1200.0, "reference_return": 3000.0, "kept": 0.4, "passed": True},
            "chosen": {"label": "command 2.25 m/s", "env": {}}, "ladder": []}
    methods = [_method("command", "lift", s, 2900.0 + s, 3000.0 + 10 * s, 0.1) for s in (10, 11, 12)]
    methods += [_method("command", "sac_finetune", s, 2000.0 - 5 * s, 9000.0 - 20 * s, 1.5) for s in (10, 11, 12)]
    methods += [_method("nochange", "lift", s, 2800.0, 2000.0, 0.0) for s in (10, 11)]
    text = report.report([pretrain, check, gate, *methods], tmp_path)
    assert "| command 2.25 m/s | 1200 / 3000 (40%) | passed: runs |" in text
    assert "| lift | 3 | 3/3 |" in text and "| sac_finetune | 3 | 3/3 |" in text
    assert "↳ lift, no-change arm | 2 |" in text
    for table in ("**command**", "**nochange**"):  # every row of a condition's table has the header's cells
        rows = [ln for ln in text[text.index(table):].split("\n\n", 2)[1].splitlines() if ln.startswith("|")]
        assert len({ln.count(" | ") for ln in rows if not ln.startswith("|---")}) == 1, rows
    p1 = next(line for line in text.splitlines() if line.startswith("| P1"))
    assert "a better (as predicted)" in p1
    reading = text[text.index("**Reading**"):text.index("Budget:")]
    assert "partial: seeds [10, 11, 12] of [10, 11, 12, 13, 14]" in reading
    assert "P1 (lift - sac_finetune, steps_to_80_censored) -5670.00" in reading and "3 seed(s): **a better**" in reading
    assert "command -1.40" in reading and "P3: no paired seeds yet" in reading
    assert "[reached 80 %: lift 3/3, sac_finetune 3/3]" in reading
    # runs that never reached 80 % count the budget: an "equivalent" of two censored arms says so
    censored = [_method("gear", m, s, 500.0, float(plan.REAL_STEPS), 2.0) for m in ("lift", "sac_finetune")
                for s in (10, 11)]
    reading = report.report([pretrain, check, gate, *methods, *censored], tmp_path).split("**Reading**")[1]
    assert ("P5 (lift - sac_finetune, steps_to_80_censored) +0.00 [+0.00, +0.00] on 2 seed(s): **equivalent** "
            "(against the prediction) [reached 80 %: lift 0/2, sac_finetune 0/2; neither recovered") in reading
    assert "The answer" not in reading, "partial: no answer yet"
    whole = [_method("command", m, s, 2900.0 + s if m == "lift" else 2000.0, 3000.0 if m == "lift" else 9000.0 + s,
                     0.1 if m == "lift" else 1.5 + s / 10) for m in ("lift", "sac_finetune") for s in plan.REPORT_SEEDS]
    reading = report.report([pretrain, check, gate, *whole], tmp_path).split("**Reading**")[1]
    assert ("**The answer.** Fewer real samples than SAC finetuning: command (LIFT's runs that reached 80 %: command "
            "5/5, gear 0/5); ending higher on its own change: yes (P2 a better); fewer falls: command. What carries "
            "it: P3 no paired seeds") in reading
    assert "at the costs measured so far" in text and "over by" not in text
    import dataclasses
    later = report.report([pretrain, check, gate, *methods], tmp_path,
                          dataclasses.replace(report.FRAMING, earlier_core_h=5.0))
    assert "with 5.00 core-h spent before this study" in later and "(**over by" in later
    assert (tmp_path / "lift_command.png").stat().st_size > 5_000
    stopped = {**pretrain, "metrics": {**pretrain["metrics"], "holds": False,
                                       "hold": plan.hold_verdict([1000.0, 2900.0, 2000.0])}}
    text_stopped = report.report([stopped, check], tmp_path)
    assert "does not hold: the study stops here" in text_stopped
    assert "| command | not run: the start model did not hold | - |" in text_stopped
    assert "no prediction verdict" in text_stopped and "| P1" not in text_stopped
    assert "never run (the study stopped)" in text_stopped
    assert (tmp_path / "lift_command_start.png").stat().st_size > 5_000
    assert "The main job's LIFT part, five runs" in text  # the committed tour runs ride with the section


def test_the_tour_runs_count_failures_and_late_recoveries(tmp_path):
    """The main job's LIFT part: a run that never reached 80 % counts as a failure, one at the budget as late."""
    def run(name: str, lift_steps: int | None, lift_final: float) -> dict:
        arm = lambda steps, final: {"real_steps_to_recover": steps, "final_return": final, "falls": 10,  # noqa: E731
                                    "falls_per_1000": 1.0, "real_steps": 7000, "sac_updates": 100}
        return {"run": name, "pretrain_env_steps": 1, "pretrain_best_return": 1000.0, "pre_change_return": 1000.0,
                "zero_shot_return": 5.0, "lift": arm(lift_steps, lift_final), "sac_finetune": arm(2000, 1000.0)}
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"what": "w", "commit": "c", "date": "d", "machine": "m", "task": "t", "rule": "r",
                                "change": {"name": "gravity", "scale": 9.0},
                                "runs": [run("a", 7000, 1000.0), run("b", None, 40.0), run("c", 3000, 1000.0)]}))
    text = "\n".join(report.tour_lines(path))
    assert "LIFT recovered in 2 of 3 runs (1 of them only at the last evaluation" in text
    assert "| b | 1 | 5 | None | 2000 |" in text
    assert report.tour_lines(tmp_path / "absent.json") == []


@pytest.mark.slow
def test_the_stage_and_the_units_run_end_to_end_at_a_tiny_size(tmp_path):
    """The pretraining stage (the learner users run, paused by its deadline and resumed), stage 2 on its Parquet
    replay, then check-start, a gate and a no-change method unit through the runner's inline helper. The tiny start
    model's evaluations cannot hold, so the record is rewritten to a held curve to reach the later units; its own
    verdict is checked first."""
    import json

    from benchmarks.study.runner import run_unit_inline
    from benchmarks.studies.lift_command import STUDY
    tiny = {"learner": {"sac": {"min_replay_size": 128, "batch_size": 32, "num_envs": 4}, "eval_every_steps": 160,
                        "checkpoint_every_updates": 10_000, "parquet_chunk": 128, "total_env_steps": 480},
            "exp": {"wm_pretrain_steps": 20, "wm_eval_every": 10}, "reserve_s": 0.0, "stage2_fit_s": 1.0,
            "gate_episodes": 1, "epochs": 1, "fixed_steps": (100, 200)}
    record = None
    for call in range(6):
        record = run_unit_inline(STUDY, "pretrain", tmp_path, overrides=tiny, call_s=0.01 if call == 0 else 600.0)
        if record is not None:
            break
    assert record is not None and record["metrics"]["env_steps"] == 480 and record["calls"] >= 2
    assert record["metrics"]["hold"]["holds"] is plan.hold_verdict(record["curves"]["eval_return"])["holds"]
    assert record["metrics"]["learner_cpu_s"] > 0 and set(record["metrics"]["stage2"]) == {"physics"}
    path = tmp_path / "lift_command" / "records" / "pretrain.json"
    held = json.loads(path.read_text())
    held["curves"]["eval_return"] = [300.0, 300.0, 300.0]
    path.write_text(json.dumps(held))
    check = run_unit_inline(STUDY, "check-start", tmp_path, overrides=tiny)
    assert check["metrics"]["holds"] and check["metrics"]["edge_return"] > 0
    gate = run_unit_inline(STUDY, "gate-command", tmp_path, overrides=tiny)
    assert gate["metrics"]["reference_return"] == check["metrics"]["edge_return"]
    units_tiny = {**tiny, "exp": {"real_steps_per_epoch": 100, "prefill_steps": 100, "eval_episodes": 1,
                                  "hupt_schedule": [0, 1, 1, 2], "rollout_batch": 32, "wm_retrain_steps": 10}}
    lift = run_unit_inline(STUDY, "nochange-lift-s10", tmp_path, overrides=units_tiny)
    assert lift["curves"]["real_steps"] == [0, 200] and lift["metrics"]["stochastic_requests"] == 0
    assert lift["metrics"]["reference_return"] == check["metrics"]["in_range_return"]
    assert lift["metrics"]["sac_steps_per_real_step_last_epoch"] == pytest.approx(1 * 20 / 100)  # HUPT(0) x 20


def test_the_second_start_model_is_declared_and_stays_within_the_issues_budget():
    """lift_command_warm differs from lift_command only in its pretraining setting (a declared start file, fewer
    steps); both start models together fit issue 47's 6 core-hours; the first study is stopped by its record."""
    from benchmarks.studies.lift_command.stage import declared_file
    from benchmarks.studies.lift_command_warm import plan as warm
    first, second = plan.units(), warm.units()
    assert [u.name for u in first] == [u.name for u in second]
    differ = [u.name for u, v in zip(first, second) if u.setting != v.setting or u.fn != v.fn]
    assert differ == ["pretrain"]
    setting = second[0].setting
    assert setting["env_steps"] == warm.PRETRAIN_STEPS and setting["hold"] == first[0].setting["hold"]
    assert declared_file(setting["init_agent"]).is_file() and warm.within_budget()
    with pytest.raises(ValueError, match="not the declared"):
        declared_file({**setting["init_agent"], "sha256": "0" * 64})
    failed = {"pretrain": {"metrics": {"holds": False, "hold": {"why": "mean 87.7% of the best"}}}}
    assert "did not hold (mean 87.7% of the best)" in plan.stopped(failed)
    assert plan.stopped({}) is None and plan.stopped({"pretrain": {"metrics": {"holds": True}}}) is None


@pytest.mark.slow
def test_the_second_start_model_continues_the_declared_agent(tmp_path):
    """lift_command_warm's pretraining stage starts from the declared agent file: its first evaluation (before any
    update) is the walking policy's, far above what fresh weights reach; the update count carries on from it."""
    import torch

    from benchmarks.study.runner import run_unit_inline
    from benchmarks.studies.lift_command_warm import STUDY, plan as warm
    tiny = {"learner": {"sac": {"min_replay_size": 128, "batch_size": 32, "num_envs": 4}, "eval_every_steps": 160,
                        "eval_episodes": 2, "checkpoint_every_updates": 10_000, "parquet_chunk": 128,
                        "total_env_steps": 160},
            "exp": {"wm_pretrain_steps": 20, "wm_eval_every": 10}, "reserve_s": 0.0, "stage2_fit_s": 1.0}
    record = run_unit_inline(STUDY, "pretrain", tmp_path, overrides=tiny, call_s=600.0)
    assert record is not None and record["metrics"]["env_steps"] == 160
    start = torch.load(Path(__file__).resolve().parents[1] / warm.INIT_AGENT["path"], weights_only=True)
    assert record["metrics"]["updates"] > start["num_updates"]
    assert record["curves"]["eval_return"][0] > 2000, record["curves"]  # fresh weights: < 100 (lift_command's 25)
    assert record["learner"]["init_agent"].endswith(warm.INIT_AGENT["path"])
