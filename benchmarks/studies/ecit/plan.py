"""The E-CIT study (issue 28): is E-CIT valid, how much power does it keep, what does it save, and does PC gain?

Every unit is pure numpy on one core (algos.ecit, causal-learn's KCI and PC): the study measures the method, not
the cluster. The plan, fixed before any unit ran (every unit <= 20 min of one core):

1. ``design`` (stage): writes ``artifacts/design.json``, the frozen design below plus a fingerprint of the combiner
   (stable quantiles at fixed p) and the causal-learn version. Its sha256 is the study's start model: every later
   record carries it, so records of another design cannot be mixed in.
2. ``tune-m<m>-s<seed>`` (tuning seeds 100, 101): at n = 4000, 40 null and 40 alternative datasets per seed, each
   tested by E-KCI with subsets of m rows (m in :data:`SUBSET_SIZES`); every combiner in :data:`COMBINERS` is applied
   to the same subset p-values. Rule: the (m, combiner) with the highest power among those whose pooled type-I
   error's exact 95 % interval reaches down to the level; ties go to the larger m. The reported units use it.
3. Reported seeds 10-14, each unit one seed:
   - ``cal-n<n>-s<seed>``: 40 null + 40 alternative datasets at n (5 seeds: 200 + 200 per n), E-KCI with the tuned
     (m, combiner) plus every other combiner on the same subset p-values, the first subset alone, and KCI on all
     rows while n <= :data:`FULL_MAX_N`. Type-I error and power pool over seeds with exact binomial intervals.
   - ``time-s<seed>``: CPU seconds of one test (the median of 3 datasets) vs n: KCI on all rows for n in
     :data:`TIME_FULL_NS`, E-KCI for n in :data:`TIME_ECIT_NS` (to 1e5 rows); a cubic fit of the full-data times
     extrapolates where KCI stops being feasible.
   - ``pc-full-s<seed>`` and ``pc-ecit-s<seed>``: PC (causal-learn, max_k 2, level 0.05) on one random 6-node
     nonlinear SEM per seed, with KCI on all rows at n = :data:`PC_FULL_N` and with E-KCI at n = :data:`PC_ECIT_N`
     (chosen so that both spend about the same CPU: 7.6 s per KCI test at 2000 rows = 120 subsets of 400 rows at
     0.063 s each);
     SHD to the true CPDAG and skeleton F1, seed-paired (E-CIT minus full), with the CPU each spent.
Data: the post-nonlinear triplet (envs.causal.triplets; t3 noise, one conditioning variable, effect 0.5) and the
random-DAG SEM (envs.causal.sem), seeded from (unit seed, n, repeat) so every method sees the same datasets."""
from __future__ import annotations

import logging
from pathlib import Path

from benchmarks.study.core import REPORTED_SEEDS, Study, StudyError, Unit
from benchmarks.study.ecit_data import DATA


log = logging.getLogger(__name__)

LEVEL = 0.05
SUBSET_SIZES = (200, 400)
COMBINERS = {"stable1.75": ("stable", 1.75), "stable2": ("stable", 2.0), "cauchy": ("cauchy", 1.0),
             "fisher": ("fisher", 1.0), "bonferroni": ("bonferroni", 1.0)}
TUNE_SEEDS = (100, 101)
TUNE_N = 4000
REPS = 40                         # null datasets and as many alternatives per unit
CAL_NS = (1000, 2000, 4000, 16000, 64000)
FULL_MAX_N = 2000                 # KCI on all rows in the calibration units up to here
TIME_FULL_NS = (500, 1000, 2000, 4000)
TIME_ECIT_NS = (1000, 4000, 16000, 64000, 100000)
PC_FULL_N, PC_ECIT_N = 2000, 48000
PC_GRAPH = {"kind": "sem", "d": 6, "degree": 2.0, "sem": "nonlinear", "noise": "t3"}
PC_MAX_K = 2
DESIGN = "design.json"
# Added after the calibration table showed type-I error growing with n (so not part of design.json, and said so in
# the report): the same combiners over subset p-values of a base test whose null is right, Fisher-z on
# linear-Gaussian data. If the combiners stay at the level there, the growth comes from the subset KCI p-values.
CONTROL_NS = (4000, 16000, 64000)
CONTROL_DATA = {"dz": 1, "noise": "gaussian", "effect": 0.02, "nonlinear": False}
# est. core seconds per unit on the 2-core EPYC, idle (KCI CPU: 400 rows 0.063 s, 2000 rows 7.6 s; PC on these
# graphs asks 20-65 distinct questions); measured means replace them
COST_S = {"design": 5, "tune": 90, "cal1000": 150, "cal2000": 700, "cal4000": 90, "cal16000": 300, "cal64000": 1000,
          "time": 450, "pc-full": 600, "pc-ecit": 600, "control": 120}


def design() -> dict:
    return {"level": LEVEL, "subset_sizes": list(SUBSET_SIZES), "combiners": {k: list(v) for k, v in COMBINERS.items()},
            "tune_seeds": list(TUNE_SEEDS), "tune_n": TUNE_N, "reps": REPS, "cal_ns": list(CAL_NS),
            "full_max_n": FULL_MAX_N, "time_full_ns": list(TIME_FULL_NS), "time_ecit_ns": list(TIME_ECIT_NS),
            "pc_full_n": PC_FULL_N, "pc_ecit_n": PC_ECIT_N, "pc_graph": PC_GRAPH, "pc_max_k": PC_MAX_K, "data": DATA}


def units() -> list[Unit]:
    fn = "benchmarks.studies.ecit.units:"
    plan = [Unit("design", "stage", "design", None, fn + "run_design", est_core_s=COST_S["design"])]
    tunes = [Unit(f"tune-m{m}-s{s}", "tune", f"tune_m{m}", s, fn + "run_tune", {"subset_size": m}, after=("design",),
                  est_core_s=COST_S["tune"] * m / 400) for m in SUBSET_SIZES for s in TUNE_SEEDS]
    plan += tunes
    tuned = tuple(u.name for u in tunes)
    # kinds outer, seeds inner: a lane that stops early leaves whole rows of the report (cheap calibration first)
    for n in sorted(CAL_NS, key=lambda n: COST_S[f"cal{n}"]):
        plan += [Unit(f"cal-n{n}-s{s}", "report", f"cal_n{n}", s, fn + "run_calibration", {"n": n}, after=tuned,
                      est_core_s=COST_S[f"cal{n}"]) for s in REPORTED_SEEDS]
    plan += [Unit(f"time-s{s}", "report", "time", s, fn + "run_time", after=("design",), est_core_s=COST_S["time"])
             for s in REPORTED_SEEDS]
    for variant in ("full", "ecit"):
        plan += [Unit(f"pc-{variant}-s{s}", "report", f"pc_{variant}", s, fn + "run_pc", {"variant": variant},
                      after=("design",) if variant == "full" else tuned, est_core_s=COST_S[f"pc-{variant}"])
                 for s in REPORTED_SEEDS]
    plan += [Unit(f"control-fisherz-s{s}", "report", "control_fisherz", s, fn + "run_control", after=tuned,
                  est_core_s=COST_S["control"]) for s in REPORTED_SEEDS]
    return plan


def start_files(artifacts: Path) -> list[Path]:
    return [Path(artifacts) / DESIGN]


def tuned_setting(records: dict[str, dict]) -> dict:
    """The tuning rule of the module docstring, from the tune records (every one must be there)."""
    from scipy.stats import binomtest
    tunes = [r for r in records.values() if r["role"] == "tune"]
    if len(tunes) < len(SUBSET_SIZES) * len(TUNE_SEEDS):
        raise StudyError(f"ecit: {len(tunes)} of {len(SUBSET_SIZES) * len(TUNE_SEEDS)} tuning records; the reported "
                         f"units have no setting without them")
    best = None
    for m in SUBSET_SIZES:
        for c in COMBINERS:
            got = [r["metrics"][c] for r in tunes if r["setting"]["subset_size"] == m]
            nr, nt = sum(g["null_reject"] for g in got), sum(g["null_total"] for g in got)
            ar, at = sum(g["alt_reject"] for g in got), sum(g["alt_total"] for g in got)
            valid = binomtest(nr, nt).proportion_ci(0.95).low <= LEVEL
            key = (valid, ar / at, m)
            if best is None or key > best[0]:
                best = (key, {"subset_size": m, "combiner": c, "tune_type1": nr / nt, "tune_power": ar / at,
                              "valid": valid})
    return best[1]


_PC_COUNTS: dict[str, int] = {}


STUDY = Study(name="ecit", title="E-CIT: validity, power, cost and PC (issue 28)", units=units,
              start_files=start_files, report="benchmarks.studies.ecit.report:report")
