"""The vidd_budget study (benchmarks/studies/vidd_budget, issue 37): a valid plan within its core-hours, the primary and
predictions named in code, the tuning rule over lr x alpha, refusal without tuning records, a tiny unit that records
the diagnostics, and the report on synthetic records."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.study import STUDIES
from benchmarks.study.core import REPORTED_SEEDS, StudyError
from benchmarks.study.runner import run_unit_inline
from benchmarks.studies.vidd_budget import plan as vb_plan, report as vb_report, units as vb_units

torch.set_num_threads(1)

TINY = dict(n_train=300, n_heldout=50, d_model=32, n_layers=1, n_heads=2, pretrain_steps=30, T=4, budget=320,
            tune_budget=160, batch_size=4, ddpo_steps=2, eval_samples=32, curve_samples=16, best_of_n_max=4,
            min_refreshes=2, seq_len=40)


def test_plan_is_registered_valid_and_within_budget():
    assert STUDIES["vidd_budget"] == "benchmarks.studies.vidd_budget:STUDY"
    plan = vb_plan.STUDY.plan()
    names = {u.name for u in plan}
    assert len(names) == len(plan)
    assert vb_plan.PRIMARY == "vidd_official" and vb_plan.PRIMARY in vb_plan.METHODS and len(vb_plan.PREDICTIONS) >= 3
    assert {"vidd_official", "vidd_alg1", "standard_ft_official", "ddpo", "rw_mle", "ddpp"} == set(vb_plan.METHODS)
    # the released DDPO: an appendix whose units all come after the declared table's
    order = [u.name for u in plan]
    first = min(i for i, n in enumerate(order) if "ddpo_official" in n)
    assert all("ddpo_official" in n for n in order[first:]) and sum("ddpo_official-s" in n for n in order) == 5
    assert vb_plan.method_config(None, "ddpo_official", 1e-3, None, 4096).ddpo_variant == "official"
    for method in vb_plan.METHODS:
        tune = [u for u in plan if u.role == "tune" and u.method == method]
        assert {u.seed for u in tune} == set(vb_plan.TUNE_SEEDS) and len(vb_plan.TUNE_SEEDS) == 2
        cells = sorted((u.setting["lr"], u.setting["alpha"] or 0) for u in tune)
        assert len(cells) == len(vb_plan.grid_of(method)) * 2
        for seed in REPORTED_SEEDS:
            (rep,) = [u for u in plan if u.name == f"{method}-s{seed}"]
            assert {u.name for u in tune} <= set(rep.after)
    total_h = sum(u.est_core_s for u in plan) / 3600
    assert 2.0 <= total_h <= 5.2, total_h  # ~4 core-h (issue 37) + the released-DDPO appendix (~0.9)
    # the evaluation points are 2k, 4k, 8k and 16k queries
    assert [int(f * vb_plan.SIZES["budget"]) for f in vb_plan.FRACTIONS] == [2048, 4096, 8192, 16384]


def test_official_defaults_in_every_method_config():
    for method in vb_plan.METHODS:
        lr, alpha = vb_plan.grid_of(method)[0]
        cfg = vb_plan.method_config(None, method, lr, alpha, 2048)
        assert cfg.updates_per_batch == 1 and not cfg.self_normalize_weights and not cfg.exact_teacher_term
        assert cfg.lr == lr and cfg.query_budget == 2048
    official = vb_plan.method_config(None, "vidd_official", 1e-4, 0.1, 2048)
    assert official.value_scheme == "official" and official.timesteps_per_trajectory is None and official.alpha == 0.1
    assert vb_plan.method_config(None, "vidd_alg1", 1e-4, 0.1, 2048).value_model == "teacher"


def test_tuning_rule_and_refusal():
    cells = {(1e-4, 0.1): dict(reward_median=0.3, nll=100.0, validity=1.0, uniqueness=1.0),
             (1e-3, 0.1): dict(reward_median=0.5, nll=200.0, validity=1.0, uniqueness=1.0),
             (1e-3, 0.03): dict(reward_median=0.4, nll=110.0, validity=1.0, uniqueness=1.0)}
    assert vb_units.select_cell(cells, ceiling=125.0) == ((1e-3, 0.03), True)
    assert vb_units.select_cell(cells, ceiling=50.0) == ((1e-4, 0.1), False)
    with pytest.raises(StudyError, match="no tuning record"):
        vb_units.tuning_cells("vidd_official", {})


def synthetic_records(gain: float, drop: set[str] = frozenset()) -> list[dict]:
    rng = np.random.default_rng(0)
    out = [{"unit": "pretrain", "role": "stage", "metrics": {"pretrained": {"nll": 100.0, "reward_median": 0.05}}}]
    for u in vb_plan.STUDY.plan():
        if u.role != "report" or u.name in drop:
            continue
        if u.method == "best_of_n":
            pts = [{"N": n, "reward_median": 0.05 + 0.01 * np.log2(n)} for n in (1, 2, 4, 8, 16, 32, 64)]
            out.append({"unit": u.name, "role": "report", "metrics": {"n_samples": 128}, "points": pts})
            continue
        base = 0.1 + (gain if u.method == vb_plan.PRIMARY else 0.0)
        curve = [base * f + rng.normal(0, 0.002) for f in (1, 2, 3, 4)]
        out.append({"unit": u.name, "role": "report", "config": {"query_budget": 16384},
                    "metrics": {"nll": 90.0 + rng.normal(0, 0.5)},
                    "curves": {"queries": [2048, 4096, 8192, 16384], "reward_median": curve},
                    "diagnostics": {"transitions_per_iteration": 250.0, "transitions_per_refresh": 1250.0,
                                    "weight_ess": 40.0, "weight_ess_fraction": 0.16, "weight_abs_dev_mean": 0.7,
                                    "group_size_min": 14.0},
                    "tuning": {"chosen": {"lr": 1e-4, "alpha": 0.1}, "qualified": True}})
    return out


def test_report_on_synthetic_records(tmp_path):
    text = vb_report.report(synthetic_records(0.05), tmp_path)
    assert text.startswith("## ") and "35/35 reported units" in text and "Partial" not in text
    assert "| vidd_official (primary) |" in text and "reward @2048" in text and "reward @16384" in text
    assert "(N=16)" in text and "(N=128 cut)" in text  # best-of-N at equal queries per output sample
    assert "| vidd_official | 250.00 | 1250.00 | 40.00 |" in text
    reading = text.split("### Reading")[1]
    # the primary is ahead of DDPO by 0.05 x the evaluation point's factor: a positive interval at 16k
    line = next(ln for ln in reading.splitlines() if "- ddpo" in ln)
    assert "16384: +0.2" in line, line
    assert "P1:" in text and "Gate:" in text
    verdicts = {ln[2:4]: ln.rsplit(": ", 1)[-1] for ln in reading.splitlines() if ln.startswith("- P")}
    # the primary leads every method (P4) and the pretrained best-of-1 (P1); DDPO never leads it (P2), and the signed
    # gap DDPO - primary falls from 2k to 16k as the primary's lead grows (P3, read as declared: a smaller gap)
    assert verdicts == {"P1": "holds.", "P2": "does not hold.", "P3": "holds.", "P4": "holds."}, verdicts
    assert "**Gate** (" in reading and "passed" in reading
    assert "Does VIDD beat DDPO and RW-MLE at a lower NLL at any budget here?" in reading
    assert "vidd_official - ddpo_official:" in reading  # the appendix joins the comparisons once all its seeds are in
    partial = vb_report.report(synthetic_records(0.0, drop={"ddpo-s12"}), tmp_path)
    assert "34/35" in partial and "Partial" in partial and "### Reading" not in partial


@pytest.mark.slow
def test_tiny_units_record_diagnostics(tmp_path):
    assert run_unit_inline("vidd_budget", "pretrain", tmp_path, overrides=TINY) is not None
    rec = run_unit_inline("vidd_budget", "tune-vidd_official-lr0.001-a0.1-s100", tmp_path, overrides=TINY)
    m, d = rec["metrics"], rec["diagnostics"]
    assert m["queries"] <= TINY["tune_budget"] and m["lr"] == 1e-3 and m["alpha"] == 0.1
    assert rec["config"]["value_scheme"] == "official" and rec["config"]["timesteps_per_trajectory"] is None
    assert d["transitions_per_iteration"] > TINY["batch_size"] and d["transitions_per_refresh"] > 0
    assert 0 < d["weight_ess_fraction"] <= 1 and d["weight_abs_dev_mean"] >= 0 and d["group_size_min"] >= 1
    with pytest.raises(StudyError, match="no record yet"):  # a reported unit waits for its tuning records
        run_unit_inline("vidd_budget", "vidd_official-s10", tmp_path, overrides=TINY)
    for lr, alpha in vb_plan.grid_of("vidd_official"):
        for seed in vb_plan.TUNE_SEEDS:
            name = vb_plan.tune_name("vidd_official", lr, alpha, seed)
            if name != "tune-vidd_official-lr0.001-a0.1-s100":
                assert run_unit_inline("vidd_budget", name, tmp_path, overrides=TINY) is not None
    rec = run_unit_inline("vidd_budget", "vidd_official-s10", tmp_path, overrides=TINY)
    chosen = rec["tuning"]["chosen"]
    assert (rec["metrics"]["lr"], rec["metrics"]["alpha"]) == (chosen["lr"], chosen["alpha"])
    assert len(rec["tuning"]["grid"]) == 4
    # evaluated at 1/8, 1/4, 1/2 of the budget and at its end
    assert len(rec["curves"]["queries"]) == 4 and rec["curves"]["queries"][-1] == rec["metrics"]["queries"]
    assert rec["metrics"]["teacher_refreshes"] >= TINY["min_refreshes"]


def test_molecule_check_plan_and_report(tmp_path):
    from benchmarks.studies.vidd_budget_molecule import plan as vm_plan, report as vm_report
    assert STUDIES["vidd_budget_molecule"] == "benchmarks.studies.vidd_budget_molecule:STUDY"
    plan = vm_plan.STUDY.plan()
    assert {u.name for u in plan if u.role == "report"} == {f"{m}-s{s}" for m in (vb_plan.PRIMARY, "ddpo")
                                                             for s in vm_plan.SEEDS}
    assert sum(u.est_core_s for u in plan) / 3600 <= 0.2
    assert all("lr" in u.setting for u in plan if u.role == "report")  # fixed before any unit: no tuning
    recs = [{"unit": "pretrain", "metrics": {"pretrained": {"reward_median": 0.5, "nll": 40.0}}}]
    for u in plan[1:]:
        top = 0.7 if u.method == "ddpo" else 0.6
        recs.append({"unit": u.name, "metrics": {"nll": 41.0}, "curves": {"reward_median": [0.5, 0.55, 0.58, top]}})
    text = vm_report.report(recs, tmp_path)
    assert "4/4 units" in text and "| vidd_official | 10 | 0.500 | 0.550 | 0.580 | 0.600 | 41.0 |" in text
    assert "DDPO - vidd_official in median QED at 16384: +0.100" in text


@pytest.mark.slow
def test_molecule_check_unit_runs_without_tuning(tmp_path):
    tiny = {**TINY, "seq_len": 24}
    assert run_unit_inline("vidd_budget_molecule", "pretrain", tmp_path, overrides=tiny) is not None
    rec = run_unit_inline("vidd_budget_molecule", "vidd_official-s10", tmp_path, overrides=tiny)
    assert rec["tuning"]["fixed"] and rec["metrics"]["lr"] == 1e-4 and len(rec["curves"]["reward_median"]) == 4
    assert rec["config"]["value_scheme"] == "official" and rec["diagnostics"]["transitions_per_iteration"] > 0
