"""E-CIT: ensemble conditional independence tests and PC (issue 28): ``plan.py``, ``units.py``, ``report.py``."""
from benchmarks.studies.ecit.plan import STUDY

__all__ = ["STUDY"]
