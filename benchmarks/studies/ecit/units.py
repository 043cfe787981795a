"""The units of the E-CIT study (plan: ``plan.py``): the design, the tuning, calibration, control, timing and PC units."""
from __future__ import annotations

import time

import numpy as np

from benchmarks.studies.ecit.plan import (COMBINERS, CONTROL_DATA, CONTROL_NS, DESIGN, FULL_MAX_N, LEVEL, PC_ECIT_N,
                                          PC_FULL_N, PC_GRAPH, PC_MAX_K, REPS, TIME_ECIT_NS, TIME_FULL_NS, TUNE_N,
                                          _PC_COUNTS, design, tuned_setting)
from benchmarks.study.core import UnitContext
from benchmarks.study.ecit_data import DATA, _seed, _subset_pvalues, _triplet


def run_design(ctx: UnitContext) -> dict:
    import importlib.metadata

    from algos.ecit import stable_quantile
    body = {**design(), "fingerprint": {f"q{a}": [float(stable_quantile(p, a)) for p in (1e-6, 1e-3, 0.2)]
                                        for a in (1.0, 1.75, 2.0)},
            "causal_learn": importlib.metadata.version("causal-learn")}
    ctx.write_json_artifact(DESIGN, body)
    return {"metrics": {"written": 1}, "design": body}


def _full_pvalue(data: np.ndarray, base: str = "kci") -> tuple[float, float]:
    from algos.ecit import base_pvalue
    start = time.process_time()
    p = base_pvalue(data[:, :1], data[:, 1:2], data[:, 2:], base)
    return float(p), time.process_time() - start


def _tests(ctx: UnitContext, n: int, m: int, full: bool, base: str = "kci", kind: dict = DATA) -> dict:
    """Subset p-values (and full-data p-values) of the unit's null and alternative datasets."""
    reps = ctx.size("reps", REPS)
    out = {"null": [], "alt": [], "null_full": [], "alt_full": [], "ecit_cpu_s": [], "full_cpu_s": []}
    total, done = 2 * reps, 0
    for dependent, key in ((False, "null"), (True, "alt")):
        for rep in range(reps):
            data = _triplet(ctx.seed, n, rep, dependent, kind)
            subs, cpu = _subset_pvalues(data, m, _seed(ctx.seed, n, rep, int(dependent), 1), base)
            out[key].append(subs)
            out["ecit_cpu_s"].append(cpu)
            if full:
                p, cpu = _full_pvalue(data, base)
                out[f"{key}_full"].append(p)
                out["full_cpu_s"].append(cpu)
            done += 1
            ctx.progress(done, total, "datasets", n=n)
    return out


def rejections(tests: dict, combiner: str, level: float = LEVEL) -> dict[str, int]:
    """Rejection counts of one combiner (or "one_subset", "full") on a unit's stored p-values."""
    from algos.ecit import combine
    counts = {}
    for key in ("null", "alt"):
        if combiner == "full":
            ps = tests[f"{key}_full"]
        elif combiner == "one_subset":
            ps = [subs[0] for subs in tests[key]]
        else:
            method, alpha = COMBINERS[combiner]
            ps = [combine(subs, method, alpha) for subs in tests[key]]
        counts[f"{key}_reject"], counts[f"{key}_total"] = int(sum(p <= level for p in ps)), len(ps)
    return counts


def run_tune(ctx: UnitContext) -> dict:
    m = ctx.setting["subset_size"]
    tests = _tests(ctx, ctx.size("tune_n", TUNE_N), m, full=False)
    return {"metrics": {c: rejections(tests, c) for c in COMBINERS}, "tests": tests}


def run_calibration(ctx: UnitContext) -> dict:
    tuned = tuned_setting(ctx.records())
    n = ctx.size("n", ctx.setting["n"])
    tests = _tests(ctx, n, tuned["subset_size"], full=n <= ctx.size("full_max_n", FULL_MAX_N))
    methods = [*COMBINERS, "one_subset"] + (["full"] if tests["null_full"] else [])
    return {"metrics": {m: rejections(tests, m) for m in methods} | {
                "ecit_cpu_s": float(np.mean(tests["ecit_cpu_s"])),
                "full_cpu_s": float(np.mean(tests["full_cpu_s"])) if tests["full_cpu_s"] else None},
            "tuned": tuned, "n": n, "tests": tests}


def run_control(ctx: UnitContext) -> dict:
    """Every combiner, and Fisher-z on all rows, on linear-Gaussian triplets at :data:`CONTROL_NS` (Fisher-z
    subsets of the tuned size): the combiners' type-I error when the subset p-values are uniform under the null."""
    m = tuned_setting(ctx.records())["subset_size"]
    per_n = {}
    for n in ctx.size("control_ns", CONTROL_NS):
        tests = _tests(ctx, n, m, full=True, base="fisherz", kind=CONTROL_DATA)
        per_n[str(n)] = {"metrics": {c: rejections(tests, c) for c in [*COMBINERS, "one_subset", "full"]},
                         "tests": tests}
    return {"metrics": {n: v["metrics"] for n, v in per_n.items()}, "subset_size": m,
            "tests": {n: v["tests"] for n, v in per_n.items()}}


def run_time(ctx: UnitContext) -> dict:
    m = ctx.size("time_subset_size", 400)
    full_ns, ecit_ns = ctx.size("time_full_ns", TIME_FULL_NS), ctx.size("time_ecit_ns", TIME_ECIT_NS)
    curves: dict[str, dict[str, float]] = {"full": {}, "ecit": {}}
    total, done = len(full_ns) + len(ecit_ns), 0
    for name, ns in (("full", full_ns), ("ecit", ecit_ns)):
        for n in ns:
            cpus = []
            for rep in range(ctx.size("time_reps", 3)):
                data = _triplet(ctx.seed, n, rep, False)
                cpus.append(_full_pvalue(data)[1] if name == "full" else
                            _subset_pvalues(data, m, _seed(ctx.seed, n, rep, 2))[1])
            curves[name][str(n)] = float(np.median(cpus))
            done += 1
            ctx.progress(done, total, "sizes", method=name, n=n)
    return {"metrics": {"subset_size": m}, "curves": curves}


def _register_local_ecit() -> str:
    """causal-learn CI test "ecit_local": E-CIT in this process, split seeded by the question (deep copies of PC's
    graph share the counter by name)."""
    from causallearn.utils.cit import CIT_Base, register_ci_test

    from algos.ecit import ecit_pvalue
    from experiments.ecit.pool_tests import question_seed

    class LocalECIT(CIT_Base):
        def __init__(self, data, subset_size=400, combine="stable", stable_alpha=1.75, seed=0, **kwargs):
            with np.printoptions(threshold=16, edgeitems=2):
                super().__init__(data, **kwargs)
            self.check_cache_method_consistent("ecit_local", f"{subset_size}|{combine}|{stable_alpha}|{seed}")
            self.m, self.comb, self.alpha, self.seed = subset_size, combine, stable_alpha, seed

        def __call__(self, X, Y, condition_set=None):
            xs, ys, zs, key = self.get_formatted_XYZ_and_cachekey(X, Y, condition_set)
            if key not in self.pvalue_cache:
                _PC_COUNTS["tests"] = _PC_COUNTS.get("tests", 0) + 1
                d = self.data
                self.pvalue_cache[key] = ecit_pvalue(d[:, xs], d[:, ys], d[:, zs] if zs else None, base="kci",
                                                     subset_size=self.m, combine=self.comb, alpha=self.alpha,
                                                     rng=question_seed(self.seed, xs, ys, zs))
            return self.pvalue_cache[key]

    register_ci_test("ecit_local", LocalECIT)
    return "ecit_local"


def run_pc(ctx: UnitContext) -> dict:
    from causallearn.search.ConstraintBased.PC import pc

    from envs.causal import make_dataset
    from envs.causal.graphs import shd, skeleton_scores
    from experiments.ecit.pc import truth_marks
    variant = ctx.setting["variant"]
    n = ctx.size("pc_full_n", PC_FULL_N) if variant == "full" else ctx.size("pc_ecit_n", PC_ECIT_N)
    graph = {**PC_GRAPH, **ctx.size("pc_graph", {})}
    ds = make_dataset({**graph, "n": n, "seed": _seed(ctx.seed, 7)})  # same DAG for both variants (seeded alike)
    _PC_COUNTS["tests"] = 0
    start = time.process_time()
    if variant == "full":
        cg = pc(ds.data, LEVEL, "kci", stable=True, show_progress=False, max_k=PC_MAX_K)
        tuned = None
    else:
        tuned = tuned_setting(ctx.records())
        method, alpha = COMBINERS[tuned["combiner"]]
        cg = pc(ds.data, LEVEL, _register_local_ecit(), stable=True, show_progress=False, max_k=PC_MAX_K,
                subset_size=tuned["subset_size"], combine=method, stable_alpha=alpha, seed=ctx.seed)
    cpu = time.process_time() - start
    truth, est = truth_marks(ds.dag), np.asarray(cg.G.graph)
    scores = skeleton_scores(truth, est)
    return {"metrics": {"shd": shd(truth, est), "f1": scores["f1"], "precision": scores["precision"],
                        "recall": scores["recall"], "cpu_s": cpu, "n": n,
                        "tests": _PC_COUNTS["tests"] if variant == "ecit" else None},
            "tuned": tuned, "dag": ds.dag.astype(int).tolist()}
