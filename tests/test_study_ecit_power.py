"""The ecit_power study (benchmarks/studies/ecit_power/, issue 51): a plan declared and priced before any unit, the
tuning rule, every kind of unit at tiny size through the runner's inline helper, and the report on synthetic
records (its own and ecit_beyond's) in tmp_path."""
from __future__ import annotations

import importlib
import json

import numpy as np
import pytest

from benchmarks.study.core import MIN_TUNING_SEED, REPORTED_SEEDS
from benchmarks.studies.ecit_power.plan import (BEYOND_NULLS, DIAL_RHOS, KS, M, PREDICTIONS, STUDY, TARGET_POWER,
                                                TUNE_SEEDS)


def test_plan_is_declared_priced_and_reuses_ecit_beyonds_null_rows():
    plan = STUDY.plan()
    assert plan[0].name == "design" and plan[0].role == "stage"
    assert all(u.role != "tune" or u.seed >= MIN_TUNING_SEED for u in plan)
    assert sum(u.est_core_s for u in plan) / 3600 <= 3.0
    power = [u for u in plan if u.name.startswith("power-")]
    assert {u.setting["k"] for u in power} == set(KS) == {10, 40, 160}
    assert {u.setting["effect_index"] for u in power} == set(range(len(TARGET_POWER)))
    # both widths at K = 160: the power rows at effect 0 and their own null rows
    assert {u.name for u in power if u.setting["widths"]} == {f"power-k160-e0-s{s}" for s in REPORTED_SEEDS}
    assert {u.name for u in plan if u.name.startswith("width-null-")} == {f"width-null-s{s}" for s in REPORTED_SEEDS}
    # every reported unit that needs the tuned effects waits for every tuning unit
    tunes = {f"tune-s{s}" for s in TUNE_SEEDS}
    assert all(tunes <= set(u.after) for u in plan if u.name.startswith(("power-", "dial-")))
    assert all(p["margin"] > 0 and p["claim"] and p["expect"] for p in PREDICTIONS.values())
    # the reused null rows are ecit_beyond's: the same counts per seed, data and split helpers
    beyond = json.loads((importlib.import_module("benchmarks.study.records").RESULTS
                         / "ecit_beyond" / "records" / "artifacts" / "design.json").read_text())
    assert {int(n): v[0] for n, v in beyond["typei"].items()} == BEYOND_NULLS and beyond["m"] == M


def test_tuning_rule_interpolates_on_log_effect_and_flags_the_grid_edges():
    from benchmarks.studies.ecit_power.units import interpolate_effect, tuned_effects
    curve = {0.1: 0.2, 0.2: 0.6, 0.4: 0.9}
    e, flag = interpolate_effect(curve, 0.4)
    assert not flag and e == pytest.approx(round(0.1 * 2 ** 0.5, 3))   # halfway in power, halfway in log effect
    assert interpolate_effect(curve, 0.1) == (round(0.1 / 2 ** 0.5, 3), True)
    assert interpolate_effect(curve, 0.95) == (round(0.4 * 2 ** 0.5, 3), True)
    # a dip is ironed out (the curve made non-decreasing) before interpolating
    assert interpolate_effect({0.1: 0.5, 0.2: 0.3, 0.4: 0.9}, 0.7)[0] > 0.2
    recs = {f"tune-s{s}": {"role": "tune", "metrics": {"10": {"0.1": [1, 10], "0.2": [5, 10], "0.4": [9, 10]},
                                                      "cpu_s_per_subset": 0.1}} for s in TUNE_SEEDS}
    tuned = tuned_effects(recs)
    assert list(tuned) == ["10"] and tuned["10"]["effects"][0] < tuned["10"]["effects"][1]
    assert tuned["10"]["curve"] == {"0.1": 0.1, "0.2": 0.5, "0.4": 0.9}
    with pytest.raises(Exception, match="tuning records"):
        tuned_effects(dict(list(recs.items())[:2]))


def test_size_adjustment_cuts_at_the_nulls_5_percent_quantile():
    from benchmarks.studies.ecit_power.rows import size_threshold
    null = list(np.linspace(0.001, 1.0, 100))
    cut = size_threshold(null)
    assert sum(p < cut for p in null) == 5 and size_threshold(null[:10]) is None


TINY = {"m": 50, "tune_n": 2000, "tune_effects": (0.3, 0.9), "tune_datasets": 1, "power_reps": 2, "fznull_reps": 2,
        "equal_cpu_n": 120, "equal_cpu_nulls": 1, "width_nulls": 1, "dial_reps": 1, "dial_rhos": (0.0, 0.99)}


def test_units_run_tiny_on_ecit_beyonds_datasets_and_subsets(tmp_path):
    from benchmarks.study.runner import run_unit_inline
    from benchmarks.studies.ecit_power.units import subset_pvalues
    run = lambda name, **kw: run_unit_inline(STUDY, name, tmp_path, overrides={**TINY, **kw})  # noqa: E731
    design = run("design")["design"]
    assert set(design["fingerprint"]) == {"kci_lp", "kci_lp@median", "kci", "kci@median"}
    assert design["fingerprint"]["kci"] != design["fingerprint"]["kci@median"]
    assert design["reuse"]["null_seeds"]["64000"] == list(REPORTED_SEEDS)
    for s in TUNE_SEEDS:
        tune = run(f"tune-s{s}")
    assert set(tune["metrics"]) == {"10", "40", "cpu_s_per_subset"} and tune["metrics"]["10"]["0.9"][1] == 4
    p10 = run("power-k10-e1-s10")
    assert p10["k"] == 10 and set(p10["metrics"]) == {"kci_lp", "kci", "fisherz"}
    assert p10["metrics"]["kci_lp"]["alt_total"] == 2 and len(p10["tests"]["kci"]["alt"][0]) == 10
    p40 = run("power-k40-e0-s10")
    assert p40["metrics"]["full_kci"]["alt_total"] == 2 and p40["full_kci"]["rows"] == 120
    fz = run("fznull-n16000-s10", n=2000)
    # Fisher-z here on ecit_beyond's dataset and subsets: its split seed gives E-CIT's subsets of that dataset
    from benchmarks.studies.ecit_power.units import _seed, _triplet
    again, _ = subset_pvalues(_triplet(10, 2000, 0, False), 50, _seed(10, 2000, 0, 0, 1), "fisherz")
    assert fz["tests"]["fisherz"]["null"][0] == again and fz["metrics"]["full_kci"]["null_total"] == 1
    wn = run("width-null-s10", n=400)
    assert set(wn["tests"]) == {"kci_lp@median", "kci@median"} and wn["k"] == 8
    dial = run("dial-s10")
    assert set(dial["tests"]) == {"0.0", "0.99"} and dial["effect"] == p10["effect"]


def _subsets(rng, k, shift=0.0):
    from scipy.stats import norm
    return [float(p) for p in norm.sf(rng.normal(shift, 1.0, size=k))]


def _synthetic(root):
    """ecit_beyond's records (design, null rows, one Sachs graph) and a partial set of ecit_power's."""
    rng = np.random.default_rng(0)
    beyond = root / "ecit_beyond" / "records"
    (beyond / "artifacts").mkdir(parents=True)
    (beyond / "artifacts" / "design.json").write_text(json.dumps({"m": M}))
    base = {"study": "x", "role": "report", "method": "m", "start_sha": "a", "metrics": {}, "commit": "c", "cpu": {},
            "wall_s": 1.0, "cpu_s": 1.0}
    for n in BEYOND_NULLS:
        for s in REPORTED_SEEDS:
            k = n // M
            tests = {sub: {"null": [_subsets(rng, k, 0.15 if sub == "kci" else 0.0) for _ in range(20)]}
                     for sub in ("kci", "kci_lp")}
            (beyond / f"typei-n{n}-s{s}.json").write_text(json.dumps(
                {**base, "unit": f"typei-n{n}-s{s}", "seed": s, "n": n, "k": k, "tests": tests}))
    graph = np.zeros((11, 11), dtype=int)
    graph[1, 0], graph[0, 1] = 1, -1      # praf -> pmek, in both references
    (beyond / "sachs-ekci_lp-s10.json").write_text(json.dumps(
        {**base, "unit": "sachs-ekci_lp-s10", "seed": 10, "method": "ekci_lp", "graph": graph.tolist()}))
    recs = [{**base, "study": "ecit_power", "unit": f"tune-s{s}", "role": "tune", "seed": s,
             "metrics": {str(k): {"0.2": [2, 10], "0.4": [8, 10]} for k in KS}} for s in TUNE_SEEDS]
    for k in KS:
        for e in (0, 1):
            subs = ["kci_lp", "kci", "fisherz"] + (["kci_lp@median", "kci@median"] if k == 160 and e == 0 else [])
            tests = {sub: {"null": [], "alt": [_subsets(rng, k, 0.3 + 0.1 * e) for _ in range(10)], "cpu_s": [0.1]}
                     for sub in subs}
            rec = {**base, "study": "ecit_power", "unit": f"power-k{k}-e{e}-s10", "seed": 10, "k": k, "n": M * k,
                   "effect": 0.2 + 0.1 * e, "setting": {"k": k, "effect_index": e}, "tests": tests,
                   "metrics": {"kci_lp": {"cpu_s_per_subset": 0.12}}}
            if k == 40:
                rec["full_kci"] = {"alt": list(rng.uniform(0, 0.2, 10)), "cpu_s": [5.0], "rows": 1800}
            recs.append(rec)
    recs.append({**base, "study": "ecit_power", "unit": "fznull-n16000-s10", "seed": 10, "k": 40, "n": 16000,
                 "setting": {"n": 16000}, "full_kci": {"null": list(rng.uniform(0, 1, 10)), "cpu_s": [5.0]},
                 "tests": {"fisherz": {"null": [_subsets(rng, 40) for _ in range(20)], "alt": [], "cpu_s": [0.01]}}})
    tests = {"fisherz": {"null": [_subsets(rng, 160, 0.5) for _ in range(20)], "alt": [], "cpu_s": [0.01]}}
    recs.append({**base, "study": "ecit_power", "unit": "fznull-n64000-s10", "seed": 10, "k": 160, "n": 64000,
                 "setting": {"n": 64000}, "tests": tests})
    dial = {str(rho): {sub: {"null": [_subsets(rng, 10, -0.5 * rho) for _ in range(20)],
                             "alt": [_subsets(rng, 10, 0.5) for _ in range(20)], "cpu_s": [0.1]}
                       for sub in ("kci_lp", "kci")} for rho in DIAL_RHOS}
    recs.append({**base, "study": "ecit_power", "unit": "dial-s10", "seed": 10, "k": 10, "n": 4000, "effect": 0.3,
                 "tests": dial})
    return recs


def test_report_renders_partial_records_and_both_sachs_references(tmp_path):
    from benchmarks.studies.ecit_power.report import report
    text = report(_synthetic(tmp_path), tmp_path / "ecit_power")
    assert text.startswith("## E-CIT at many subsets") and "**partial**" in text
    assert "The authors' first objection" in text and "### Reading" in text
    # type-I rows read from the synthetic ecit_beyond records: 5 seeds x 20 null datasets
    assert "| 10 (4000), e = 0.2 / 0.3 | kci_lp (local-permutation null) |" in text and "(N=100)" in text
    assert "(gamma null: size-adjusted only)" in text
    assert "**Both widths at K = 160**" in text and "| KCI (gamma null) | median |" in text
    assert "| 0.99 | 0.98 |" in text and "| KCI on all rows | 1800 | 5 |" in text
    assert "| E-KCI-lp | 16000 | 4.8 |" in text and "- **Which test, where**" in text
    assert "| ekci_lp | 1 | cdt's 18-edge consensus |" in text and "| ekci_lp | 1 | 17-arc DAG (bnlearn) |" in text
    for key in PREDICTIONS:
        assert f"- `{key}`" in text
    assert "`released_width_gamma`" in text and "**no data yet**" in text   # no released-width null rows here
