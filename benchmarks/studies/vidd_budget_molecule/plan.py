"""Does the issue-37 fix carry over to molecules? The primary of ``vidd_budget`` and DDPO on 2 seeds at 16k queries.

    nice -n 19 python -m benchmarks.study vidd_budget_molecule run &
    python -m benchmarks.study vidd_budget_molecule report

A check, not a comparison: the task, denoiser recipe and evaluation of ``vidd_molecule`` (QED on MOSES molecules) with
the official defaults of ``vidd_budget`` (``METHODS`` there: every reverse step distilled, batch-wide weights, one Adam
step per batch, ``value_scheme="official"``), no tuning: both methods run at the official DNA script's lr 1e-4
(``algos/vidd/README.md``) and VIDD at alpha 0.1 (vidd_molecule's alpha), declared here before any unit ran. Seeds 10
and 11; evaluations at 2k, 4k, 8k and 16k queries (:data:`benchmarks.studies.vidd_budget.plan.FRACTIONS`).

Cost (~0.16 core-h declared): measured on tiny units (pretrain 20 steps, 2048 queries, these sizes otherwise, shared
2-core machine, 2026-12-05): vidd_official 4.9 core-s (18 iterations, 3 refreshes, 4 evaluations), DDPO 16.7 core-s;
scaled to 16k that is ~40 and ~130 core-s, declared as 70 and 180 (pessimistic); pretrain 84 core-s (vidd_molecule's
stage). At 16k vidd_official gets ~140 iterations and ~28 teacher refreshes (~120 queries per iteration)."""
from __future__ import annotations

from pathlib import Path

from benchmarks.studies.vidd_budget.plan import PRIMARY
from benchmarks.study.core import Study, Unit
from benchmarks.study.vidd_common import BUNDLE, TaskSpec


STUDY_NAME = "vidd_budget_molecule"
SEEDS = (10, 11)
FIXED = {PRIMARY: (1e-4, 0.1), "ddpo": (1e-4, None)}  # (lr, alpha), declared before any unit ran
PREDICTIONS = ("M1: vidd_official's median QED at 16k is above the pretrained model's on both seeds.",
               "M2: at 16k DDPO's median QED is higher and vidd_official's NLL lower.")
SIZES = dict(seq_len=40, n_train=10_000, n_heldout=500, d_model=64, n_layers=2, n_heads=4, pretrain_steps=1500,
             pretrain_batch_size=64, pretrain_lr=2e-3, pretrain_warmup=50, stage_steps_per_call=None,
             stage_margin_s=120.0, T=8, budget=16384, tune_budget=4096, batch_size=8, ddpo_steps=None,
             eval_samples=256, curve_samples=64, best_of_n_max=32, min_refreshes=10)
COST_S = {"pretrain": 84.0, PRIMARY: 70.0, "ddpo": 180.0}
SPEC = TaskSpec(study=STUDY_NAME, title="molecules (QED), 16k oracle queries: does the fix carry over",
                task="molecule", reward="qed", reward_name="QED (MOSES molecules, RDKit)", sizes=SIZES,
                variants=tuple(FIXED), cost_s=COST_S)


def build_units() -> list[Unit]:
    plan = [Unit("pretrain", "stage", "pretrain", None, "benchmarks.study.vidd_common:pretrain_stage",
                 est_core_s=COST_S["pretrain"])]
    for seed in SEEDS:
        for method, (lr, alpha) in FIXED.items():
            plan.append(Unit(f"{method}-s{seed}", "report", method, seed,
                             "benchmarks.studies.vidd_budget.units:budget_unit",
                             setting={"method": method, "lr": lr, "alpha": alpha}, after=("pretrain",),
                             est_core_s=COST_S[method]))
    return plan


STUDY = Study(name=STUDY_NAME, title=SPEC.title, units=build_units,
              start_files=lambda artifacts: [Path(artifacts) / BUNDLE],
              report=f"benchmarks.studies.{STUDY_NAME}.report:report")
