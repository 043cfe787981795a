"""The units of ecit_beyond (plan: ``plan.py``): the design, the sub-test null, type-I error at many subsets, and PC
on Sachs."""
from __future__ import annotations

import time

import numpy as np

from benchmarks.studies.ecit_beyond.plan import (COMBINERS, DESIGN, LEVEL, M, NULL_DZ, NULL_REPS, NULL_SIM_REPS,
                                                 NULL_SUBTESTS, SACHS_KCI_BUDGET_S, SACHS_M, SACHS_MAX_K, SACHS_METHODS,
                                                 SACHS_N, SUBTESTS, SachsBudgetExceeded, TUNED, TYPEI, _COUNTS, design,
                                                 log)
from benchmarks.study.core import StudyError, UnitContext
from benchmarks.study.ecit_data import DATA, _seed, _subset_pvalues, _triplet, null_shift


def run_design(ctx: UnitContext) -> dict:
    import importlib.metadata

    from algos.ecit import base_pvalue
    data = _triplet(0, M, 0, False)
    prints = {}
    for sub in SUBTESTS:
        np.random.seed(0)
        prints[sub] = float(base_pvalue(data[:, :1], data[:, 1:2], data[:, 2:], sub))
    body = {**design(), "fingerprint": prints, "causal_learn": importlib.metadata.version("causal-learn")}
    ctx.write_json_artifact(DESIGN, body)
    return {"metrics": {"written": 1}, "design": body}


def _timed_pvalue(data: np.ndarray, sub: str, seed: int, options: dict | None = None) -> tuple[float, float]:
    from algos.ecit import base_pvalue
    np.random.seed(seed % 2**32)
    start = time.process_time()
    p = base_pvalue(data[:, :1], data[:, 1:2], data[:, 2:], sub, options)
    return float(p), time.process_time() - start


def run_null(ctx: UnitContext) -> dict:
    """Each sub-test once on each null dataset of exactly M rows (one p-value per dataset: no clustering)."""
    reps, m = ctx.size("null_reps", NULL_REPS), ctx.size("null_m", M)
    out = {str(dz): {sub: {"p": [], "cpu_s": []} for sub in NULL_SUBTESTS} for dz in NULL_DZ}
    total, done = reps * len(NULL_DZ), 0
    for dz in NULL_DZ:
        for rep in range(reps):
            data = _triplet(ctx.seed, m, rep, False, {**DATA, "dz": dz})
            for sub, (base, options) in NULL_SUBTESTS.items():
                if sub == "kci_sim" and (dz != 1 or rep >= ctx.size("null_sim_reps", NULL_SIM_REPS)):
                    continue
                p, cpu = _timed_pvalue(data, base, _seed(ctx.seed, m, rep, dz, 3), options)
                out[str(dz)][sub]["p"].append(p)
                out[str(dz)][sub]["cpu_s"].append(cpu)
            done += 1
            ctx.progress(done, total, "datasets", dz=dz)
    metrics = {dz: {sub: null_shift([[p] for p in v["p"]]) | {"cpu_s": float(np.mean(v["cpu_s"]))}
                    for sub, v in per.items() if len(v["p"]) > 1} for dz, per in out.items()}
    return {"metrics": metrics, "m": m, "tests": out}


def run_typei(ctx: UnitContext) -> dict:
    """The E-CIT study's datasets and subsets at n (its data and split seeds), tested by both sub-tests."""
    n = ctx.size("n", ctx.setting["n"])
    m = ctx.size("m", M)
    nulls, alts = ctx.size("typei_reps", TYPEI[ctx.setting["n"]])
    tests = {sub: {"null": [], "alt": [], "cpu_s": []} for sub in SUBTESTS}
    total, done = nulls + alts, 0
    for dependent, key, reps in ((False, "null", nulls), (True, "alt", alts)):
        for rep in range(reps):
            data = _triplet(ctx.seed, n, rep, dependent)
            split_seed = _seed(ctx.seed, n, rep, int(dependent), 1)   # = ecit.py's _tests: the same subsets
            for sub in SUBTESTS:
                subs, cpu = _subset_pvalues(data, m, split_seed, sub)
                tests[sub][key].append(subs)
                tests[sub]["cpu_s"].append(cpu / len(subs))
            done += 1
            ctx.progress(done, total, "datasets", n=n)
    metrics = {sub: {c: rejections(t, c) for c in COMBINERS} | {"cpu_s_per_subset": float(np.mean(t["cpu_s"]))}
               for sub, t in tests.items()}
    return {"metrics": metrics, "n": n, "k": n // m, "tests": tests}


def rejections(tests: dict, combiner: str, level: float = LEVEL) -> dict[str, int]:
    from algos.ecit import combine
    method, param = COMBINERS[combiner]
    counts = {}
    for key in ("null", "alt"):
        ps = [combine(subs, method, param, threshold=param) for subs in tests[key]]
        counts[f"{key}_reject"], counts[f"{key}_total"] = int(sum(p <= level for p in ps)), len(ps)
    return counts


def _register(budget_s: float) -> str:
    """causal-learn CI test "ecit_beyond": KCI on all rows ("full") or E-CIT over the base given, split seeded by
    the question (PC's deep copies of the test share the counter by name); past ``budget_s`` CPU s it raises."""
    from causallearn.utils.cit import CIT_Base, register_ci_test

    from algos.ecit import base_pvalue, ecit_pvalue
    from experiments.ecit.pool_tests import question_seed

    class BeyondTest(CIT_Base):
        def __init__(self, data, mode="full", base="kci", subset_size=SACHS_M, seed=0, start=0.0, **kwargs):
            with np.printoptions(threshold=16, edgeitems=2):
                super().__init__(data, **kwargs)
            self.check_cache_method_consistent("ecit_beyond", f"{mode}|{base}|{subset_size}|{seed}")
            self.mode, self.base, self.m, self.seed, self.start = mode, base, subset_size, seed, start

        def __call__(self, X, Y, condition_set=None):
            xs, ys, zs, key = self.get_formatted_XYZ_and_cachekey(X, Y, condition_set)
            if key not in self.pvalue_cache:
                if time.process_time() - self.start > budget_s:
                    raise SachsBudgetExceeded(f"{_COUNTS.get('tests', 0)} tests in {budget_s:.0f} CPU s")
                _COUNTS["tests"] = _COUNTS.get("tests", 0) + 1
                d = self.data
                z = d[:, zs] if zs else None
                qseed = question_seed(self.seed, xs, ys, zs)
                if self.mode == "full":
                    np.random.seed(qseed % 2**32)
                    p = base_pvalue(d[:, xs], d[:, ys], z, self.base)
                else:
                    method, alpha = COMBINERS[TUNED]
                    p = ecit_pvalue(d[:, xs], d[:, ys], z, base=self.base, subset_size=self.m, combine=method,
                                    alpha=alpha, rng=qseed)
                self.pvalue_cache[key] = p
            return self.pvalue_cache[key]

    register_ci_test("ecit_beyond", BeyondTest)
    return "ecit_beyond"


def sachs_subsample(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows [n, 11], consensus adjacency): n of the general-stimulation rows, drawn without replacement per seed."""
    from envs.causal import make_dataset
    ds = make_dataset({"kind": "sachs", "rows": "general", "log": True})
    rows = np.random.default_rng(_seed(seed, 42)).choice(len(ds.data), size=min(n, len(ds.data)), replace=False)
    return ds.data[np.sort(rows)], ds.dag


def run_sachs(ctx: UnitContext) -> dict:
    from causallearn.search.ConstraintBased.PC import pc

    from envs.causal.graphs import shd, skeleton_scores
    from experiments.ecit.pc import truth_marks
    method = ctx.setting["method"]
    if method not in SACHS_METHODS:
        raise StudyError(f"ecit_beyond: unknown Sachs method {method!r}")
    data, dag = sachs_subsample(ctx.seed, ctx.size("sachs_n", SACHS_N))
    m, max_k = ctx.size("sachs_m", SACHS_M), ctx.size("sachs_max_k", SACHS_MAX_K)
    budget = ctx.size("sachs_kci_budget_s", SACHS_KCI_BUDGET_S)
    _COUNTS["tests"] = 0
    start = time.process_time()
    kw = dict(stable=True, show_progress=False, max_k=max_k)
    try:
        if method == "fisherz":
            cg = pc(data, LEVEL, "fisherz", **kw)
        else:
            mode, base = {"kci": ("full", "kci"), "ekci": ("ecit", "kci"), "ekci_lp": ("ecit", "kci_lp")}[method]
            cg = pc(data, LEVEL, _register(budget if method == "kci" else float("inf")), mode=mode, base=base,
                    subset_size=m, seed=ctx.seed, start=start, **kw)
    except SachsBudgetExceeded as err:
        cpu = time.process_time() - start
        log.info("sachs %s seed %s: did not fit: %s", method, ctx.seed, err)
        return {"metrics": {"fit": False, "cpu_s": cpu, "tests": _COUNTS["tests"], "n": len(data)},
                "method": method}
    cpu = time.process_time() - start
    truth, est = truth_marks(dag), np.asarray(cg.G.graph)
    scores = skeleton_scores(truth, est)
    return {"metrics": {"fit": True, "shd": shd(truth, est), "f1": scores["f1"], "precision": scores["precision"],
                        "recall": scores["recall"], "edges": int(np.sum(np.triu((est != 0) | (est.T != 0), 1))),
                        "cpu_s": cpu, "tests": _COUNTS["tests"] if method != "fisherz" else None, "n": len(data),
                        "k": len(data) // m if method.startswith("ekci") else None},
            "method": method, "graph": est.astype(int).tolist()}
