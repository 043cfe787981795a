"""The main job. The tour names no method: each method package declares its stages and report section (TOUR), the
tour loops over them. The full tour with tiny budgets runs in tests/test_rehearsal.py on the multi-node cluster
(``TINY``, ``check_tour``); here one method's tour runs on the embedded cluster, and the pieces are checked alone."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments.tour import TourPart, merge_overrides, tour_parts
from tests.helpers import TINY, check_tour

def test_every_method_declares_a_tour_part_with_importable_section_and_check():
    from experiments.registry import experiment_modules
    from experiments.tour import _load_attr, section_fn
    parts = tour_parts()
    assert {"lift", "vidd", "attnrl", "ecit"} <= set(parts)
    for method, part in parts.items():
        assert isinstance(part, TourPart) and part.stages and part.paper_scale
        assert callable(section_fn(part)) and callable(_load_attr(part.check))
        for st in part.stages:
            assert st.experiment in experiment_modules(), (method, st.experiment)


@pytest.mark.parametrize("budget", ["laptop", "tiny"])
def test_every_declared_stage_composes_and_validates_at_both_budgets(budget):
    """The budgets in experiments/<method>/tour.py are real configs (a stage that reads an earlier stage's run
    directory is composed only: its check needs that run's files)."""
    from experiments.config import compose, load
    from experiments.tour import RUN_DIR
    for method, part in tour_parts().items():
        for st in part.stages:
            overrides = merge_overrides(st.overrides, st.tiny if budget == "tiny" else ())
            argv = [f"experiment={st.experiment}", *(RUN_DIR.sub("/nonexistent", o) for o in overrides)]
            if any(RUN_DIR.search(o) for o in overrides):
                assert compose(argv)["experiment"]["name"] == st.experiment
            else:
                assert load(argv)["experiment"]["name"] == st.experiment, (method, st)


def test_the_tour_files_name_no_method():
    """A fifth method joins the tour by declaring TOUR in its own package: nothing in the tour's files changes."""
    root = Path(__file__).resolve().parents[1]
    names = set(tour_parts())
    names |= {st.stage_name for p in tour_parts().values() for st in p.stages}
    for rel in ("experiments/tour.py", "experiments/tour_report.py", "configs/experiment/tour.yaml"):
        words = set(re.findall(r"[A-Za-z_]+", (root / rel).read_text()))
        assert not (words & names), f"{rel} names {sorted(words & names)}"


def test_plan_merges_overrides_by_key_and_fills_earlier_run_dirs(tmp_path):
    from experiments.tour import Config, plan
    assert merge_overrides(["a=1", "b=2"], ["+a=3"], ["c=4"]) == ["+a=3", "b=2", "c=4"]
    method = next(m for m, p in tour_parts().items() if any("<run_dir:" in o for st in p.stages for o in st.overrides))
    part = tour_parts()[method]
    first = part.stages[0].stage_name
    exp = Config(methods=[method], tiny=True, overrides={first: ["seed=7"]})
    ctx = SimpleNamespace(run_dir=SimpleNamespace(path=tmp_path))
    (stages,) = plan({}, ctx, exp).values()
    assert [s.experiment for s in stages] == [st.experiment for st in part.stages]
    assert "seed=7" in stages[0].overrides
    for declared in part.stages[0].tiny:  # the test budget replaces the laptop budget of the same key
        assert declared in stages[0].overrides
    later = " ".join(o for s in stages[1:] for o in s.overrides)
    assert str(stages[0].run_dir) in later and "<run_dir:" not in later
    with pytest.raises(ValueError, match="unknown stage"):
        Config(methods=[method], overrides={"no_such_stage": ["a=1"]})
    with pytest.raises(ValueError, match="choose from"):
        Config(methods=["no_such_method"])


def test_one_method_tours_the_embedded_cluster_and_its_report_reads_its_runs(tmp_path, pool_name):
    from experiments.run import main
    main(["experiment=tour", "experiment.methods=[ecit]", *TINY, f"output_dir={tmp_path}", "run_name=t",
          f"pool.name={pool_name}", "experiment.status_every_s=5"])
    check_tour(tmp_path / "tour" / "t", ["ecit"])


def test_status_line_reads_progress_behind_ray_prefixes(tmp_path):
    from experiments.tour import _last_progress
    log = tmp_path / "driver.log"
    log.write_text("\x1b[36m(RayTrainWorker pid=23530)\x1b[0m [vidd vidd] 1368/8192 queries (17%) 136.8 queries/s ETA 0:49\n"
                   "(raylet) WARNING: 14 PYTHON worker processes have been started\n")
    assert _last_progress(log) == "1368/8192 queries (17%) 136.8 queries/s ETA 0:49"
    log.write_text("[tour] cluster up\n")
    assert _last_progress(log) == "starting"


def test_a_paper_claim_holds_only_when_the_seed_paired_interval_excludes_zero():
    from experiments.tour_report import paired_verdict
    assert paired_verdict([0.3]).startswith("not shown at this budget (1 seed")  # one seed is never enough
    assert paired_verdict([0.10, 0.12, 0.09, 0.11, 0.10]) == "yes"
    assert paired_verdict([0.1, -0.2, 0.05, 0.0, -0.1]).startswith("not shown at this budget (5 seeds")
    assert paired_verdict([-0.10, -0.12, -0.11]) == "no (reversed)"
    assert paired_verdict([-300, -250, -280], higher_is_better=False) == "yes"  # fewer real steps is better


def test_the_level_claim_needs_enough_nulls_to_say_yes():
    from experiments.ecit.tour import level_verdict
    assert level_verdict({"rate": 0.0, "low": 0.0, "high": 0.6, "n": 4}, 0.05).startswith("not shown")
    assert level_verdict({"rate": 0.05, "low": 0.03, "high": 0.08, "n": 1000}, 0.05) == "yes"
    assert level_verdict({"rate": 0.2, "low": 0.15, "high": 0.25, "n": 400}, 0.05) == "no"


def test_lifts_recovery_claim_names_the_run_that_never_recovered():
    from experiments.lift.tour import _recovery_verdict
    assert _recovery_verdict(None, 400) == "not shown at this budget (LIFT did not recover within the run)"
    assert "neither LIFT nor SAC" in _recovery_verdict(None, None)
    assert _recovery_verdict(400, 800).startswith("not shown at this budget (1 seed")  # one seed: no interval
