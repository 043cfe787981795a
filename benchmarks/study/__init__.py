"""Studies that finish: each study is a list of small units whose records are committed as they end.

    python -m benchmarks.study all status              # done / pending / core-hours left per study
    nice -n 19 python -m benchmarks.study all run &    # a background lane (two at most on 2 cores)
    python -m benchmarks.study lift_official report    # REPORT.md and plots from the records alone

Layout: ``benchmarks/studies/<study>/`` is one study: its code (a package whose ``STUDY`` the registry below names),
``REPORT.md`` and figures; ``records/<unit>.json`` hold its finished units and ``records/artifacts/`` its long stages'
checkpoints. This package is the machinery they share, and the stages two studies of one method share
(``lift_stages``, ``vidd_common``, ``ecit_data``). Superseded studies: ``benchmarks/studies/archive/``.
"""

# name -> "module:ATTR" of its Study; a study whose module is missing shows as "not built" in status
STUDIES: dict[str, str] = {
    "lift_official": "benchmarks.studies.lift_official:STUDY",
    "lift_command": "benchmarks.studies.lift_command:STUDY",
    "lift_command_warm": "benchmarks.studies.lift_command_warm:STUDY",
    "vidd_budget": "benchmarks.studies.vidd_budget:STUDY",
    "vidd_budget_molecule": "benchmarks.studies.vidd_budget_molecule:STUDY",
    "vidd_plateau": "benchmarks.studies.vidd_plateau:STUDY",
    "attnrl": "benchmarks.studies.attnrl:STUDY",
    "ecit": "benchmarks.studies.ecit:STUDY",
    "ecit_beyond": "benchmarks.studies.ecit_beyond:STUDY",
    "ecit_power": "benchmarks.studies.ecit_power:STUDY",
}
