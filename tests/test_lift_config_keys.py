"""Every ``experiment.*`` key of lift_finetune does what it names, or is refused at validation (issues 36, 47).

Each field of ``experiments.lift.finetune_config.Config`` (iterated: a new key without a case fails) has a case:
  ``Acts(value, method, check)``  a tiny run of the learner's loop, watched from inside (``tests/lift_key_observe``);
      ``check(observed, exp)`` asserts the thing the key names (the horizon in the model rows, a buffer's capacity,
      the SAC steps taken, ...). It must hold for the default run at the default value and for the changed run at the
      case's value, and fail for the default run at the case's value. Logged rows, which echo the config, are unread.
  ``Driver(check)``  keys the driver reads (methods, envs, the pretraining run, the device): an assertion on the
      driver's own functions (``finetune_config.check``, ``finetune_envs``, ``Config.method_list``, ``learner_device``).
``REFUSED``: a value ``Config(...)`` must refuse, for every key with a range. ``tests/test_lift_loop_observed.py``:
the horizon check fails when rollouts are forced to horizon 1, the stage-2-from-file path, ``sac_deterministic``.
"""
from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

from experiments.lift.finetune_config import FINETUNE_SAC, Config
from tests.lift_key_observe import TASK, TINY, Observed, build_start, in_epoch, observe, schedules

torch.set_num_threads(1)
RAW = {"env": {"task": TASK}, "train": {"num_workers": 1}}  # what ``check`` reads of the composed config


class Acts(NamedTuple):
    value: Any
    method: str
    check: Callable[["Observed", Config], None]  # asserts that a run shows the config's value of the key
    # other keys set in both runs, for a key that acts only beside them (compared with that context's own run)
    context: dict | None = None


class Driver(NamedTuple):
    check: Callable[[Path], None]


@pytest.fixture(scope="module")
def start(tmp_path_factory) -> Path:
    return build_start(tmp_path_factory.mktemp("pretrain"))


@pytest.fixture(scope="module")
def runs(start, tmp_path_factory) -> Callable[..., Observed]:
    root = tmp_path_factory.mktemp("runs")
    return lambda overrides, method, **kw: observe(start, root, overrides, method, **kw)


@pytest.fixture(scope="module")
def default_run(runs) -> Callable[[str], Observed]:
    """The default run of a method, once per module."""
    cache: dict[str, Observed] = {}

    def get(method: str) -> Observed:
        if method not in cache:
            cache[method] = runs({}, method)
        return cache[method]
    return get


# ---------------------------------------------------------------------------------------------- driver-level keys

def _check(start: Path, **overrides: Any) -> None:
    from experiments.lift.finetune_config import check
    check(Config(**{"pretrain_run": str(start), **overrides}), RAW)


def _pretrain_run(start: Path) -> None:
    """The driver reads the pretraining run's files (``pretrain_files``) and refuses a missing or incomplete one."""
    from experiments.config import ConfigError
    from experiments.lift.finetune_config import pretrain_files
    _check(start)
    assert pretrain_files(str(start))["agent"] == start / "agent.pt"
    with pytest.raises(ConfigError, match="pretrain_run: missing"):
        _check(start, pretrain_run=None)
    with pytest.raises(ConfigError, match="lacks policy.pt, agent.pt"):
        _check(start, pretrain_run=str(start / "data"))


def _reference_change(start: Path) -> None:
    """The env of the pre-change return: the pretraining run's own change by default, else the key; checked."""
    import yaml

    from experiments.config import ConfigError
    from experiments.lift.finetune_config import finetune_envs
    reference = {"name": "gravity", "scale": 2.0}
    assert finetune_envs(Config(pretrain_run=str(start)), TASK)[1] is None  # the start records no change
    assert finetune_envs(Config(pretrain_run=str(start), reference_change=reference), TASK)[1] == reference
    _check(start, reference_change=reference)
    with pytest.raises(ConfigError, match="experiment.reference_change"):
        _check(start, reference_change={"name": "no_such_change"})
    own = start.parent / f"{start.name}-with-change"  # a pretraining run that records its change
    if not own.exists():
        shutil.copytree(start, own)
    (own / "config.yaml").write_text(yaml.safe_dump({"experiment": {"change": {"name": "gear", "scale": 0.5}}}))
    assert finetune_envs(Config(pretrain_run=str(own)), TASK)[1] == {"name": "gear", "scale": 0.5}
    assert finetune_envs(Config(pretrain_run=str(own), reference_change=reference), TASK)[1] == reference


def _method(start: Path) -> None:
    """The driver finetunes ``method_list()``: the method alone unless ``methods`` names several."""
    assert Config(method="sac_finetune").method_list() == ["sac_finetune"]
    assert Config(method="sac_finetune", methods=["lift", "mbpo_wm"]).method_list() == ["lift", "mbpo_wm"]
    with pytest.raises(ValueError, match="unknown method"):
        Config(method="no_such_method")


def _methods(start: Path) -> None:
    assert Config(methods=["mbpo_wm", "lift"]).method_list() == ["mbpo_wm", "lift"]
    with pytest.raises(ValueError, match="unknown method"):
        Config(methods=["lift", "no_such_method"])


def _device(start: Path) -> None:
    """The learner computes on ``learner_device(device)``: the Train worker's device for auto, else the one named."""
    from experiments.lift.learner_common import learner_device
    assert learner_device(Config(device="cpu").device) == torch.device("cpu")
    assert learner_device(Config(device="meta").device) == torch.device("meta")  # named, not resolved: honoured
    with pytest.raises(ValueError, match="experiment.device"):
        Config(device="no_such_device")


# ------------------------------------------------------------------------------------------------------- the table
# Each check asserts, on what a run did, the thing its key names for the config ``exp`` it ran (or would run) with.

def check_change(o: Observed, exp: Config) -> None:
    from experiments.lift.finetune_config import DEFAULT_CHANGES
    change = exp.change or DEFAULT_CHANGES[TASK]  # the driver's rule (finetune_envs), the run's env seen below
    assert change["name"] == "gravity"
    assert o.real_env_gravity == pytest.approx(-9.81 * change["scale"])


def check_epochs(o: Observed, exp: Config) -> None:
    assert o.epochs == exp.epochs and len(o.eval_episodes) == exp.epochs


def check_real_steps_per_epoch(o: Observed, exp: Config) -> None:
    assert sum(c["rows"] for c in in_epoch(o.collects, 1)) == exp.real_steps_per_epoch


def check_prefill(o: Observed, exp: Config) -> None:
    first_refit = o.calls.index(("retrain", 0))
    assert sum(c["rows"] for c in o.collects[:sum(1 for k, _ in o.calls[:first_refit] if k == "collect")]) == \
        exp.prefill_steps


def check_num_real_envs(o: Observed, exp: Config) -> None:
    assert o.real_envs == exp.num_real_envs and all(c["rows"] % exp.num_real_envs == 0 for c in o.collects)


def check_rollout_batch(o: Observed, exp: Config) -> None:
    assert o.branches and all(b["starts"] == exp.rollout_batch for b in o.branches)


def check_horizon(o: Observed, exp: Config) -> None:
    """The horizon each branch's model rows show: rows per start state (a branch yields starts x H rows)."""
    horizon, _ = schedules(exp)
    assert o.branches and all(b["rows"] == b["starts"] * horizon(b["epoch"]) for b in o.branches), \
        [(b["epoch"], b["rows"] / b["starts"]) for b in o.branches]


def check_hupt(o: Observed, exp: Config) -> None:
    _, hupt = schedules(exp)
    for e in range(o.epochs):
        assert len(in_epoch(o.branches, e)) == hupt(e)


def check_updates_per_rollout(o: Observed, exp: Config) -> None:
    assert o.updates and all(u["sac_steps"] == exp.updates_per_rollout for u in o.updates)


def check_real_ratio(o: Observed, exp: Config) -> None:
    assert o.updates and all(u["real_rows"] == round(exp.real_ratio * u["rows"]) for u in o.updates)


def check_flush(o: Observed, exp: Config) -> None:
    after = [r["model_buffer_after"] for r in o.refits if "model_buffer_after" in r]
    assert after and (all(n == 0 for n in after) if exp.model_buffer_flush else all(n > 0 for n in after))


def check_model_buffer_capacity(o: Observed, exp: Config) -> None:
    horizon, hupt = schedules(exp)
    assert o.model_buffer_capacity and all(
        c == min(hupt(e) * exp.rollout_batch * horizon(e), exp.model_buffer_capacity) for e, c in o.model_buffer_capacity)


def check_obs_noise(o: Observed, exp: Config) -> None:
    noisy = sum(b["noisy_rows"] for b in o.branches)
    assert (noisy > 0) if exp.obs_noise > 0 else (noisy == 0)


def check_env_buffer(o: Observed, exp: Config) -> None:
    assert o.real_buffer_capacity == exp.env_buffer_capacity


def check_sac(o: Observed, exp: Config) -> None:
    sac = exp.finetune_sac()
    assert all(u["tau"] == sac["tau"] and u["rows"] == sac["batch_size"] * u["sac_steps"] for u in o.updates)


def check_load_optimizer_state(o: Observed, exp: Config) -> None:
    steps = o.updates[0]["adam_steps"]  # the actor's Adam step count at the first finetuning step
    assert steps > 0 if exp.load_optimizer_state else steps == 0


def check_load_alpha(o: Observed, exp: Config) -> None:
    reset = o.updates[0]["log_alpha"] == pytest.approx(exp.finetune_sac()["init_log_alpha"])
    assert not reset if exp.load_alpha else reset


def check_retrain_first(o: Observed, exp: Config) -> None:
    order = [k for k, e in o.calls if e == 1]
    assert order[0] == ("retrain" if exp.wm_retrain_first else "collect"), order


def check_update_normalizer(o: Observed, exp: Config) -> None:
    before, after = o.normalizer_count
    assert after > before if exp.update_normalizer else after == before


def check_scalers(o: Observed, exp: Config) -> None:
    assert o.scalers_moved is (exp.wm_scalers != "keep")


def check_baseline_updates(o: Observed, exp: Config) -> None:
    calls = max(1, round(exp.real_steps_per_epoch * exp.baseline_updates_per_step / exp.updates_per_rollout))
    assert sum(u["sac_steps"] for u in in_epoch(o.updates, 1)) == calls * exp.updates_per_rollout


def check_chunk(o: Observed, exp: Config) -> None:
    n = exp.num_real_envs
    assert in_epoch(o.collects, 1)[0]["rows"] == -(-min(exp.baseline_chunk_steps, exp.real_steps_per_epoch) // n) * n


def check_wm_hidden(o: Observed, exp: Config) -> None:
    assert o.hidden == tuple(exp.wm_hidden)


def check_prior_mode(o: Observed, exp: Config) -> None:
    assert o.prior_substeps is (exp.wm_prior_mode == "substep")


def check_pretrain_steps(o: Observed, exp: Config) -> None:
    assert o.stage2["cfg"].train_steps == exp.wm_pretrain_steps and o.stage2["steps"] <= exp.wm_pretrain_steps


def check_pretrain_rows(o: Observed, exp: Config) -> None:
    assert o.stage2["rows"] == min(exp.wm_pretrain_rows, 300)


def check_pretrain_seed(o: Observed, exp: Config) -> None:
    assert o.stage2["seed"] == exp.wm_pretrain_seed


def check_retrain_steps(o: Observed, exp: Config) -> None:
    assert o.refits and all(r["cfg"].train_steps == exp.wm_retrain_steps and r["steps"] <= exp.wm_retrain_steps
                            for r in o.refits)


def check_loss_horizon(o: Observed, exp: Config) -> None:
    assert o.refits and all(r["cfg"].loss_horizon == exp.wm_loss_horizon for r in o.refits)
    assert o.stage2["cfg"].loss_horizon == 1  # stage 2 is LIFT's one-step fit whatever the key says


def check_eval_every(o: Observed, exp: Config) -> None:
    assert o.stage2["cfg"].eval_every == exp.wm_eval_every


def check_patience(o: Observed, exp: Config) -> None:
    assert o.stage2["stopper"].patience == exp.wm_patience
    assert o.refits and all(r["stopper"].patience == exp.wm_patience for r in o.refits)


def check_min_improvement(o: Observed, exp: Config) -> None:
    assert o.stage2["stopper"].min_improvement == exp.wm_min_improvement
    assert o.refits and all(r["stopper"].min_improvement == exp.wm_min_improvement for r in o.refits)


def check_ensemble(o: Observed, exp: Config) -> None:
    assert o.ensemble == exp.blackbox_ensemble_size


def check_eval_episodes(o: Observed, exp: Config) -> None:
    assert o.eval_episodes and all(n == exp.eval_episodes for n in o.eval_episodes)


def check_stop_at_recovery(o: Observed, exp: Config) -> None:
    assert o.epochs == (1 if exp.stop_at_recovery else exp.epochs)  # every evaluation recovers here


CASES: dict[str, Acts | Driver] = {
    "pretrain_run": Driver(_pretrain_run),
    "change": Acts({"name": "gravity", "scale": 2.0}, "sac_finetune", check_change),  # TINY: the default (x4)
    "method": Driver(_method),
    "methods": Driver(_methods),
    "epochs": Acts(1, "sac_finetune", check_epochs),
    "real_steps_per_epoch": Acts(32, "sac_finetune", check_real_steps_per_epoch),
    "prefill_steps": Acts(0, "lift", check_prefill),
    "num_real_envs": Acts(3, "sac_finetune", check_num_real_envs),
    "rollout_batch": Acts(8, "lift", check_rollout_batch),
    "horizon_schedule": Acts([0, 1, 2, 3], "lift", check_horizon),
    "hupt_schedule": Acts([0, 1, 2, 3], "lift", check_hupt),
    "updates_per_rollout": Acts(3, "lift", check_updates_per_rollout),
    "real_ratio": Acts(0.5, "lift", check_real_ratio),
    "model_buffer_flush": Acts(True, "lift", check_flush),
    "model_buffer_capacity": Acts(8, "lift", check_model_buffer_capacity),
    "obs_noise": Acts(0.0, "lift", check_obs_noise),
    "env_buffer_capacity": Acts(30, "sac_finetune", check_env_buffer),
    "sac": Acts({"batch_size": 16, "tau": 0.01}, "sac_finetune", check_sac),  # each sac.* key: test_each_sac_key_...
    "load_optimizer_state": Acts(False, "sac_finetune", check_load_optimizer_state),
    "load_alpha": Acts(True, "sac_finetune", check_load_alpha),
    "wm_retrain_first": Acts(False, "lift", check_retrain_first),
    "update_normalizer": Acts(False, "sac_finetune", check_update_normalizer),
    "wm_scalers": Acts("keep", "lift", check_scalers),
    "baseline_updates_per_step": Acts(0.5, "sac_finetune", check_baseline_updates),
    "baseline_chunk_steps": Acts(8, "sac_finetune", check_chunk),
    "wm_hidden": Acts([8], "lift", check_wm_hidden),
    "wm_prior_mode": Acts("substep", "lift", check_prior_mode),
    "wm_pretrain_steps": Acts(10, "lift", check_pretrain_steps),
    "wm_pretrain_rows": Acts(100, "lift", check_pretrain_rows),
    "wm_pretrain_seed": Acts(1, "lift", check_pretrain_seed),
    "wm_retrain_steps": Acts(1, "lift", check_retrain_steps),
    "wm_loss_horizon": Acts(1, "lift", check_loss_horizon),
    "wm_eval_every": Acts(1, "lift", check_eval_every),
    "wm_patience": Acts(1, "lift", check_patience),
    "wm_min_improvement": Acts(0.5, "lift", check_min_improvement),
    "blackbox_ensemble_size": Acts(2, "mbpo_wm", check_ensemble),
    "eval_episodes": Acts(2, "sac_finetune", check_eval_episodes),
    "stop_at_recovery": Acts(True, "sac_finetune", check_stop_at_recovery),
    "reference_change": Driver(_reference_change),
    "device": Driver(_device),
}
# A value validation refuses, for every key with a range or a set of choices.
REFUSED: dict[str, Any] = {
    "method": "no_such_method", "methods": ["no_such_method"], "epochs": 0, "real_steps_per_epoch": 0,
    "prefill_steps": -1, "num_real_envs": 0, "rollout_batch": 0, "horizon_schedule": [0, 1, 1],
    "hupt_schedule": [0, 4, 10], "updates_per_rollout": 0, "real_ratio": 1.5, "model_buffer_capacity": 0,
    "obs_noise": -1.0, "env_buffer_capacity": 0, "sac": {"no_such_key": 1.0}, "wm_scalers": "no_such_mode",
    "baseline_updates_per_step": 0.0, "baseline_chunk_steps": 0, "wm_hidden": [16, 0],
    "wm_prior_mode": "no_such_mode", "wm_pretrain_steps": 0, "wm_pretrain_rows": 0, "wm_retrain_steps": 0,
    "wm_loss_horizon": 0, "wm_eval_every": 0, "wm_patience": 0, "wm_min_improvement": -0.1,
    "blackbox_ensemble_size": 0, "eval_episodes": 0, "device": "no_such_device",
}
KEYS = [f.name for f in dataclasses.fields(Config)]


def _param(key: str):
    return pytest.param(key, marks=pytest.mark.slow) if key in CASES else key


@pytest.mark.parametrize("key", [_param(k) for k in KEYS])
def test_every_key_does_what_it_names_or_is_checked_by_the_driver(key, request):
    """``key`` at the case's value: the run shows that value where the key acts (the default run shows the default,
    and the default run does not pass for the changed value, so the check can tell them apart); or the driver's
    use of it is asserted. A key without a case fails: add one when adding a key."""
    if key not in CASES:
        pytest.fail(f"experiment.{key} has no case in CASES: say what it does (or that validation refuses it)")
    case = CASES[key]
    start = request.getfixturevalue("start")
    if isinstance(case, Driver):
        case.check(start)
        return
    assert case.value != getattr(Config(**TINY), key), f"{key}: the case's value is the tiny run's own"
    runs = request.getfixturevalue("runs")
    context = case.context or {}
    base_exp = Config(**{**TINY, **context})
    changed_exp = Config(**{**TINY, **context, key: case.value})
    base = runs(context, case.method) if context else request.getfixturevalue("default_run")(case.method)
    changed = runs({**context, key: case.value}, case.method)
    case.check(base, base_exp)
    case.check(changed, changed_exp)
    with pytest.raises(AssertionError):  # the default run must not show the changed value
        case.check(base, changed_exp)


@pytest.mark.parametrize("key, value", sorted(REFUSED.items()))
def test_out_of_range_values_are_refused(key, value):
    with pytest.raises(ValueError, match=f"experiment.{key}" if key != "methods" else "experiment.method"):
        Config(**{key: value})


@pytest.mark.parametrize("key, value", [("gamma", 0.0), ("tau", 1.5), ("actor_lr", -1.0), ("batch_size", 0)])
def test_bad_sac_values_are_refused(key, value):
    with pytest.raises(ValueError, match=f"experiment.sac: SACConfig.{key}"):
        Config(sac={key: value})


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(FINETUNE_SAC))
def test_each_sac_key_reaches_the_learners_agent(key, start):
    """``experiment.sac.<key>`` is what the learner's agent trains with (``build_agent``): its SACConfig, the
    optimisers' learning rates, the reset temperature."""
    from experiments.lift.finetune_learner import build_agent
    value = FINETUNE_SAC[key] * 2 if key != "gamma" else 0.95
    agent, cfg = build_agent(start / "agent.pt", Config(sac={key: value}), torch.device("cpu"))
    assert getattr(cfg, key) == value
    default_agent, default_cfg = build_agent(start / "agent.pt", Config(), torch.device("cpu"))
    assert getattr(default_cfg, key) == FINETUNE_SAC[key]
    opts = {"actor_lr": agent.actor_opt, "critic_lr": agent.critic_opt, "alpha_lr": agent.alpha_opt}
    if key in opts:
        assert all(g["lr"] == value for g in opts[key].param_groups)
    if key == "init_log_alpha":
        assert float(agent.log_alpha.log_alpha.detach()) == pytest.approx(value)
        assert float(default_agent.log_alpha.log_alpha.detach()) == pytest.approx(FINETUNE_SAC[key])
    if key == "target_entropy_coef":
        assert agent.target_entropy == pytest.approx(-value * agent.act_dim)
