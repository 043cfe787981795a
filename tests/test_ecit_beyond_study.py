"""The ecit_beyond study (benchmarks/studies/ecit_beyond/, issue 42): a valid plan declared before any unit, every
kind of unit at tiny size through the runner's inline helper, and the report on synthetic records."""
from __future__ import annotations

import importlib
import importlib.metadata

import numpy as np
import pytest

from benchmarks.study.core import REPORTED_SEEDS
from benchmarks.studies.ecit_beyond.plan import COMBINERS, M, SACHS_METHODS, STUDY, SUBTESTS, TUNED, TYPEI
from benchmarks.studies.ecit_beyond.report import report
from benchmarks.study.ecit_data import null_shift

TINY = {"null_reps": 2, "null_sim_reps": 2, "null_m": 120, "m": 120, "typei_reps": (2, 1), "sachs_n": 300, "sachs_m": 100,
        "sachs_max_k": 0, "sachs_kci_budget_s": 600.0}


def test_plan_is_declared_valid_and_reuses_the_ecit_studys_subsets():
    plan = STUDY.plan()
    assert plan[0].name == "design" and plan[0].role == "stage"
    assert all(u.role == "stage" or u.after == ("design",) for u in plan)
    typei = [u for u in plan if u.name.startswith("typei-")]
    assert {u.setting["n"] for u in typei} == set(TYPEI) and sorted({u.seed for u in typei}) == list(REPORTED_SEEDS)
    assert sorted(n // M for n in TYPEI) == [10, 40, 160]
    assert {u.setting["method"] for u in plan if u.name.startswith("sachs-")} == set(SACHS_METHODS)
    assert 1.0 < sum(u.est_core_s for u in plan) / 3600 < 3.0
    # the same datasets and subsets as the E-CIT study's calibration units: its data and split seeds
    from benchmarks.studies.ecit import plan as ecit_plan
    from benchmarks.studies.ecit_beyond import units as beyond_units
    from benchmarks.study import ecit_data
    assert beyond_units.DATA is ecit_data.DATA and COMBINERS[TUNED] == ecit_plan.COMBINERS[TUNED]


@pytest.mark.slow
def test_units_run_tiny_and_the_report_reads_their_records(tmp_path):
    from benchmarks.study.records import load_records
    from benchmarks.study.runner import run_unit_inline
    assert run_unit_inline(STUDY, "design", tmp_path, overrides=TINY)["metrics"]["written"] == 1
    null = run_unit_inline(STUDY, "null-s10", tmp_path, overrides=TINY)
    assert set(null["tests"]) == {"1", "2"} and len(null["tests"]["1"]["kci_lp"]["p"]) == 2
    assert len(null["tests"]["1"]["kci_sim"]["p"]) == 2 and not null["tests"]["2"]["kci_sim"]["p"]
    ti = run_unit_inline(STUDY, f"typei-n{min(TYPEI)}-s10", tmp_path, overrides={**TINY, "n": 360})
    assert ti["k"] == 3 and set(ti["metrics"]) == set(SUBTESTS)
    assert set(ti["metrics"]["kci_lp"]) == {*COMBINERS, "cpu_s_per_subset"}
    assert ti["metrics"]["kci"]["binomial0.05"]["null_total"] == 2 and ti["metrics"]["kci"]["fisher"]["alt_total"] == 1
    # the kci column is the E-CIT study's subset p-values of the same datasets and split seeds
    from benchmarks.study.ecit_data import _seed, _subset_pvalues, _triplet
    again, _ = _subset_pvalues(_triplet(10, 360, 0, False), 120, _seed(10, 360, 0, 0, 1), "kci")
    assert ti["tests"]["kci"]["null"][0] == again
    if _has_cdt():
        for method in SACHS_METHODS:
            rec = run_unit_inline(STUDY, f"sachs-{method}-s10", tmp_path, overrides=TINY)
            assert rec["metrics"]["fit"] and 0 <= rec["metrics"]["f1"] <= 1 and rec["metrics"]["n"] == 300
    text = report(load_records(tmp_path / "ecit_beyond" / "records"), tmp_path / "out")
    assert text.startswith("## E-CIT beyond") and "| triplet, dz = 1 | kci_lp |" in text
    assert "| triplet, dz = 1 | kci_sim |" in text and "| triplet, dz = 2 | kci_sim |" not in text
    assert f"| 360 | 3 | kci_lp | {TUNED} (tuned) |" in text and "### Reading" in text


def _has_cdt() -> bool:
    try:
        importlib.metadata.distribution("cdt")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def _record(unit: str, seed: int, **body) -> dict:
    return {"unit": unit, "role": "report", "seed": seed, "cpu_s": 1.0, **body}


def _typei_record(n: int, seed: int, rng: np.random.Generator, shift: dict[str, float]) -> dict:
    """A synthetic type-I record: per sub-test, subset p-values with z ~ N(shift, 1), or (shift None) an evenly
    spread grid (uniform without sampling noise), and its rejection counts."""
    from benchmarks.studies.ecit_beyond.units import rejections
    k = n // M

    def subsets(s):
        return (1 - _ncdf(rng.normal(s, 1.0, k))).tolist() if s is not None else \
            rng.permutation((np.arange(k) + 0.5) / k).tolist()
    tests = {sub: {"null": [subsets(shift[sub]) for _ in range(40)], "alt": [], "cpu_s": [0.1]} for sub in SUBTESTS}
    metrics = {sub: {c: rejections(t, c) for c in COMBINERS} | {"cpu_s_per_subset": 0.1 if sub == "kci" else 0.2}
               for sub, t in tests.items()}
    return _record(f"typei-n{n}-s{seed}", seed, n=n, k=k, metrics=metrics, tests=tests)


def _ncdf(z):
    from scipy.stats import norm
    return norm.cdf(z)


def test_report_on_synthetic_records_reads_shift_error_and_sachs():
    rng = np.random.default_rng(0)
    assert "units are pending" in report([], None)
    recs = []
    for s in REPORTED_SEEDS:
        null_tests = {dz: {"kci": {"p": (1 - _ncdf(rng.normal(0.15, 1.0, 60))).tolist(), "cpu_s": [0.07] * 60},
                           "kci_lp": {"p": rng.uniform(size=60).tolist(), "cpu_s": [0.14] * 60}} for dz in ("1", "2")}
        recs.append(_record(f"null-s{s}", s, metrics={}, tests=null_tests))
        recs.append(_typei_record(64000, s, rng, {"kci": 0.15, "kci_lp": None}))
        for meth, f1 in (("fisherz", 0.5), ("kci", 0.6), ("ekci", 0.55), ("ekci_lp", 0.58)):
            fit = not (meth == "kci" and s == 14)
            m = {"fit": fit, "cpu_s": 10.0 + s, "tests": 100, "n": 1000}
            if fit:
                m |= {"shd": 12 + s % 3, "f1": f1 + 0.01 * (s % 2), "precision": 0.5, "recall": 0.7}
            recs.append(_record(f"sachs-{meth}-s{s}", s, metrics=m))
    text = report(recs, None)
    table_row = [ln for ln in text.splitlines() if ln.startswith("| triplet, dz = 1 | kci |")][0]
    assert "| 300 |" in table_row
    kci_z = null_shift([[p] for r in recs if r["unit"].startswith("null-") for p in r["tests"]["1"]["kci"]["p"]])
    assert kci_z["low"] > 0.03                                   # the synthetic old shift is seen ...
    assert f"{kci_z['mean']:+.3f}" in table_row
    reading = text.split("### Reading", 1)[1]
    assert "CPU per test 2.00x" in reading                      # 0.14 / 0.07
    # ... and its sqrt(K) inflation of the tuned combiner at K = 160, while uniform kci_lp inputs hold the level
    line_old = [ln for ln in reading.splitlines() if "with kci subsets" in ln][0]
    line_new = [ln for ln in reading.splitlines() if "with kci_lp subsets" in ln][0]
    assert "lies above the level" in line_old and "reaches the level" in line_new
    assert "| ekci_lp | 5 (5) |" in text and "| kci | 5 (4) |" in text
    assert "did not fit" in reading and "Flow-Cytometry.ipynb" in text
    assert "ekci_lp minus ekci, paired by subsample" in text
