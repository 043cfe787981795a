"""Every ``experiment.*`` key of lift_finetune changes the run or is refused at validation (issue 36).

Each field of ``experiments.lift.finetune_config.Config`` (iterated, so a new key without a case fails here) has one
case in ``CASES``:
  ``Changes(value, method)``  the learner's loop (``finetune_learner.run_one_rank``: one rank, the pool's samplers in
                              this process) at the tiny ``TINY`` config with ``key=value`` must differ from the default
                              run of ``method``: its numeric metric rows (timings left out) or its final policy.
                              Keys that matter to some methods only run under one where they matter.
  ``Driver(check)``           keys the driver reads (which methods, which envs, the pretraining run, the device):
                              an assertion on the driver's own functions (``finetune_config.check``,
                              ``finetune_envs``, ``Config.method_list``, ``learner_device``).
``REFUSED`` adds a value ``Config(...)`` must refuse for every key with a range. The default runs are repeated once
each: a run is reproducible bit for bit, so an ignored key cannot pass as a change.

The start is tiny and built here: an untrained-but-updated ``SACAgent`` (``agent.pt`` as lift_pretrain saves it,
with Adam and temperature states to load or not) and 300 random-policy InvertedPendulum transitions as the Parquet
replay. Every run shares this pretraining directory, so its stage-2 fits are cached there
(``world_models.stage2_cache_path``): a setting that shapes the fit but not the cache key would load a stale fit and
show up as a key that changes nothing.
"""
from __future__ import annotations

import dataclasses
import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

from experiments.lift.finetune_config import FINETUNE_SAC, Config

torch.set_num_threads(1)
TASK = "inverted_pendulum"
SEED = 3
RAW = {"env": {"task": TASK}, "train": {"num_workers": 1}}  # what ``check`` reads of the composed config
# LIFT's loop at a size that runs in about a second: 2 epochs of 48 real steps on 2 envs after a 24-step prefill,
# 1 -> 2 branches of 16 start states at horizon 1 -> 2, small world models fitted for 20 (stage 2) and <= 10 (refit)
# Adam steps with early stopping that can trigger (checks every 5 steps, patience 2).
TINY: dict[str, Any] = dict(
    epochs=2, real_steps_per_epoch=48, prefill_steps=24, num_real_envs=2, rollout_batch=16,
    horizon_schedule=[0, 1, 1, 2], hupt_schedule=[0, 1, 1, 2], updates_per_rollout=2, sac={"batch_size": 32},
    baseline_chunk_steps=24, wm_hidden=[16, 16], wm_pretrain_steps=20, wm_retrain_steps=10, wm_eval_every=5,
    wm_patience=2, eval_episodes=1, blackbox_ensemble_size=3,
    device="cpu")  # bit-reproducible on a machine with a GPU too (its kernels need not be)
# The recovery line the learner gets: pre-change = zero-shot = 0, so every evaluation "recovers" (stop_at_recovery).
PRE_CHANGE_RETURN = ZERO_SHOT_RETURN = 0.0


class Changes(NamedTuple):
    value: Any
    method: str
    # other keys set in both runs, for a key that acts only beside them (compared with that context's own run)
    context: dict | None = None


class Driver(NamedTuple):
    check: Callable[[Path], None]


# ------------------------------------------------------------------------------------------------ the tiny start

@pytest.fixture(scope="module")
def start(tmp_path_factory) -> Path:
    """A lift_pretrain run directory: agent.pt, policy.pt and data/replay-rank0 with the world-model columns."""
    from algos.lift.agent import SACAgent
    from algos.lift.replay import ReplayBuffer, transition_fields
    from algos.lift.sac import SACConfig, update
    from cluster.store import ParquetStore
    from envs.control.rollout import VectorRollout, random_policy
    run = tmp_path_factory.mktemp("pretrain")
    rollout = VectorRollout(TASK, 4, seed=0, physics_state=True)
    batch, _ = rollout.collect(random_policy(rollout.single_action_space, 0), 75)  # 300 rows, ~50 episodes
    rollout.close()
    ParquetStore(run / "data" / "replay-rank0").append(batch)
    torch.manual_seed(0)
    cfg = SACConfig(actor_hidden=(32, 32), critic_hidden=(32, 32), batch_size=32, init_log_alpha=-1.0, bf16=False)
    agent = SACAgent(4, 1, cfg)
    agent.obs_normalizer.update(batch["obs"])
    buffer = ReplayBuffer(len(batch["reward"]), transition_fields(4, 1))
    buffer.add({k: batch[k] for k in buffer.specs})
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):  # Adam moments and a moved temperature: load_optimizer_state and load_alpha have something
        update(agent, lambda n: buffer.sample(n, gen), cfg)
    torch.save(agent.state_dict(), run / "agent.pt")  # as PretrainLearner.close saves them
    torch.save(agent.policy_state(), run / "policy.pt")
    return run


# ------------------------------------------------------------------------------------------------------- the runs

class Fingerprint(NamedTuple):
    rows: Any  # the numeric metric rows without timings (pandas DataFrame)
    policy: str  # sha1 of the final policy's parameters

    def same_as(self, other: "Fingerprint") -> bool:
        return self.policy == other.policy and self.rows.equals(other.rows)


_runs = {"count": 0}


def run(start: Path, root: Path, overrides: dict[str, Any], method: str) -> Fingerprint:
    """The learner's loop at ``TINY`` + ``overrides`` for ``method`` as the driver sets it up (its envs from
    ``finetune_envs``), in a fresh run directory; its fingerprint."""
    from cluster.metrics import read_metrics
    from experiments.lift.finetune_config import finetune_envs, pretrain_files
    from experiments.lift.finetune_learner import run_one_rank
    exp = Config(**{**TINY, "pretrain_run": str(start), **overrides})
    files = pretrain_files(exp.pretrain_run)
    change, _ = finetune_envs(exp, TASK)
    _runs["count"] += 1
    run_path = root / f"run{_runs['count']}"
    shutil.rmtree(run_path, ignore_errors=True)
    config = {"experiment": dataclasses.asdict(exp), "pool": {}, "run_path": str(run_path),
              "run_id": f"keys-{_runs['count']}", "task": TASK, "seed": SEED, "torch_threads": 1, "change": change,
              "method": method, "agent_path": str(files["agent"]), "replay": [str(p) for p in files["replay"]],
              "pretrain_run": str(files["run"]), "stage2": None, "pre_change_return": PRE_CHANGE_RETURN,
              "zero_shot_return": ZERO_SHOT_RETURN}
    run_one_rank(config)
    df = read_metrics(run_path)
    timing = [c for c in df.columns if c == "time" or c.endswith("_s") or "seconds" in c]
    rows = df.drop(columns=timing).select_dtypes("number")
    rows = rows[sorted(rows.columns)].reset_index(drop=True)
    policy = torch.load(run_path / f"policy-{method}.pt", weights_only=True)
    digest = hashlib.sha1()
    for name, tensor in sorted(policy["actor"].items()):
        digest.update(name.encode() + tensor.numpy().tobytes())
    for key in ("obs_mean", "obs_std"):
        digest.update(policy[key].numpy().tobytes())
    assert len(rows) >= 2, "the run logged no epoch"
    return Fingerprint(rows, digest.hexdigest())


@pytest.fixture(scope="module")
def runs(start, tmp_path_factory) -> Callable[[dict[str, Any], str], Fingerprint]:
    root = tmp_path_factory.mktemp("runs")
    return lambda overrides, method: run(start, root, overrides, method)


@pytest.fixture(scope="module")
def default_run(runs) -> Callable[[str], Fingerprint]:
    """The default run of a method, once per module."""
    cache: dict[str, Fingerprint] = {}

    def get(method: str) -> Fingerprint:
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

CASES: dict[str, Changes | Driver] = {
    "pretrain_run": Driver(_pretrain_run),
    "change": Changes({"name": "gravity", "scale": 2.0}, "sac_finetune"),  # TINY runs the task's default (x4)
    "method": Driver(_method),
    "methods": Driver(_methods),
    "epochs": Changes(1, "sac_finetune"),
    "real_steps_per_epoch": Changes(32, "sac_finetune"),
    "prefill_steps": Changes(0, "lift"),
    "num_real_envs": Changes(3, "sac_finetune"),
    "rollout_batch": Changes(8, "lift"),
    "horizon_schedule": Changes([0, 1, 2, 3], "lift"),
    "hupt_schedule": Changes([0, 1, 2, 3], "lift"),
    "updates_per_rollout": Changes(3, "lift"),
    "real_ratio": Changes(0.5, "lift"),
    "model_buffer_flush": Changes(True, "lift"),
    "model_buffer_capacity": Changes(8, "lift"),
    "obs_noise": Changes(0.0, "lift"),
    "env_buffer_capacity": Changes(30, "sac_finetune"),
    "sac": Changes({"batch_size": 32, "tau": 0.01}, "sac_finetune"),  # each sac.* key: test_each_sac_key_...
    "load_optimizer_state": Changes(False, "sac_finetune"),
    "load_alpha": Changes(True, "sac_finetune"),
    "wm_retrain_first": Changes(False, "lift"),
    "update_normalizer": Changes(False, "sac_finetune"),
    "wm_scalers": Changes("keep", "lift"),
    "baseline_updates_per_step": Changes(0.5, "sac_finetune"),
    "baseline_chunk_steps": Changes(8, "sac_finetune"),
    "wm_hidden": Changes([8], "lift"),
    "wm_prior_mode": Changes("substep", "lift"),
    "wm_pretrain_steps": Changes(10, "lift"),
    "wm_pretrain_rows": Changes(100, "lift"),
    "wm_pretrain_seed": Changes(1, "lift"),
    "wm_retrain_steps": Changes(1, "lift"),
    "wm_loss_horizon": Changes(1, "lift"),
    "wm_eval_every": Changes(1, "lift", {"wm_min_improvement": 0.5}),  # a stage-2 fit that stops early
    "wm_patience": Changes(1, "lift"),
    "wm_min_improvement": Changes(0.5, "lift"),
    "blackbox_ensemble_size": Changes(2, "mbpo_wm"),
    "eval_episodes": Changes(2, "sac_finetune"),
    "stop_at_recovery": Changes(True, "sac_finetune"),  # every evaluation recovers here: it ends after epoch 0
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
def test_every_key_changes_the_run_or_is_checked_by_the_driver(key, request):
    """``key`` away from its default changes the learner's run (metric rows or final policy), or the driver's use
    of it is asserted. A key without a case fails: add one when adding a key."""
    if key not in CASES:
        pytest.fail(f"experiment.{key} has no case in CASES: say what it changes (or that validation refuses it)")
    case = CASES[key]
    start = request.getfixturevalue("start")
    if isinstance(case, Driver):
        case.check(start)
        return
    assert case.value != getattr(Config(**TINY), key), f"{key}: the case's value is the tiny run's own"
    runs = request.getfixturevalue("runs")
    base = runs(case.context, case.method) if case.context else request.getfixturevalue("default_run")(case.method)
    changed = runs({**(case.context or {}), key: case.value}, case.method)
    assert not changed.same_as(base), (
        f"experiment.{key}={case.value!r} left the {case.method} run unchanged: the key is ignored")


@pytest.mark.slow
@pytest.mark.parametrize("method", ["lift", "sac_finetune", "mbpo_wm"])
def test_default_runs_are_reproducible(method, runs, default_run):
    """The same config twice gives the same fingerprint (so "changed" above is the key's doing, not noise); the
    second model-based run loads the cached stage-2 fit, which must equal the fresh one."""
    assert runs({}, method).same_as(default_run(method))


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
