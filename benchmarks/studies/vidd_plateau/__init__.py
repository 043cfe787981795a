"""Study ``vidd_plateau`` (issue 46): VIDD against DDPO, each run to its plateau or an equal-CPU cap, compared on the
reward-KL frontier. ``plan.py`` (the design and the plan), ``rules.py`` (the declared rules), ``units.py``,
``report.py``."""
from benchmarks.studies.vidd_plateau.plan import STUDY

__all__ = ["STUDY"]
