"""vidd_budget: ``plan.py`` (units, declared rules and predictions), ``units.py``, ``report.py``."""
from benchmarks.studies.vidd_budget.plan import STUDY

__all__ = ["STUDY"]
