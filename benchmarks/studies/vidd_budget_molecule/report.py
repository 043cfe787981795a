"""``vidd_budget_molecule``'s report from its records alone (two seeds: per-seed values, no intervals)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.studies.vidd_budget.plan import FRACTIONS, PRIMARY
from benchmarks.studies.vidd_budget_molecule.plan import FIXED, PREDICTIONS, SEEDS, SIZES, STUDY_NAME, build_units


def report(records: list[dict], out_dir: Path) -> str:
    """Median QED and NLL per method at each evaluation point, per seed (two seeds: no intervals)."""
    by_unit = {r["unit"]: r for r in records}
    reported = [u for u in build_units() if u.role == "report"]
    n_done = sum(u.name in by_unit for u in reported)
    points = [int(f * SIZES["budget"]) for f in FRACTIONS]
    pre = by_unit.get("pretrain", {}).get("metrics", {}).get("pretrained")
    lines = [f"## VIDD fix on molecules: {PRIMARY} and DDPO at 16k queries (`python -m benchmarks.study {STUDY_NAME} "
             "report`)", "",
             f"**A check, not a test:** {len(SEEDS)} seeds give a direction per seed, no interval, and it has no control "
             "(no no-refresh run): it can say whether the fix moves QED off the pretrained model on both seeds, not "
             "by how much or why.", "",
             f"**Status: {n_done}/{len(reported)} units recorded.** Fixed settings (no tuning): "
             + ", ".join(f"{m} lr {lr:g}" + ("" if a is None else f" alpha {a:g}") for m, (lr, a) in FIXED.items())
             + ". Predictions (declared before any seed): " + " ".join(PREDICTIONS), "",
             (f"Pretrained model: median QED {pre['reward_median']:.3f}, NLL {pre['nll']:.1f}." if pre else ""), ""]
    lines += ["| method | seed | " + " | ".join(f"QED @{q}" for q in points) + f" | NLL @{points[-1]} |",
              "|" + "---|" * (len(points) + 3)]
    for method in FIXED:
        for seed in SEEDS:
            rec = by_unit.get(f"{method}-s{seed}")
            if rec is None:
                continue
            vals = [f"{v:.3f}" for v in rec["curves"]["reward_median"]]
            lines.append(f"| {method} | {seed} | " + " | ".join(vals) + f" | {rec['metrics']['nll']:.1f} |")
    if n_done == len(reported):
        gap = [np.mean([by_unit[f"ddpo-s{s}"]["curves"]["reward_median"][-1]
                        - by_unit[f"{PRIMARY}-s{s}"]["curves"]["reward_median"][-1] for s in SEEDS])]
        lines += ["", f"DDPO - {PRIMARY} in median QED at {points[-1]}: {gap[0]:+.3f} (mean of {len(SEEDS)} seeds)."]
    return "\n".join(lines).rstrip() + "\n"
