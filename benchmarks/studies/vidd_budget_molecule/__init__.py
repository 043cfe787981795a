"""vidd_budget_molecule: ``plan.py`` (units, declared rules and predictions), ``report.py`` (its units are vidd_budget's)."""
from benchmarks.studies.vidd_budget_molecule.plan import STUDY

__all__ = ["STUDY"]
