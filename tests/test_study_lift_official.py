"""The lift_official study (issue 36): its start model's hold rule and its pretraining stage at a tiny size."""
from __future__ import annotations

import pytest

from benchmarks.study import lift_official as study
from benchmarks.study.runner import run_unit_inline

TINY = {"pretrain_target": 320, "extend_steps": 160, "pretrain_cap": 640, "chunk_steps": 320,
        "pretrain_eval_every": 160, "pretrain_eval_episodes": 1, "wm_rows": 320,
        "preset_overrides": {"sac": {"min_replay_size": 128, "batch_size": 32}},
        "exp": {"wm_pretrain_steps": 20, "wm_eval_every": 10}}


@pytest.mark.parametrize("returns, target, expected", [
    ([2774.0, 2786.0, 2681.0], 280_000, 280_000),  # within 15 %: held
    ([1720.0, 2541.0, 2300.0], 200_000, 220_000),  # 36 % apart: extended
    ([1720.0, 2541.0, 2300.0], 300_000, 300_000),  # at the cap: held whatever they say
    ([2000.0, 2100.0], 200_000, 220_000),          # fewer than three evaluations cannot hold
    ([0.0, 0.0, 0.0], 200_000, 220_000),           # a mean of 0 has no relative spread
])
def test_pretrain_target_extends_while_the_evaluations_disagree(returns, target, expected):
    assert study.pretrain_target(returns, target) == expected


def test_stage_extends_to_the_cap_then_fits_the_physics_model(tmp_path):
    root = tmp_path / "results"
    record = None
    for _ in range(8):  # chunks of 320 steps: 320 -> 480 -> 640 (three evaluations of an untrained policy disagree)
        record = run_unit_inline(study.STUDY, "pretrain", root, overrides=TINY)
        if record is not None:
            break
    assert record is not None
    art = root / "lift_official" / "artifacts"
    targets = (art / "pretrain" / "target.json").read_text()
    assert '"held": true' in targets
    assert record["metrics"]["env_steps"] in (320, 480, 640)
    assert [h["to"] for h in record["metrics"]["target_history"]] == [480, 640][:len(record["metrics"]["target_history"])]
    assert all(p.exists() for p in study.STUDY.start_files(art))
    assert set(record["metrics"]["stage2"]) == {"physics"}
