"""Studies that finish: each study is a list of small units whose records are committed as they end.

    python -m benchmarks.study all status              # done / pending / core-hours left per study
    nice -n 19 python -m benchmarks.study all run &    # a background lane (two at most on 2 cores)
    python -m benchmarks.study lift report             # RESULTS.md section and plots from the records alone

Layout: ``benchmarks/studies/<study>/`` is one study: its code, ``REPORT.md`` and figures; ``records/<unit>.json``
hold its finished units and ``records/artifacts/`` its long stages' checkpoints. This package is the machinery they share.
"""

# name -> "module:ATTR" of its Study; a study whose module is missing shows as "not built" in status
STUDIES: dict[str, str] = {
    "lift": "benchmarks.study.lift:STUDY",
    "lift_official": "benchmarks.study.lift_official:STUDY",
    "vidd_molecule": "benchmarks.study.vidd_molecule:STUDY",
    "vidd_dna": "benchmarks.study.vidd_dna:STUDY",
    "vidd_budget": "benchmarks.study.vidd_budget:STUDY",
    "vidd_budget_molecule": "benchmarks.study.vidd_budget_molecule:STUDY",
    "attnrl": "benchmarks.study.attnrl:STUDY",
    "attnrl_units": "benchmarks.study.attnrl_units:STUDY",
    "ecit": "benchmarks.study.ecit:STUDY",
    "ecit_beyond": "benchmarks.study.ecit_beyond:STUDY",
}
