"""The E-CIT study (benchmarks/studies/ecit/): a valid plan, and every kind of unit at tiny size through the runner's
inline helper, then the report from those records."""
from __future__ import annotations

import pytest

from benchmarks.study.core import REPORTED_SEEDS
from benchmarks.studies.ecit.plan import CAL_NS, COMBINERS, STUDY, SUBSET_SIZES, TUNE_SEEDS, tuned_setting
from benchmarks.study.runner import run_unit_inline

TINY = {"reps": 3, "tune_n": 240, "n": 240, "full_max_n": 240, "time_full_ns": [120, 240], "time_ecit_ns": [240, 480],
        "time_reps": 1, "time_subset_size": 120, "pc_full_n": 300, "pc_ecit_n": 600,
        "pc_graph": {"d": 4, "degree": 1.5}}


def test_plan_is_valid_and_within_the_seed_rules():
    plan = STUDY.plan()
    assert plan[0].name == "design" and plan[0].role == "stage"
    cal = [u for u in plan if u.name.startswith("cal-")]
    assert sorted({u.seed for u in cal}) == list(REPORTED_SEEDS)
    assert {u.setting["n"] for u in cal} == set(CAL_NS)
    # >= 200 nulls and >= 200 alternatives per n over the reported seeds
    from benchmarks.studies.ecit.plan import REPS
    assert REPS * len(REPORTED_SEEDS) >= 200
    assert sorted(u.seed for u in plan if u.role == "tune") == sorted(list(TUNE_SEEDS) * len(SUBSET_SIZES))
    for u in plan:
        if u.name.startswith(("cal-", "pc-ecit")):
            assert {t.name for t in plan if t.role == "tune"} <= set(u.after)


def test_units_run_tiny_and_the_report_reads_their_records(tmp_path):
    with pytest.raises(Exception, match="runs after design"):
        run_unit_inline(STUDY, "tune-m200-s100", tmp_path, overrides=TINY)
    assert run_unit_inline(STUDY, "design", tmp_path, overrides=TINY)["metrics"]["written"] == 1
    for m in SUBSET_SIZES:
        for s in TUNE_SEEDS:
            rec = run_unit_inline(STUDY, f"tune-m{m}-s{s}", tmp_path, overrides={**TINY, "tune_n": 2 * m})
            assert set(rec["metrics"]) == set(COMBINERS) and rec["metrics"]["fisher"]["null_total"] == 3
    from benchmarks.study.records import load_records
    records = {r["unit"]: r for r in load_records(tmp_path / "ecit" / "records")}
    tuned = tuned_setting(records)
    assert tuned["subset_size"] in SUBSET_SIZES and tuned["combiner"] in COMBINERS
    cal = run_unit_inline(STUDY, f"cal-n{CAL_NS[0]}-s10", tmp_path, overrides=TINY)
    assert cal["n"] == 240 and "full" in cal["metrics"] and cal["metrics"]["full"]["alt_total"] == 3
    assert cal["start_sha"] and cal["tuned"] == tuned
    t = run_unit_inline(STUDY, "time-s10", tmp_path, overrides=TINY)
    assert set(t["curves"]["full"]) == {"120", "240"} and all(v > 0 for v in t["curves"]["ecit"].values())
    full = run_unit_inline(STUDY, "pc-full-s10", tmp_path, overrides=TINY)
    ecit = run_unit_inline(STUDY, "pc-ecit-s10", tmp_path, overrides=TINY)
    assert full["dag"] == ecit["dag"]  # both variants score the same graph
    assert ecit["metrics"]["tests"] > 0 and 0 <= ecit["metrics"]["f1"] <= 1
    control = run_unit_inline(STUDY, "control-fisherz-s10", tmp_path, overrides={**TINY, "control_ns": [480]})
    assert set(control["metrics"]["480"]) == {*COMBINERS, "one_subset", "full"}
    assert len(control["tests"]["480"]["null"][0]) == 480 // tuned["subset_size"]
    from benchmarks.studies.ecit.report import report
    text = report(load_records(tmp_path / "ecit" / "records"), tmp_path / "out")
    assert text.startswith("## E-CIT") and f"| 240 | {tuned['combiner']} (tuned) |" in text
    assert "| full |" in text and (tmp_path / "out" / "ecit_time.png").exists()
    assert "| Fisher-z, linear-Gaussian (control) | 480 |" in text and "| KCI, post-nonlinear t3 (the study) | 240 |" in text
    reading = text.split("### Reading", 1)[1]
    for part in ("**Validity**", "**Why**", "**Control**", "**Power**", "**Cost**", "**PC at about equal CPU**"):
        assert part in reading, part


def test_the_subset_shift_predicts_stouffer_inflation_growing_with_sqrt_k():
    """Uniform subset p-values give a mean z of 0 and the level; p-values pushed slightly towards 0 (z shifted by
    0.15) pass one subset's 5 % tail nearly unchanged, yet predict a Stouffer type-I error that grows with K, as the
    simulated one does."""
    import numpy as np
    from scipy.stats import norm

    from benchmarks.studies.ecit.report import subset_null_shift
    rng = np.random.default_rng(0)
    uniform = subset_null_shift(rng.uniform(size=(4000, 10)).tolist())
    assert abs(uniform["mean"]) < 0.02 and abs(uniform["predicted_stouffer"] - 0.05) < 0.01
    for k in (10, 160):
        z = rng.normal(0.15, 1.0, size=(2000, k))
        shifted = subset_null_shift(norm.sf(z).tolist())
        simulated = float(np.mean(z.sum(axis=1) / np.sqrt(k) > norm.isf(0.05)))
        assert shifted["low"] < 0.15 < shifted["high"]
        assert abs(shifted["predicted_stouffer"] - simulated) < 0.04, (k, shifted, simulated)
    assert shifted["predicted_stouffer"] > 0.5 and shifted["share_below_level"] < 0.08
