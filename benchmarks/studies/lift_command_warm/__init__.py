"""The lift_command_warm study (issue 47, second start model): ``plan`` declares it; its stage, units and report are
``lift_command``'s (the same design), with the start model continued from ``init_agent.pt``."""
from benchmarks.studies.lift_command_warm.plan import STUDY  # noqa: F401
