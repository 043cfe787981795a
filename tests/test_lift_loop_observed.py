"""LIFT's finetuning loop watched from inside (``tests/lift_key_observe``), beside the key table of
``tests/test_lift_config_keys.py``: the horizon check fails when model rollouts ignore the schedule (so the table's
horizon case reads the rollouts, not an echo), the stage-2-from-file path a study's start model takes, and
``sac_deterministic``, the control that separates LIFT's model from its deterministic real actions."""
from __future__ import annotations

import pytest
import torch

from experiments.lift.finetune_config import Config
from tests.lift_key_observe import TASK, TINY, in_epoch, schedules
from tests.test_lift_config_keys import CASES, check_horizon, check_model_buffer_capacity, check_retrain_steps
from tests.test_lift_config_keys import runs, start  # noqa: F401  (the key table's fixtures: one tiny start model)

torch.set_num_threads(1)


@pytest.mark.slow
def test_the_horizon_check_fails_when_rollouts_ignore_the_schedule(runs, monkeypatch):
    """Model rollouts forced to horizon 1 (whatever H the schedule asks for) fail the horizon_schedule case, though
    the loop still logs the scheduled H: the check reads the model rows, not the config's echo."""
    import algos.lift.finetune as finetune_algos
    real = finetune_algos.branch_rollouts

    def one_step(model, start_states, policy, obs_fn, reward_fn, scale, horizon, *args, **kwargs):
        return real(model, start_states, policy, obs_fn, reward_fn, scale, 1, *args, **kwargs)
    monkeypatch.setattr(finetune_algos, "branch_rollouts", one_step)
    case = CASES["horizon_schedule"]
    forced = runs({"horizon_schedule": case.value}, case.method)
    with pytest.raises(AssertionError):
        case.check(forced, Config(**{**TINY, "horizon_schedule": case.value}))


@pytest.mark.slow
def test_the_stage2_file_is_the_start_model_and_the_keys_still_act(start, runs, tmp_path):
    """``config["stage2"]`` (a study's start model): the learner starts from that file's model and fits no stage 2 of
    its own, whatever the wm_pretrain_* keys say, and the loop's keys act as without it."""
    from experiments.lift.world_models import make_world_model
    exp = Config(**TINY)
    model = make_world_model("physics", TASK, exp, 5)  # weights no stage-2 fit of this test makes (seed 5)
    saved = {"model": {k: v.clone() for k, v in model.state_dict().items()}, "metrics": {"error_1step": 0.5}}
    path = tmp_path / "physics.pt"
    torch.save(saved, path)
    probe: dict = {}
    seen = runs({"horizon_schedule": [0, 1, 2, 3], "wm_pretrain_steps": 10, "wm_retrain_steps": 1,
                 "model_buffer_capacity": 8}, "lift", stage2_file=path, probe=probe)
    assert seen.stage2 == {}, "a stage-2 fit ran although the start model came from the file"
    assert all(torch.equal(probe["stage2_state"][k], v) for k, v in saved["model"].items())
    changed = Config(**{**TINY, "horizon_schedule": [0, 1, 2, 3], "wm_retrain_steps": 1, "model_buffer_capacity": 8})
    for check in (check_horizon, check_retrain_steps, check_model_buffer_capacity):
        check(seen, changed)


@pytest.mark.slow
def test_sac_deterministic_acts_deterministically_without_a_model_at_lifts_sac_steps(runs):
    """sac_deterministic (the control separating the model from deterministic acting): every real request is
    deterministic, no model rollout runs, and each epoch takes exactly LIFT's SAC steps (HUPT(e) x
    updates_per_rollout), the same count the lift run takes."""
    exp = Config(**TINY)
    _, hupt = schedules(exp)
    seen, lift = runs({}, "sac_deterministic"), runs({}, "lift")
    assert seen.collects and all(c["deterministic"] for c in seen.collects)
    assert not seen.branches and not seen.refits and seen.stage2 == {}
    for e in range(exp.epochs):
        steps = sum(u["sac_steps"] for u in in_epoch(seen.updates, e))
        assert steps == hupt(e) * exp.updates_per_rollout == sum(u["sac_steps"] for u in in_epoch(lift.updates, e))
    sac = runs({}, "sac_finetune")
    assert not all(c["deterministic"] for c in sac.collects)  # the check can fail: the baseline explores
