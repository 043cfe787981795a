"""AttnRL vs GRPO and branching controls on the cone task (issues 25, 38): ``plan.py`` (units, gates, predictions),
``units.py``, ``runs.py`` (one RL run and its evaluation), ``report.py`` and ``gates.py``."""
from benchmarks.studies.attnrl.plan import STUDY

__all__ = ["STUDY"]
