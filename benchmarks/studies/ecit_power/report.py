"""The ecit_power report (plan: :mod:`benchmarks.studies.ecit_power.plan`): whatever records exist, partial tables
marked as such; ecit_beyond's null rows and Sachs graphs read from its records."""
from __future__ import annotations

from pathlib import Path


from benchmarks.studies.ecit_power.beyond import beyond_sachs
from benchmarks.studies.ecit_power.plan import LEVEL, M, STUDY, TUNE_SEEDS, TUNED
from benchmarks.studies.ecit_power.report_tables import (dial_lines, equal_cpu_lines, power_lines, predictions, reading,
                                                         tuning_lines, width_lines)
from benchmarks.studies.ecit_power.rows import Rows
from benchmarks.studies.ecit_power.sachs import sachs_lines
from benchmarks.studies.ecit_power.units import tuned_effects

def report(records: list[dict], out_dir: Path) -> str:
    plan = STUDY.plan()
    by = {r["unit"]: r for r in records}
    reported = [u for u in plan if u.role == "report"]
    done = sum(u.name in by for u in reported)
    study_root = Path(out_dir).parent
    partial = done < len(reported)
    lines = ["## E-CIT at many subsets: the power the exact null costs, where it breaks, the released width (issue 51)",
             "", f"Records: `benchmarks/studies/ecit_power/records/` ({sum(u.name in by for u in plan)} of {len(plan)} "
             f"units; reported units {done} of {len(reported)}"
             + (": **partial**, every table reads only the records there are" if partial else "")
             + f"), {sum(r.get('cpu_s', 0.0) for r in records) / 3600:.2f} core-hours. Plan, predictions and the "
             "authors' first objection fixed in `benchmarks/studies/ecit_power/plan.py` before any reported unit "
             "ran; reused rows read from ecit_beyond's records (its null datasets, subsets and seeds: the same "
             "data). Command: `nice -n 19 python -m benchmarks.study ecit_power run`, then `... ecit_power report`. "
             f"Subsets of {M} rows, combiner {TUNED}, level {LEVEL}; intervals exact binomial 95 %, pooled over seeds "
             "10-14.", "",
             "**The authors' first objection**: \"power at an effect shrunk for each K hides what E-CIT is for (at a "
             "fixed effect its power goes to 1 as K grows), and you test with a sub-test and a width that are not "
             "ours.\" The answer in the design: a fixed effect saturates (both tests read ~1.00 at K = 160 and the "
             "null's cost is invisible), so the effects are tuned per K to mid power on tuning seeds, and the tuning "
             "table below is the fixed-effect view across K; the released width (`est_width='median'`) is a named "
             "option and the K = 160 rows run under both widths; kci_lp is the released KCI statistic with another "
             "null, and gamma KCI's size-adjusted power is the control that isolates what that null costs; the "
             "paper's own comparison (E-CIT against the base test on all rows) is made at equal CPU.", ""]
    rows = Rows(records, study_root)
    tunes = {u: r for u, r in by.items() if r["role"] == "tune"}
    tuned = tuned_effects(tunes, TUNE_SEEDS) if len(tunes) >= len(TUNE_SEEDS) else None
    lines += tuning_lines(tunes, tuned)
    lines += power_lines(rows, tuned, by)
    lines += width_lines(rows)
    lines += equal_cpu_lines(records)
    lines += dial_lines(records)
    lines += sachs_lines(beyond_sachs(study_root))
    lines += predictions(rows, records, partial)
    lines += reading(rows, records)
    return "\n".join(lines)

