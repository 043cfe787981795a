"""E-CIT at many subsets (issue 51): plan in :mod:`.plan`, units in :mod:`.units`, report in :mod:`.report`."""
from benchmarks.studies.ecit_power.plan import STUDY

__all__ = ["STUDY"]
