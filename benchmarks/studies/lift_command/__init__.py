"""The lift_command study (issue 47): ``plan`` declares it, ``stage`` makes its start model, ``units`` runs its gates
and method units, ``report`` renders its records."""
from benchmarks.studies.lift_command.plan import STUDY  # noqa: F401
