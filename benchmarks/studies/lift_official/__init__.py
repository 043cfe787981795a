"""LIFT finetuning as its authors run it (issue 36): ``plan.py`` (units, declared rules), ``units.py``, ``report.py``."""
from benchmarks.studies.lift_official.plan import STUDY

__all__ = ["STUDY"]
