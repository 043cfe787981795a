"""The LIFT study (benchmarks/study/lift.py): its plan is valid, and one unit of each kind (the pretraining stage,
resumed from its checkpoint; a gate; tuning and reported method units; the report) runs at tiny size through the
runner's inline helper."""
from __future__ import annotations

import importlib
import json
import re

import pytest

from benchmarks.study.core import REPORTED_SEEDS
from benchmarks.study.lift import (APPENDIX_CHANGES, APPENDIX_METHODS, CHANGES, GRID, MAIN_METHODS, STUDY,
                                   TUNE_SEEDS, tune_name)
from benchmarks.study.runner import run_unit_inline
from experiments.lift.finetune_config import METHOD_SPECS

TINY = {"pretrain_steps": 640, "chunk_steps": 320, "pretrain_eval_every": 320, "wm_rows": 640,
        "preset_overrides": {"sac": {"min_replay_size": 256, "batch_size": 64}},
        "exp": {"wm_pretrain_steps": 30, "wm_retrain_steps": 10, "wm_eval_every": 10, "real_steps_per_epoch": 100,
                "eval_episodes": 1, "hupt_schedule": [0, 1, 1, 2], "rollout_batch": 32},
        "gate_episodes": 1, "epochs": 2}


def test_plan_is_valid():
    plan = STUDY.plan()  # unique names, every `after` listed earlier
    by_name = {u.name: u for u in plan}
    assert plan[0].role == "stage" and plan[0].name == "pretrain"
    for u in plan:
        module, fn = u.fn.split(":")
        assert callable(getattr(importlib.import_module(module), fn))
        if u.role in ("tune", "report"):
            assert u.method in METHOD_SPECS
            assert f"gate-{u.setting['change']}" in u.after
        if u.role == "tune":
            assert u.seed >= 100 and u.seed in TUNE_SEEDS
        if u.role == "report":
            assert u.seed in REPORTED_SEEDS
            tuned_by = u.setting["tuned_by"]
            assert {tune_name(tuned_by, i, s) for i in range(len(GRID)) for s in TUNE_SEEDS} <= set(u.after)
            assert all(by_name[a].role in ("gate", "tune") for a in u.after)
    for c in CHANGES:
        for m in MAIN_METHODS:
            seeds = sorted(u.seed for u in plan if u.role == "report" and u.method == m and u.setting["change"] == c)
            assert seeds == list(REPORTED_SEEDS), (c, m, seeds)
        for m in APPENDIX_METHODS:
            expected = [10, 11] if c in APPENDIX_CHANGES else []
            assert sorted(u.seed for u in plan if u.method == m and u.setting["change"] == c) == expected
    # the 2x2 is complete: model x deterministic real actions, at LIFT's update count where model-free
    cells = {(METHOD_SPECS[m].model is not None, METHOD_SPECS[m].deterministic_real) for m in MAIN_METHODS}
    assert cells == {(True, True), (True, False), (False, True), (False, False)}
    assert sum(u.est_core_s for u in plan) / 3600 < 4.0


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    """A tiny pretraining (two chunks) in a private results folder, shared by the tests below."""
    root = tmp_path_factory.mktemp("results")
    first = run_unit_inline(STUDY, "pretrain", root, overrides=TINY)
    assert first is None  # the first chunk checkpointed and asks to be called again
    artifacts = root / "lift" / "records" / "artifacts"
    assert (artifacts / "pretrain" / "checkpoint.pt").exists() and not (artifacts / "pretrain" / "agent.pt").exists()
    record = run_unit_inline(STUDY, "pretrain", root, overrides=TINY)
    return root, record


def test_pretraining_stage_resumes_and_makes_the_start_model(tiny_study):
    root, record = tiny_study
    artifacts = root / "lift" / "records" / "artifacts"
    m = record["metrics"]
    assert m["env_steps"] == 640 and m["chunks"] == 2 and m["replay_refills"] == 0  # resumed with its replay
    assert record["curves"]["env_steps"][-1] == 640
    assert all(p.exists() for p in STUDY.start_files(artifacts))
    assert not (artifacts / "pretrain" / "checkpoint.pt").exists()
    assert set(m["stage2"]) == {"physics", "blackbox", "prior_only", "residual_only"}
    assert record["calls"] == 2


@pytest.mark.slow
def test_gate_and_method_units_and_report(tiny_study):
    root, _ = tiny_study
    gate = run_unit_inline(STUDY, "gate-friction", root, overrides=TINY)
    assert gate["start_sha"] and gate["chosen"]["env"]["friction"]["scale"] in (0.3, 0.2, 0.1)
    assert gate["metrics"]["kept"] < 0.8 or gate["metrics"]["too_weak"]
    tried = [t["kept"] for t in gate["ladder"]]
    assert all(k >= 0.8 for k in tried[:-1])  # every rung before the chosen one kept >= 80 %
    scores = {}
    for method in ("lift", "sac_finetune"):
        for i in range(len(GRID)):
            r = run_unit_inline(STUDY, tune_name(method, i, 100), root, overrides=TINY)
            scores[(method, i)] = r["metrics"]["mean_return"]
            assert r["coefficients"] == GRID[i]
    lift = run_unit_inline(STUDY, "friction-lift-s10", root, overrides=TINY)
    sac = run_unit_inline(STUDY, "friction-sac_finetune-s10", root, overrides=TINY)
    for rec, method in ((lift, "lift"), (sac, "sac_finetune")):
        best = max(range(len(GRID)), key=lambda i: scores[(method, i)])
        assert rec["choice"]["grid_index"] == best and rec["coefficients"] == GRID[best]
        assert rec["curves"]["real_steps"] == [0, 100, 200]
        assert rec["metrics"]["real_steps"] == 200
        assert rec["metrics"]["pre_change_return"] == gate["metrics"]["pre_change_return"]
    # counted by the real env's sampler: LIFT's real env only ever got deterministic actions
    assert lift["metrics"]["stochastic_requests"] == 0
    assert sac["metrics"]["stochastic_requests"] >= 2
    assert lift["metrics"]["wm_heldout_1step_mean"] is not None and sac["metrics"]["wm_heldout_1step_mean"] is None
    json.dumps(lift)

    from benchmarks.study.lift import report
    from benchmarks.study.records import load_records
    out = root / "lift" / "records"
    text = report(load_records(out), out)
    assert text.startswith("## ")
    assert "| lift | 1 |" in text and "| sac_finetune | 1 |" in text and "friction x" in text
    assert (out / "lift_study.png").stat().st_size > 10_000


def test_the_reading_separates_lift_from_its_matched_control():
    """Synthetic records: LIFT falls less than every other cell on 5 seeds; real steps tie. The reading says LIFT
    falls less than SAC finetuning and than the matched control, the tie is no claim, and the 2x2 sees the
    model and determinism both cut falls (only their joint cell is low: an interaction)."""
    from benchmarks.lift_finetune_stats import _overall, _reading, two_by_two
    falls = {"lift": 1.0, "sac_finetune": 3.0, "sac_finetune_matched": 3.0, "lift_stochastic": 3.0,
             "sac_deterministic": 3.0}
    records = [{"role": "report", "method": m, "seed": s, "setting": {"change": "friction"},
                "metrics": {"real_steps_to_recover_censored": 4000.0, "falls_per_1000": f + 0.1 * ((s * 7 + i) % 3),
                            "final_return": 500.0}}
               for i, (m, f) in enumerate(falls.items()) for s in range(10, 15)]
    effects = {k: two_by_two(records, "friction", k) for k in ("real_steps_to_recover_censored", "falls_per_1000")}
    tally: dict = {}
    line = _reading(records, "friction", "friction x0.1", effects, 5, tally)
    assert "LIFT − sac_finetune: real steps to 80 % 0 [0, 0] n.s. (neither recovered" in line
    assert re.search(r"falls per 1000 -(1\.9|2\.0)\d \[-\d\.\d\d, -\d\.\d\d\] LIFT better", line), line
    overall = " ".join(_overall(tally, 1))
    assert "Over the 1 change**" in overall
    assert "fewer real steps than SAC finetuning in 0 of 1 and falls less in 1 of 1 (friction x0.1)" in overall
    assert "fewer falls in 1 of 1 (friction x0.1)" in overall
    assert "cuts falls in 1 of 1 (friction x0.1)" in overall
