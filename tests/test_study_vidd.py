"""The VIDD studies (benchmarks/study/vidd_molecule.py, vidd_dna.py; issue 24): a valid plan, the tuning rule, the
refusal of reported units without tuning records, a resumable pretraining stage, and units run at tiny size through the
runner's inline helper."""
from __future__ import annotations

import importlib
import time

import pytest
import torch

from benchmarks.study.core import REPORTED_SEEDS, StudyError, UnitContext
from benchmarks.study.records import load_records, sha256_files
from benchmarks.study.runner import run_unit_inline
from benchmarks.study.vidd_common import (BUNDLE, CHECKPOINT, GRID, PRIMARY, TUNE_SEEDS, VARIANTS, finetune_unit,
                                          planned_counts, select_lr)

torch.set_num_threads(1)

STUDIES = ("vidd_molecule", "vidd_dna")
TINY = dict(n_train=300, n_heldout=50, d_model=32, n_layers=1, n_heads=2, pretrain_steps=30, T=4, budget=320,
            batch_size=4, vidd_steps=2, ddpo_steps=2, eval_samples=32, curve_samples=16, best_of_n_max=4,
            min_iterations=10, min_refreshes=2, seq_len=40)


def module(name: str):
    return importlib.import_module(f"benchmarks.study.{name}")


@pytest.mark.parametrize("name", STUDIES)
def test_plan_is_valid(name):
    mod = module(name)
    plan = mod.STUDY.plan()  # unique names, dependencies listed earlier
    names = {u.name for u in plan}
    assert len(names) == len(plan)
    assert [u.name for u in plan if u.role == "stage"] == ["pretrain"]
    assert {u.seed for u in plan if u.role == "report"} == set(REPORTED_SEEDS)
    assert all(u.seed >= 100 for u in plan if u.role == "tune")
    for u in plan:
        assert set(u.after) <= names
        module_name, fn = u.fn.split(":")
        assert callable(getattr(importlib.import_module(module_name), fn))
    assert PRIMARY in mod.SPEC.variants
    for variant in mod.SPEC.variants:
        tune = [u for u in plan if u.role == "tune" and u.method == variant]
        # the same grid for every method, on the tuning seeds only
        assert sorted(u.setting["lr"] for u in tune) == sorted(GRID * len(TUNE_SEEDS))
        for seed in REPORTED_SEEDS:
            (rep,) = [u for u in plan if u.name == f"{variant}-s{seed}"]
            assert {u.name for u in tune} <= set(rep.after)  # reported only after its own tuning
        if VARIANTS[variant].family == "vidd":  # the budget buys the iterations and refreshes the study asserts
            iterations, refreshes = planned_counts(mod.SPEC, VARIANTS[variant])
            assert iterations >= mod.SPEC.sizes["min_iterations"] >= 30
            assert refreshes >= mod.SPEC.sizes["min_refreshes"] >= 6
    assert {u.name for u in plan if u.method == "best_of_n"} == {f"best_of_n-s{s}" for s in REPORTED_SEEDS}
    assert all(u.est_core_s <= 20 * 60 for u in plan if u.role != "stage")  # every unit <= 20 min of one core


def test_both_studies_fit_four_core_hours():
    total = sum(u.est_core_s for name in STUDIES for u in module(name).STUDY.plan())
    assert total / 3600 <= 4.0, f"{total / 3600:.2f} core-hours"


def test_dna_refreshes_at_least_ten():
    spec = module("vidd_dna").SPEC
    assert spec.sizes["min_refreshes"] >= 10
    assert planned_counts(spec, VARIANTS[PRIMARY])[1] >= 10


def test_tuning_rule_respects_the_nll_ceiling():
    rows = {3e-4: dict(reward_median=0.40, nll=70.0, validity=1.0, uniqueness=1.0),
            1e-3: dict(reward_median=0.50, nll=80.0, validity=1.0, uniqueness=1.0),
            3e-3: dict(reward_median=0.90, nll=120.0, validity=1.0, uniqueness=1.0)}  # over the ceiling
    assert select_lr(rows, ceiling=90.0) == (1e-3, True)
    rows[1e-3]["validity"] = 0.5  # below the validity floor
    assert select_lr(rows, ceiling=90.0) == (3e-4, True)
    assert select_lr(rows, ceiling=60.0) == (3e-4, False)  # none qualifies: the lowest NLL


@pytest.mark.parametrize("name", STUDIES)
def test_reported_unit_refuses_without_tuning_records(name, tmp_path):
    mod = module(name)
    unit = next(u for u in mod.STUDY.plan() if u.name == f"{PRIMARY}-s10")
    ctx = UnitContext(study=name, unit=unit, results_dir=tmp_path, work_dir=tmp_path / "work", start_sha=None,
                      deadline=time.monotonic() + 60)
    with pytest.raises(StudyError, match=f"{PRIMARY} has no tuning record tune-{PRIMARY}-lr"):
        finetune_unit(ctx)


def test_pretrain_stage_resumes_to_the_same_model(tmp_path):
    """Checkpointed every 10 steps (three calls) gives the same denoiser as one call."""
    whole = run_unit_inline("vidd_molecule", "pretrain", tmp_path / "whole", overrides=TINY)
    assert whole is not None and whole["calls"] == 1
    calls = 0
    while (record := run_unit_inline("vidd_molecule", "pretrain", tmp_path / "chunked",
                                     overrides={**TINY, "stage_steps_per_call": 10})) is None:
        calls += 1
        assert (tmp_path / "chunked" / "vidd_molecule" / "records" / "artifacts" / CHECKPOINT).is_file()
    assert calls == 2 and record["calls"] == 3
    a, b = (torch.load(tmp_path / run / "vidd_molecule" / "records" / "artifacts" / BUNDLE, weights_only=False, map_location="cpu")
            for run in ("whole", "chunked"))
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    assert a["curve"] == b["curve"]


@pytest.mark.parametrize("name", STUDIES)
def test_units_run_at_tiny_size(name, tmp_path):
    mod = module(name)
    assert run_unit_inline(name, "pretrain", tmp_path, overrides=TINY) is not None
    out = tmp_path / name / "records"
    sha = sha256_files(mod.STUDY.start_files(out / "artifacts"))
    for lr in GRID if name == "vidd_molecule" else GRID[:1]:  # DNA: one tuning unit and best-of-N (time)
        rec = run_unit_inline(name, f"tune-{PRIMARY}-lr{lr:g}-s100", tmp_path, overrides=TINY)
        assert rec["start_sha"] == sha
        m = rec["metrics"]
        assert m["queries"] <= TINY["budget"] and m["lr"] == lr
        assert m["iterations"] >= TINY["min_iterations"] and m["teacher_refreshes"] >= TINY["min_refreshes"]
        assert m["n_samples"] == TINY["eval_samples"] and 0 <= m["validity"] <= 1
        if name == "vidd_dna":
            assert {"eval_reward_median", "kmer3_corr"} <= set(m)
    if name == "vidd_molecule":  # a reported unit: the lr its tuning chose, curve points at 1/4 and 1/2 of the budget
        rec = run_unit_inline(name, f"{PRIMARY}-s10", tmp_path, overrides=TINY)
        assert rec["tuning"]["chosen"] == rec["metrics"]["lr"]
        assert set(rec["tuning"]["grid"]) == {f"{v:g}" for v in GRID}
        assert len(rec["curves"]["queries"]) == 3 and rec["curves"]["queries"][-1] == rec["metrics"]["queries"]
    bon = run_unit_inline(name, "best_of_n-s10", tmp_path, overrides=TINY)
    assert bon["curves"]["N"] == [1, 2, 4] and bon["metrics"]["queries_per_output_sample"] == 4
    assert bon["curves"]["reward_median"][-1] >= bon["curves"]["reward_median"][0]
    section = mod.report(load_records(out), out)
    assert section.startswith("## ") and f"| {PRIMARY} |" in section and "no claim is read" in section
    assert (out / "vidd_curves.png").is_file()


def fake_records(name: str, primary_gain: float) -> list[dict]:
    """Records of every unit of the plan (no model): the primary ahead of every method by ``primary_gain`` in median
    reward and 10 nats lower in NLL, seed noise small."""
    import numpy as np
    rng = np.random.default_rng(0)
    plan = module(name).STUDY.plan()
    out = []
    for u in plan:
        base = dict(reward_median=0.4 + rng.normal(0, 0.005), reward_top10=0.6, nll=80.0 + rng.normal(0, 0.5),
                    diversity=0.9, validity=1.0, uniqueness=1.0, eval_reward_median=0.3, kmer3_corr=0.8)
        if u.role == "stage":
            out.append({"unit": u.name, "role": "stage", "metrics": {"heldout_nelbo_before": 130.0,
                                                                    "heldout_nelbo_after": 60.0,
                                                                    "pretrained": {**base, "nll": 70.0}}})
            continue
        if u.method == "best_of_n":
            points = [{"N": n, **base} for n in (1, 2, 4, 8, 16, 32)]
            out.append({"unit": u.name, "role": u.role, "seed": u.seed, "start_sha": "ab" * 32,
                        "metrics": {**base, "queries_per_output_sample": 32.0, "queries": 0},
                        "pretrained": points[0], "points": points,
                        "curves": {"N": [p["N"] for p in points], "reward_median": [p["reward_median"] for p in points],
                                   "nll": [p["nll"] for p in points]}})
            continue
        m = dict(base, lr=u.setting.get("lr", GRID[1]), queries=4096, iterations=50, teacher_refreshes=10,
                 trajectories=800, queries_per_output_sample=16.0)
        if u.method == PRIMARY:
            m.update(reward_median=m["reward_median"] + primary_gain, nll=m["nll"] - 10.0)
        out.append({"unit": u.name, "role": u.role, "seed": u.seed, "start_sha": "ab" * 32, "metrics": m,
                    "curves": {"queries": [1024, 2048, 4096], "reward_median": [m["reward_median"]] * 3,
                               "nll": [m["nll"]] * 3}})
    return out


@pytest.mark.parametrize("gain, expected", [(0.1, "is reproduced here"), (-0.1, "is not reproduced here")])
def test_report_reads_the_verdicts(gain, expected, tmp_path):
    section = module("vidd_molecule").report(fake_records("vidd_molecule", gain), tmp_path)
    assert "no claim is read" not in section and expected in section
    if gain > 0:
        assert "higher reward and lower NLL against ddpo, ddpp, rw_mle, standard_ft" in section
    else:
        assert "lower reward against ddpo, ddpp, rw_mle, standard_ft" in section
    assert "| ddpo | 5 |" in section and (tmp_path / "vidd_curves.png").is_file()
