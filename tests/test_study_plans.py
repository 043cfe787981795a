"""What every registered study's plan must be, whatever its method: each unit's function resolves, its ``after``
names units of the plan, a unit that is not a stage fits the runner's per-unit estimate (20 core-minutes), and every
reported unit runs on a reported seed. Each study's own test checks what is particular to it."""
from __future__ import annotations

import importlib

import pytest

from benchmarks.study import STUDIES
from benchmarks.study.core import REPORTED_SEEDS
from benchmarks.study.runner import load_study


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_plan_units_resolve_order_fit_and_report_on_reported_seeds(study):
    plan = load_study(STUDIES[study]).plan()
    names = [u.name for u in plan]
    assert len(set(names)) == len(names), "unit names are unique"
    for u in plan:
        module, fn = u.fn.split(":")
        assert callable(getattr(importlib.import_module(module), fn)), u.fn
        assert set(u.after) <= set(names), (u.name, u.after)
        assert u.role == "stage" or u.est_core_s <= 20 * 60, (u.name, u.est_core_s)
        assert u.role != "report" or u.seed in REPORTED_SEEDS, (u.name, u.seed)
