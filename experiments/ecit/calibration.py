"""Experiment ``ecit``: one conditional independence question, E-CIT against the base test on all rows.

    python -m experiments.run experiment=ecit                                      # KCI base, n 1e3 .. 1.6e4
    python -m experiments.run experiment=ecit experiment.base=fisherz "experiment.data={nonlinear:false}"
    python -m experiments.sweep experiment=ecit sweep=ecit_subset_combiner          # subset size x combiner

For every n in ``ns``: ``reps`` datasets where X _||_ Y | Z holds (null) and ``reps`` where it does not
(alternative, envs.causal.triplets), each tested by E-CIT (subset tests on the shared pool's "cit" sampler, combined
here by every combiner in ``combiners``) and, while n <= ``full_max_n``, by the base test on all rows. Reported per
n: type-I error and power at ``level`` (with exact binomial 95 % intervals), worker CPU seconds per test, and the
first subset alone as a reference. The datasets travel as specs (kind + seed), never as arrays.
Metrics: run_dir/metrics (one step per n); plots: ecit_error_power.png, ecit_time.png; summary.json: the table.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from algos.ecit import BASES, COMBINERS
from experiments.ecit.pool_tests import Question, ask, question_seed, requests_for

log = logging.getLogger(__name__)


@dataclass
class Config:
    ns: list[int] = field(default_factory=lambda: [1000, 2000, 4000, 16000])
    reps: int = 40                    # null datasets and as many alternatives per n
    base: str = "kci"                 # kci | fisherz | kci_lp
    base_options: dict = field(default_factory=dict)  # causal-learn options of the base test
    subset_size: int = 400            # m: rows per subset (K = n // m subsets)
    combine: str = "stable"           # the headline combiner (sweep metric); all of `combiners` are reported
    alpha: float = 1.75               # the stable law's index (1 = Cauchy, 2 = Stouffer)
    combiners: list[str] = field(default_factory=lambda: list(COMBINERS))
    level: float = 0.05
    full_max_n: int = 2000            # the base test on all rows only up to here (full KCI is O(n^3))
    subsets_per_request: int = 4      # subset tests per pool request (the pool batches requests further)
    data: dict = field(default_factory=lambda: {"dz": 1, "noise": "t3", "effect": 0.5, "nonlinear": True})

    def __post_init__(self) -> None:
        if not self.ns or min(self.ns) < 8:
            raise ValueError(f"experiment.ns: a non-empty list of sample sizes >= 8, got {self.ns}")
        if self.reps < 1:
            raise ValueError(f"experiment.reps: must be >= 1, got {self.reps}")
        if self.base not in BASES:
            raise ValueError(f"experiment.base: choose from {list(BASES)}, got {self.base!r}")
        if self.combine not in COMBINERS or not set(self.combiners) <= set(COMBINERS):
            raise ValueError(f"experiment.combine / combiners: choose from {list(COMBINERS)}")
        if self.subset_size < 4:
            raise ValueError(f"experiment.subset_size: must be >= 4, got {self.subset_size}")
        if not 0 < self.alpha <= 2:
            raise ValueError(f"experiment.alpha: must be in (0, 2], got {self.alpha}")
        if not 0 < self.level < 1:
            raise ValueError(f"experiment.level: must be in (0, 1), got {self.level}")
        if self.subsets_per_request < 1:
            raise ValueError(f"experiment.subsets_per_request: must be >= 1, got {self.subsets_per_request}")
        unknown = sorted(set(self.data) - {"dz", "noise", "effect", "nonlinear"})
        if unknown:
            raise ValueError(f"experiment.data: unknown keys {unknown} (dz, noise, effect, nonlinear)")


def rate_with_interval(rejections: int, total: int) -> dict[str, float]:
    """Rejection rate with its exact (Clopper-Pearson) 95 % interval."""
    from scipy.stats import binomtest
    ci = binomtest(rejections, total).proportion_ci(0.95)
    return {"rate": rejections / total, "low": float(ci.low), "high": float(ci.high), "n": total}


def questions_for(n: int, exp: Config, seed: int, full: bool) -> list[Question]:
    dz = int(exp.data.get("dz", 1))
    out = []
    for dependent in (False, True):
        for rep in range(exp.reps):
            data_seed = question_seed(seed, [n], [int(dependent)], [], rep)
            spec = {"kind": "triplet", "n": n, "seed": data_seed, "dependent": dependent, **exp.data}
            split = question_seed(data_seed, [0], [1], list(range(2, 2 + dz)))
            out.append(Question([0], [1], list(range(2, 2 + dz)), n, split, spec, full, (dependent, rep)))
    return out


def summarise_n(n: int, answers: list, full_answers: list, exp: Config) -> dict[str, Any]:
    row: dict[str, Any] = {"n": n, "subsets": len(answers[0].pvalues)}
    methods: dict[str, list[float]] = {}
    for c in exp.combiners:
        methods[c] = [a.pvalue(c, exp.alpha) for a in answers]
    methods["one_subset"] = [a.pvalues[0] for a in answers]
    if full_answers:
        methods["full"] = [a.pvalue() for a in full_answers]
    dep = {"ecit": [a.question.tag[0] for a in answers], "full": [a.question.tag[0] for a in full_answers]}
    for name, ps in methods.items():
        truth = np.array(dep["full" if name == "full" else "ecit"])
        reject = np.array(ps) <= exp.level
        row[name] = {"type1": rate_with_interval(int(reject[~truth].sum()), int((~truth).sum())),
                     "power": rate_with_interval(int(reject[truth].sum()), int(truth.sum()))}
    row["ecit_cpu_s"] = float(np.mean([a.cpu_s for a in answers]))
    row["full_cpu_s"] = float(np.mean([a.cpu_s for a in full_answers])) if full_answers else None
    return row


def calibrated_power(row: dict, method: str, level: float) -> float:
    """Power, or 0 when the type-I error's 95 % interval lies above the level (a test that cannot hold its level
    must not win a sweep)."""
    return row[method]["power"]["rate"] if row[method]["type1"]["low"] <= level else 0.0


def run(cfg: dict, ctx) -> dict[str, Any]:
    from cluster.metrics import Progress
    from experiments.ecit.plots import plot_calibration

    exp: Config = ctx.typed["experiment"]
    pool = ctx.pool
    config = {"base": exp.base, "options": exp.base_options}
    rows = []
    start = time.perf_counter()
    sizes = Progress("ecit", len(exp.ns), unit="n")
    for step, n in enumerate(sorted(exp.ns)):
        questions = questions_for(n, exp, cfg["seed"], False)
        full_questions = questions_for(n, exp, cfg["seed"], True) if n <= exp.full_max_n else []
        total = sum(len(requests_for(q, exp.subset_size, exp.subsets_per_request))
                    for q in questions + full_questions)
        progress = Progress(f"ecit n={n}", total, unit="requests")
        answers = ask(pool, questions + full_questions, config, exp.subset_size, exp.subsets_per_request,
                      on_result=lambda done, _total: progress.update(done))
        row = summarise_n(n, answers[:len(questions)], answers[len(questions):], exp)
        rows.append(row)
        head = row[exp.combine]
        metrics = {"n": n, "type1": head["type1"]["rate"], "power": head["power"]["rate"],
                   "calibrated_power": calibrated_power(row, exp.combine, exp.level), "ecit_cpu_s": row["ecit_cpu_s"],
                   **{f"type1_{c}": row[c]["type1"]["rate"] for c in exp.combiners},
                   **{f"power_{c}": row[c]["power"]["rate"] for c in exp.combiners}}
        if "full" in row:
            metrics.update(full_type1=row["full"]["type1"]["rate"], full_power=row["full"]["power"]["rate"],
                           full_cpu_s=row["full_cpu_s"])
        ctx.log(step, metrics)
        sizes.update(step + 1, force=True, n=n, combiner=exp.combine, type1=metrics["type1"],
                     power=metrics["power"], cpu_s_per_test=row["ecit_cpu_s"],
                     **({"full_type1": metrics["full_type1"], "full_power": metrics["full_power"],
                         "full_cpu_s_per_test": row["full_cpu_s"]} if "full" in row else {}))
    plots = plot_calibration(rows, exp, ctx.run_dir.path / "plots")
    last = rows[-1]
    return {"experiment": "ecit", "base": exp.base, "subset_size": exp.subset_size, "combine": exp.combine,
            "alpha": exp.alpha, "level": exp.level, "reps": exp.reps, "rows": rows, "plots": plots,
            "type1": last[exp.combine]["type1"]["rate"], "power": last[exp.combine]["power"]["rate"],
            "calibrated_power": calibrated_power(last, exp.combine, exp.level),
            "wall_s": time.perf_counter() - start}
