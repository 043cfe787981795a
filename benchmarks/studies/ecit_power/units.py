"""The ecit_power units (plan: :mod:`benchmarks.studies.ecit_power.plan`). Each is pure numpy on one core.

Datasets and subsets come from the E-CIT studies' shared helpers (``benchmarks/study/ecit_data.py``: ``_triplet``,
``_seed``; ``benchmarks/study/ecit.py`` before the studies moved into ``benchmarks/studies/<study>/``), so a dataset
here with ecit_beyond's seed is ecit_beyond's dataset, cut into the same subsets.
"""
from __future__ import annotations

import importlib.metadata
import math
import time

import numpy as np

from benchmarks.study.core import StudyError, UnitContext

try:   # the E-CIT studies' shared data helpers (moved out of benchmarks/study/ecit.py during this session)
    from benchmarks.study.ecit_data import DATA, _seed, _triplet
except ImportError:  # pragma: no cover - a checkout from before the move
    from benchmarks.study.ecit import DATA, _seed, _triplet
from benchmarks.studies.ecit_power.beyond import reuse_settings
from benchmarks.studies.ecit_power.plan import (BEYOND_NULLS, COMBINER, DESIGN, DIAL_K, DIAL_REPS, DIAL_RHOS,
                                                DIAL_SUBTESTS, EQUAL_CPU_K, EQUAL_CPU_N, EQUAL_CPU_NULLS, KS, LEVEL,
                                                M, POWER_REPS, SUBTESTS, TARGET_POWER, TUNE_DATASETS, TUNE_EFFECTS,
                                                TUNE_N, TUNE_SEEDS, TUNED, WIDTH_NULLS, design)

RELEASED = "median"


def subset_pvalues(data: np.ndarray, m: int, split_seed: int, base: str,
                   options: dict | None = None) -> tuple[list[float], float]:
    """E-CIT's subset p-values of one dataset (columns x, y, z...) and their CPU s; the split and the subsets' own
    seeds come from ``split_seed`` exactly as in ``benchmarks.study.ecit._subset_pvalues`` (``options`` None)."""
    from algos.ecit import ecit_pvalue
    start = time.process_time()
    _, subs = ecit_pvalue(data[:, :1], data[:, 1:2], data[:, 2:], base=base, subset_size=m, rng=split_seed,
                          base_options=options, return_subsets=True)
    return [float(p) for p in subs], time.process_time() - start


def full_kci(data: np.ndarray, rows: int, seed: int) -> tuple[float, float]:
    """Gamma KCI on the first ``rows`` rows (default width) and its CPU s."""
    from algos.ecit import base_pvalue
    d = data[:rows]
    np.random.seed(seed % 2**32)
    start = time.process_time()
    p = base_pvalue(d[:, :1], d[:, 1:2], d[:, 2:], "kci")
    return float(p), time.process_time() - start


def combined(subs: list[float]) -> float:
    from algos.ecit import combine
    return float(combine(subs, COMBINER[0], COMBINER[1]))


def width_options(sub: str) -> tuple[str, dict | None]:
    """``"kci_lp@median"`` -> (``"kci_lp"``, the released width's options); a plain name -> (name, None)."""
    from algos.ecit import width_options as named
    base, _, width = sub.partition("@")
    return base, (named(width) or None) if width else None


# ------------------------------------------------------------------------------------------------ design and tuning

def run_design(ctx: UnitContext) -> dict:
    from algos.ecit import base_pvalue
    study_root = ctx.results_dir.parent.parent
    reuse = reuse_settings(study_root, DATA, M, COMBINER, TUNED, BEYOND_NULLS)
    data = _triplet(0, M, 0, False)
    prints = {}
    for sub in ("kci_lp", "kci_lp@median", "kci", "kci@median"):
        base, options = width_options(sub)
        np.random.seed(0)
        prints[sub] = float(base_pvalue(data[:, :1], data[:, 1:2], data[:, 2:], base, options))
    body = {**design(), "data": DATA, "reuse": reuse, "fingerprint": prints,
            "causal_learn": importlib.metadata.version("causal-learn")}
    ctx.write_json_artifact(DESIGN, body)
    return {"metrics": {"written": 1}, "design": body}


def group_power(tests: dict[str, list[list[float]]], k: int) -> dict[str, list[int]]:
    """effect -> [rejections, trials] of E-CIT at K = k over disjoint groups of k subsets of each dataset."""
    out = {}
    for effect, per_dataset in tests.items():
        hits = trials = 0
        for subs in per_dataset:
            for g in range(len(subs) // k):
                hits += combined(subs[g * k:(g + 1) * k]) <= LEVEL
                trials += 1
        out[effect] = [int(hits), trials]
    return out


def run_tune(ctx: UnitContext) -> dict:
    """kci_lp subset p-values of the seed's alternative datasets at every grid effect (the same draws throughout)."""
    n, m = ctx.size("tune_n", TUNE_N), ctx.size("m", M)
    effects, reps = ctx.size("tune_effects", TUNE_EFFECTS), ctx.size("tune_datasets", TUNE_DATASETS)
    tests: dict[str, list[list[float]]] = {str(e): [] for e in effects}
    cpu, done = [], 0
    for rep in range(reps):
        for e in effects:
            data = _triplet(ctx.seed, n, rep, True, {**DATA, "effect": e})
            subs, c = subset_pvalues(data, m, _seed(ctx.seed, n, rep, 1, 1), "kci_lp")
            tests[str(e)].append(subs)
            cpu.append(c / len(subs))
            done += 1
            ctx.progress(done, reps * len(effects), "datasets", effect=e)
    ks = [k for k in ctx.size("ks", KS) if k <= n // m]
    return {"metrics": {str(k): group_power(tests, k) for k in ks} | {"cpu_s_per_subset": float(np.mean(cpu))},
            "n": n, "m": m, "tests": tests}


def interpolate_effect(curve: dict[float, float], target: float) -> tuple[float, bool]:
    """The effect at which the power curve (made non-decreasing) reaches ``target``, log-linear between grid points;
    outside the grid's powers the grid's end times or over sqrt(2), flagged (second value True)."""
    effects = sorted(curve)
    power = np.maximum.accumulate([curve[e] for e in effects])
    if target <= power[0]:
        return round(effects[0] / math.sqrt(2.0), 3), True
    if target > power[-1]:
        return round(effects[-1] * math.sqrt(2.0), 3), True
    j = int(np.argmax(power >= target))
    frac = (target - power[j - 1]) / (power[j] - power[j - 1])
    log_e = math.log(effects[j - 1]) + frac * (math.log(effects[j]) - math.log(effects[j - 1]))
    return round(math.exp(log_e), 3), False


def tuned_effects(records: dict[str, dict], seeds: tuple[int, ...] = TUNE_SEEDS) -> dict[str, dict]:
    """The plan's tuning rule: per K, the effects at :data:`TARGET_POWER` from the pooled tuning power curve."""
    tunes = [r for r in records.values() if r["role"] == "tune"]
    if len(tunes) < len(seeds):
        raise StudyError(f"ecit_power: {len(tunes)} of {len(seeds)} tuning records; the reported units have no "
                         "effect sizes without them")
    out = {}
    for k in sorted({k for r in tunes for k in r["metrics"] if k != "cpu_s_per_subset"}, key=int):
        counts: dict[float, list[int]] = {}
        for r in tunes:
            for e, (hits, trials) in r["metrics"].get(k, {}).items():
                c = counts.setdefault(float(e), [0, 0])
                c[0], c[1] = c[0] + hits, c[1] + trials
        curve = {e: h / t for e, (h, t) in counts.items() if t}
        picks = [interpolate_effect(curve, t) for t in TARGET_POWER]
        effects, flags = [p[0] for p in picks], [p[1] for p in picks]
        if effects[1] <= effects[0]:   # both targets beyond the same end of the grid
            effects[1], flags[1] = round(effects[0] * math.sqrt(2.0), 3), True
        out[k] = {"effects": effects, "extrapolated": flags, "curve": {str(e): curve[e] for e in sorted(curve)},
                  "trials": {str(e): counts[e][1] for e in sorted(counts)}}
    return out


def _effect(ctx: UnitContext, k: int, index: int) -> float:
    tuned = tuned_effects(ctx.records(), ctx.size("tune_seeds", TUNE_SEEDS))
    if str(k) not in tuned:
        raise StudyError(f"ecit_power: the tuning records hold no K = {k}")
    return float(tuned[str(k)]["effects"][index])


# ------------------------------------------------------------------------------------------------ reported units

def _empty(subs) -> dict:
    return {s: {"null": [], "alt": [], "cpu_s": []} for s in subs}


def _test_all(tests: dict, key: str, data: np.ndarray, m: int, split_seed: int, subs) -> None:
    for sub in subs:
        base, options = width_options(sub)
        ps, cpu = subset_pvalues(data, m, split_seed, base, options)
        tests[sub][key].append(ps)
        tests[sub]["cpu_s"].append(cpu / len(ps))


def _rejections(tests: dict) -> dict:
    return {sub: {f"{key}_reject": int(sum(combined(s) <= LEVEL for s in t[key])) for key in ("null", "alt")}
            | {f"{key}_total": len(t[key]) for key in ("null", "alt")}
            | {"cpu_s_per_subset": float(np.mean(t["cpu_s"])) if t["cpu_s"] else None}
            for sub, t in tests.items() if "cpu_s" in t}


def run_power(ctx: UnitContext) -> dict:
    """Alternative datasets at K and the tuned effect: every sub-test on the same subsets (+ widths, + equal CPU)."""
    k, index = ctx.setting["k"], ctx.setting["effect_index"]
    m = ctx.size("m", M)
    n = ctx.size("n", m * k)
    effect = _effect(ctx, k, index)
    subs = list(SUBTESTS) + ([f"kci_lp@{RELEASED}", f"kci@{RELEASED}"] if ctx.setting.get("widths") else [])
    tests = _empty(subs)
    full = {"alt": [], "cpu_s": [], "rows": ctx.size("equal_cpu_n", EQUAL_CPU_N)} if k == EQUAL_CPU_K else None
    reps = ctx.size("power_reps", POWER_REPS[k])
    for rep in range(reps):
        data = _triplet(ctx.seed, n, rep, True, {**DATA, "effect": effect})
        _test_all(tests, "alt", data, m, _seed(ctx.seed, n, rep, 1, 1), subs)
        if full is not None:
            p, cpu = full_kci(data, full["rows"], _seed(ctx.seed, n, rep, 1, 5))
            full["alt"].append(p)
            full["cpu_s"].append(cpu)
        ctx.progress(rep + 1, reps, "datasets", k=k, effect=effect)
    body = {"metrics": _rejections(tests), "k": n // m, "n": n, "effect": effect, "tests": tests}
    if full is not None:
        body["full_kci"] = full
        body["metrics"]["full_kci"] = {"alt_reject": int(sum(p <= LEVEL for p in full["alt"])),
                                       "alt_total": len(full["alt"]), "cpu_s": float(np.mean(full["cpu_s"]))}
    return body


def run_fznull(ctx: UnitContext) -> dict:
    """Fisher-z on ecit_beyond's null datasets and subsets at n (its data and split seeds); at K = 40 also KCI on the
    first EQUAL_CPU_N rows of the first EQUAL_CPU_NULLS of them."""
    n = ctx.size("n", ctx.setting["n"])
    m = ctx.size("m", M)
    reps = ctx.size("fznull_reps", BEYOND_NULLS[ctx.setting["n"]])
    tests = _empty(["fisherz"])
    full = {"null": [], "cpu_s": [], "rows": ctx.size("equal_cpu_n", EQUAL_CPU_N)} \
        if ctx.setting["n"] == M * EQUAL_CPU_K else None
    for rep in range(reps):
        data = _triplet(ctx.seed, n, rep, False)
        _test_all(tests, "null", data, m, _seed(ctx.seed, n, rep, 0, 1), ["fisherz"])
        if full is not None and rep < ctx.size("equal_cpu_nulls", EQUAL_CPU_NULLS):
            p, cpu = full_kci(data, full["rows"], _seed(ctx.seed, n, rep, 0, 5))
            full["null"].append(p)
            full["cpu_s"].append(cpu)
        ctx.progress(rep + 1, reps, "datasets", n=n)
    body = {"metrics": _rejections(tests), "k": n // m, "n": n, "tests": tests}
    if full is not None:
        body["full_kci"] = full
        body["metrics"]["full_kci"] = {"null_reject": int(sum(p <= LEVEL for p in full["null"])),
                                       "null_total": len(full["null"]),
                                       "cpu_s": float(np.mean(full["cpu_s"])) if full["cpu_s"] else None}
    return body


def run_width_null(ctx: UnitContext) -> dict:
    """kci_lp and gamma KCI under the released width on ecit_beyond's first K = 160 null datasets (same subsets)."""
    m = ctx.size("m", M)
    n = ctx.size("n", m * max(KS))
    reps = ctx.size("width_nulls", WIDTH_NULLS)
    subs = [f"kci_lp@{RELEASED}", f"kci@{RELEASED}"]
    tests = _empty(subs)
    for rep in range(reps):
        _test_all(tests, "null", _triplet(ctx.seed, n, rep, False), m, _seed(ctx.seed, n, rep, 0, 1), subs)
        ctx.progress(rep + 1, reps, "datasets", n=n)
    return {"metrics": _rejections(tests), "k": n // m, "n": n, "tests": tests}


def dial_dataset(seed: int, n: int, rep: int, dependent: bool, rho: float, effect: float) -> np.ndarray:
    """A dial dataset: the same draws at every rho (seeded without it), so the rows of the dial are paired."""
    from envs.causal import make_dataset
    return make_dataset({"kind": "triplet", "n": n, "seed": _seed(seed, n, rep, int(dependent), 51),
                         "dependent": dependent, **DATA, "effect": effect, "rho": rho}).data


def run_dial(ctx: UnitContext) -> dict:
    """The determinism dial at K = DIAL_K: null and alternative datasets per rho, kci_lp and gamma KCI."""
    m = ctx.size("m", M)
    n = ctx.size("n", m * DIAL_K)
    effect = _effect(ctx, DIAL_K, 1)
    reps, rhos = ctx.size("dial_reps", DIAL_REPS), ctx.size("dial_rhos", DIAL_RHOS)
    tests = {str(rho): _empty(DIAL_SUBTESTS) for rho in rhos}
    total, done = len(rhos) * 2 * reps, 0
    for rho in rhos:
        for dependent, key in ((False, "null"), (True, "alt")):
            for rep in range(reps):
                data = dial_dataset(ctx.seed, n, rep, dependent, rho, effect)
                _test_all(tests[str(rho)], key, data, m, _seed(ctx.seed, n, rep, int(dependent), 52), DIAL_SUBTESTS)
                done += 1
                ctx.progress(done, total, "datasets", rho=rho)
    return {"metrics": {rho: _rejections(t) for rho, t in tests.items()}, "k": n // m, "n": n, "effect": effect,
            "tests": tests}
