"""E-CIT beyond the paper (issue 42): ``plan.py``, ``units.py``, ``report.py``."""
from benchmarks.studies.ecit_beyond.plan import STUDY

__all__ = ["STUDY"]
