"""Experiment ``ecit_pc``: the PC algorithm (causal-learn's) with every CI test an E-CIT on the shared pool, against
PC with the base test on all rows (also on the pool), on graphs with known truth.

    python -m experiments.run experiment=ecit_pc                                           # 2 random DAGs
    python -m experiments.run experiment=ecit_pc "experiment.data={kind:sem,n:20000,d:10,sem:nonlinear}"
    python -m experiments.run experiment=ecit_pc "experiment.data={kind:sachs}" experiment.graphs=1  # real data

PC calls its test one question at a time; each E-CIT question becomes K / subsets_per_request requests of the
pool's "cit" sampler (pool_tests.py), which the pool batches and spreads over its workers. The data reaches the
workers once per graph: published by the driver (``publish: true``, one version per graph) or rebuilt by each
worker from the dataset spec in the requests (``publish: false``). A question's split is seeded by the question
(sorted x, y and conditioning set), so PC asking (y, x) after (x, y), or a retried request, gets the same p-value.
Scores: SHD to the true CPDAG and skeleton precision / recall / F1 (envs/causal/graphs.py), distinct CI tests and
the workers' CPU seconds spent in them. Sachs' consensus graph has a cycle: it is scored as drawn (directed marks).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from algos.ecit import BASES, COMBINERS
from cluster.metrics import Progress
from experiments.ecit.pool_tests import Question, ask, question_seed

log = logging.getLogger(__name__)

TEST_NAME = "ecit_pool"  # the name PC knows the pool-backed test by (causal-learn's register_ci_test)
# PC deep-copies its graph, test included: the test holds a token, and the pool handle and counters live here
_SESSIONS: dict[str, dict[str, Any]] = {}


@dataclass
class Config:
    data: dict = field(default_factory=lambda: {"kind": "sem", "n": 4000, "d": 6, "degree": 2.0,
                                                "sem": "nonlinear", "noise": "t3"})
    graphs: int = 2                   # datasets (seeds seed*1000 + g) for kind sem; others: 1
    base: str = "kci"
    base_options: dict = field(default_factory=dict)
    subset_size: int = 400
    combine: str = "stable"
    alpha: float = 1.75               # the stable law's index
    pc_alpha: float = 0.05            # PC's level for every CI test
    max_k: int | None = 2             # largest conditioning set PC tries (None: no limit)
    full: bool = True                 # also PC with the base test on all rows (skipped above full_max_n)
    full_max_n: int = 4000
    subsets_per_request: int = 4
    publish: bool = True              # data to the workers by pool.publish (else: spec in every request)

    def __post_init__(self) -> None:
        if self.base not in BASES:
            raise ValueError(f"experiment.base: choose from {list(BASES)}, got {self.base!r}")
        if self.combine not in COMBINERS:
            raise ValueError(f"experiment.combine: choose from {list(COMBINERS)}, got {self.combine!r}")
        if self.graphs < 1:
            raise ValueError(f"experiment.graphs: must be >= 1, got {self.graphs}")
        if self.subset_size < 4:
            raise ValueError(f"experiment.subset_size: must be >= 4, got {self.subset_size}")
        if not 0 < self.pc_alpha < 1:
            raise ValueError(f"experiment.pc_alpha: must be in (0, 1), got {self.pc_alpha}")
        if self.max_k is not None and self.max_k < 0:
            raise ValueError(f"experiment.max_k: must be >= 0 or null, got {self.max_k}")
        if self.data.get("kind") not in ("sem", "sachs", "file"):
            raise ValueError(f"experiment.data.kind: choose sem, sachs or file, got {self.data.get('kind')!r}")


def _register() -> None:
    from causallearn.utils.cit import CIT_Base, register_ci_test

    class PoolTest(CIT_Base):
        """A causal-learn CI test whose p-values come from the pool: E-CIT, or the base test on all rows."""

        def __init__(self, data, session="", sampler_config=None, subset_size=400, combine="stable",
                     stable_alpha=1.75, seed=0, per_request=4, full=False, weights=None, spec=None, **kwargs):
            with np.printoptions(threshold=16, edgeitems=2):  # causal-learn hashes str(data)
                super().__init__(data, **kwargs)
            self.check_cache_method_consistent(TEST_NAME, f"{sampler_config}|{subset_size}|{combine}|{stable_alpha}|"
                                                          f"{seed}|{full}")
            self.session, self.sampler_config, self.subset_size = session, sampler_config, subset_size
            self.combine, self.alpha, self.seed, self.per_request = combine, stable_alpha, seed, per_request
            self.full, self.weights, self.spec = full, weights, spec

        def __call__(self, X, Y, condition_set=None):
            xs, ys, zs, key = self.get_formatted_XYZ_and_cachekey(X, Y, condition_set)
            if key in self.pvalue_cache:
                return self.pvalue_cache[key]
            q = Question(xs, ys, zs, self.sample_size, question_seed(self.seed, xs, ys, zs),
                         None if self.weights else self.spec, self.full)
            session = _SESSIONS[self.session]
            (answer,) = ask(session["pool"], [q], self.sampler_config, self.subset_size, self.per_request,
                            weights=self.weights)
            p = answer.pvalue(self.combine, self.alpha)
            session["tests"] += 1
            session["cpu_s"] += answer.cpu_s
            self.pvalue_cache[key] = p
            return p

    register_ci_test(TEST_NAME, PoolTest)


def truth_marks(dag: np.ndarray) -> np.ndarray:
    """Endpoint matrix PC's output is scored against: the CPDAG of a DAG, or a cyclic graph's own directed marks."""
    from envs.causal.graphs import cpdag
    from envs.causal.sem import topological_order
    try:
        topological_order(dag)
    except ValueError:
        marks = np.zeros(dag.shape, dtype=int)
        for i, j in zip(*np.nonzero(dag)):
            marks[j, i], marks[i, j] = 1, -1
        return marks
    return cpdag(dag)


def run_pc(data: np.ndarray, truth: np.ndarray, exp: Config, pool, seed: int, full: bool, weights: str | None,
           spec: dict) -> dict[str, Any]:
    from causallearn.search.ConstraintBased.PC import pc

    from envs.causal.graphs import shd, skeleton_scores
    token = f"{seed}-{full}-{time.monotonic_ns()}"
    stats = _SESSIONS[token] = {"pool": pool, "tests": 0, "cpu_s": 0.0}
    start = time.perf_counter()
    try:
        cg = pc(data, exp.pc_alpha, TEST_NAME, stable=True, show_progress=False, max_k=exp.max_k, session=token,
                sampler_config={"base": exp.base, "options": exp.base_options}, subset_size=exp.subset_size,
                combine=exp.combine, stable_alpha=exp.alpha, seed=seed, per_request=exp.subsets_per_request,
                full=full, weights=weights, spec=spec)
    finally:
        del _SESSIONS[token]
    est = np.asarray(cg.G.graph)
    scores = skeleton_scores(truth, est)
    return {"shd": shd(truth, est), "f1": scores["f1"], "precision": scores["precision"],
            "recall": scores["recall"], "tests": stats.get("tests", 0), "cpu_s": stats.get("cpu_s", 0.0),
            "wall_s": time.perf_counter() - start, "edges_true": int(np.sum(truth != 0) // 2),
            "edges_found": int(np.sum(est != 0) // 2)}


def run(cfg: dict, ctx) -> dict[str, Any]:
    from envs.causal import make_dataset
    from experiments.ecit.plots import plot_pc

    _register()
    exp: Config = ctx.typed["experiment"]
    pool = ctx.pool
    graphs = exp.graphs if exp.data["kind"] == "sem" else 1
    methods = ["ecit"] + (["full"] if exp.full else [])
    results: dict[str, list[dict]] = {m: [] for m in methods}
    key = f"{ctx.run_id}/ecit-data"
    start = time.perf_counter()
    progress = Progress("ecit_pc", graphs, unit="graphs")
    for g in range(graphs):
        spec = {**exp.data, "seed": cfg["seed"] * 1000 + g} if exp.data["kind"] == "sem" else dict(exp.data)
        ds = make_dataset(spec)
        if ds.dag is None:
            raise ValueError(f"experiment.data: {spec} has no known graph to score PC against")
        truth = truth_marks(ds.dag)
        weights = None
        if exp.publish:
            pool.publish(key, ds.data)
            weights = key
        n = len(ds.data)
        for m in methods:
            if m == "full" and n > exp.full_max_n:
                log.info("graph %d: n = %d > full_max_n = %d, PC with the base test on all rows skipped", g, n,
                         exp.full_max_n)
                continue
            res = run_pc(ds.data, truth, exp, pool, cfg["seed"] * 1000 + g, m == "full", weights, spec)
            results[m].append(res)
            ctx.log(g * len(methods) + methods.index(m), {"graph": g, "method_id": methods.index(m), **res})
            progress.update(g + 1, force=True, method=m, SHD=res["shd"], F1=res["f1"], tests=res["tests"],
                            cpu_s=res["cpu_s"], wall_s=res["wall_s"])
    results = {m: r for m, r in results.items() if r}
    title = (f"PC on {exp.data.get('kind')} (n={n}), base {exp.base}, E-CIT m={exp.subset_size} "
             f"{exp.combine}" + (f" alpha={exp.alpha}" if exp.combine == "stable" else ""))
    plot = plot_pc(results, ctx.run_dir.path / "plots", title)
    mean = {m: {k: float(np.mean([r[k] for r in rs])) for k in ("shd", "f1", "precision", "recall", "tests",
                                                                   "cpu_s", "wall_s")} for m, rs in results.items()}
    return {"experiment": "ecit_pc", "data": exp.data, "n": n, "graphs": graphs, "base": exp.base,
            "subset_size": exp.subset_size, "combine": exp.combine, "alpha": exp.alpha, "methods": results,
            "mean": mean, "plots": [plot], "wall_s": time.perf_counter() - start}
