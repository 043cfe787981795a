"""Every ``experiment.*`` key of lift_finetune does what it names, or is refused at validation (issues 36, 47).

Each field of ``experiments.lift.finetune_config.Config`` (iterated, so a new key without a case fails here) has one
case in ``CASES``:
  ``Acts(value, method, check)``  the learner's loop (``finetune_learner.run_epochs`` on one rank, the pool's samplers
                              in this process, as ``run_one_rank`` runs it) at the tiny ``TINY`` config, watched from
                              inside (``observe``: the real env's requests and evaluations at the pool, each branch's
                              model rows, each SAC update's steps and rows, each model fit's settings and steps).
                              ``check(observed, exp)`` asserts the thing the key names (the horizon in the model
                              rows, the buffer's capacity, the SAC steps taken, ...): it must hold for the default run
                              at the default value and for the changed run at the case's value, and fail for the
                              default run at the case's value. Logged rows, which echo the config, are never read.
  ``Driver(check)``           keys the driver reads (which methods, which envs, the pretraining run, the device):
                              an assertion on the driver's own functions (``finetune_config.check``,
                              ``finetune_envs``, ``Config.method_list``, ``learner_device``).
``REFUSED`` adds a value ``Config(...)`` must refuse for every key with a range. Beside the table: the horizon check
fails when rollouts are forced to horizon 1; the stage-2-from-file path (a study's start model) loads that model and
fits none; ``sac_deterministic`` acts deterministically without a model at LIFT's SAC steps.

The start is tiny and built here: an untrained-but-updated ``SACAgent`` (``agent.pt`` as lift_pretrain saves it,
with Adam and temperature states to load or not) and 300 random-policy InvertedPendulum transitions as the Parquet
replay; every run gets its own copy, so its stage 2 is fitted, not loaded from another run's cache.
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


class Acts(NamedTuple):
    value: Any
    method: str
    check: Callable[["Observed", Config], None]  # asserts that a run shows the config's value of the key
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

@dataclasses.dataclass
class Observed:
    """What a run did, seen from inside the learner's loop (never its logged echo of the config)."""

    epochs: int = 0
    calls: list = dataclasses.field(default_factory=list)  # (step, epoch) in the order the loop ran them
    collects: list = dataclasses.field(default_factory=list)  # {epoch, rows, envs, deterministic}
    branches: list = dataclasses.field(default_factory=list)  # {epoch, starts, rows, noisy_rows}
    updates: list = dataclasses.field(default_factory=list)  # {epoch, sac_steps, rows, real_rows, batch, tau, ...}
    refits: list = dataclasses.field(default_factory=list)  # {epoch, cfg, stopper, steps, model_buffer_after}
    stage2: dict = dataclasses.field(default_factory=dict)  # {seed, cfg, stopper, rows, steps} of the fit that ran
    eval_episodes: list = dataclasses.field(default_factory=list)  # episodes each evaluation returned
    model_buffer_capacity: list = dataclasses.field(default_factory=list)  # (epoch, capacity) at each resize check
    real_buffer_capacity: int = 0
    real_env_gravity: float = float("nan")  # of the real env the samples came from
    real_envs: int = 0  # its number of envs
    normalizer_count: tuple = (0.0, 0.0)  # before, after
    scalers_moved: bool = False  # the model's input/output scalers changed over the run's refits
    hidden: tuple = ()  # the model network's layer widths
    ensemble: int = 0
    prior_substeps: bool = False


def _scalers(model) -> dict[str, torch.Tensor]:
    return {n: b.clone() for n, b in model.named_buffers() if n.endswith(("_mean", "_std"))}


def observe(start: Path, root: Path, overrides: dict[str, Any], method: str,
            stage2_file: Path | None = None, probe: dict | None = None) -> Observed:
    """The learner's loop (``run_epochs``, as ``run_one_rank`` runs it) at ``TINY`` + ``overrides`` for ``method``, its
    envs from ``finetune_envs``, with every step the keys act on watched: the real env's requests and evaluations at
    the pool, each branch's model rows, each SAC update's steps and rows, each model fit's settings and steps."""
    from unittest import mock

    import algos.lift.finetune as finetune_algos
    import experiments.lift.finetune_learner as learner_module
    import experiments.lift.world_models as world_models
    from cluster import ddp
    from cluster.local_pool import LocalPool
    from experiments.lift.finetune_config import finetune_envs, pretrain_files
    from experiments.registry import sampler_factories
    _runs["count"] += 1
    run_path = root / f"run{_runs['count']}"
    own_start = run_path / "pretrain"  # a copy per run: its stage 2 is fitted here, not loaded from another's cache
    shutil.copytree(start, own_start)
    exp = Config(**{**TINY, "pretrain_run": str(own_start), **overrides})
    files = pretrain_files(exp.pretrain_run)
    change, _ = finetune_envs(exp, TASK)
    config = {"experiment": dataclasses.asdict(exp), "pool": {}, "run_path": str(run_path),
              "run_id": f"keys-{_runs['count']}", "task": TASK, "seed": SEED, "torch_threads": 1, "change": change,
              "method": method, "agent_path": str(files["agent"]), "replay": [str(p) for p in files["replay"]],
              "pretrain_run": str(files["run"]), "stage2": str(stage2_file) if stage2_file else None,
              "pre_change_return": PRE_CHANGE_RETURN, "zero_shot_return": ZERO_SHOT_RETURN}
    seen = Observed()
    learner_box: list = []
    epoch = lambda: learner_box[0].epoch if learner_box else -1  # noqa: E731

    real_branch, real_update, real_train = (finetune_algos.branch_rollouts, learner_module.update,
                                            learner_module.train_world_model)
    real_make, real_stage2_train = world_models.make_world_model, world_models.train_world_model

    def branch_rollouts(model, start_states, *args, **kwargs):
        batch, metrics = real_branch(model, start_states, *args, **kwargs)
        noisy = int((batch["obs"] != batch["critic_obs"]).any(-1).sum()) if len(batch["reward"]) else 0
        seen.branches.append({"epoch": epoch(), "starts": len(start_states), "rows": len(batch["reward"]),
                              "noisy_rows": noisy})
        return batch, metrics

    def update(agent, sampler, cfg):
        asked = []

        def counting(n):
            asked.append(n)
            return sampler(n)
        before, real_before = agent.num_updates, seen_real_rows[0]
        opt_state = agent.actor_opt.state_dict()["state"]
        seen.updates.append({"epoch": epoch(), "tau": cfg.tau, "batch": cfg.batch_size,
                             "log_alpha": float(agent.log_alpha.log_alpha.detach()),
                             "adam_steps": max((float(v["step"]) for v in opt_state.values()), default=0.0)})
        out = real_update(agent, counting, cfg)
        seen.updates[-1].update(sac_steps=agent.num_updates - before, rows=sum(asked),
                                real_rows=seen_real_rows[0] - real_before)
        return out

    def train_world_model(model, data, cfg=None, early_stopping=None, **kwargs):
        out = real_train(model, data, cfg, early_stopping, **kwargs)
        seen.refits.append({"epoch": epoch(), "cfg": cfg, "stopper": early_stopping, "steps": out["steps"]})
        return out

    def make_world_model(kind, task, exp_, seed):
        seen.stage2["seed"] = seed
        return real_make(kind, task, exp_, seed)

    def stage2_train(model, data, cfg=None, early_stopping=None, **kwargs):
        out = real_stage2_train(model, data, cfg, early_stopping, **kwargs)
        seen.stage2.update(cfg=model.cfg, stopper=early_stopping, rows=len(data["qpos"]), steps=out["steps"])
        return out

    seen_real_rows = [0]
    pool = LocalPool(sampler_factories())
    pool_map = pool.map

    def watched_map(sampler, requests, **kwargs):
        out = pool_map(sampler, requests, **kwargs)
        for request, result in zip(requests, out):
            if "evaluate_episodes" in request:
                seen.eval_episodes.append(len(result["episode_returns"]))
            else:
                cfg_ = kwargs["config"]
                seen.collects.append({"epoch": epoch(), "rows": len(result["transitions"]["reward"]),
                                      "envs": cfg_["num_envs"], "deterministic": bool(request.get("deterministic"))})
                seen.calls.append(("collect", epoch()))
        return out
    pool.map = watched_map
    patches = [mock.patch.object(finetune_algos, "branch_rollouts", branch_rollouts),
               mock.patch.object(learner_module, "update", update),
               mock.patch.object(learner_module, "train_world_model", train_world_model),
               mock.patch.object(world_models, "make_world_model", make_world_model),
               mock.patch.object(world_models, "train_world_model", stage2_train)]
    try:
        for p in patches:
            p.start()
        with ddp.local_session(run_path / "checkpoints"):
            learner = learner_module.FinetuneLearner(config, pool=pool)
            learner_box.append(learner)
            if probe is not None and learner.stage2_model is not None:
                probe["stage2_state"] = {k: v.clone() for k, v in learner.stage2_model.state_dict().items()}
            seen.normalizer_count = (float(learner.agent.obs_normalizer.count), 0.0)
            real_sample = learner.real_buffer.sample

            def counted_sample(n, *args, **kwargs):
                seen_real_rows[0] += n
                return real_sample(n, *args, **kwargs)
            learner.real_buffer.sample = counted_sample
            before = _scalers(learner.model) if learner.model is not None else {}
            fit, retrain = learner.fit_model_buffer, learner.retrain_model

            def fit_model_buffer():
                fit()
                seen.model_buffer_capacity.append((learner.epoch, learner.model_buffer.capacity))

            def retrain_model():
                seen.calls.append(("retrain", learner.epoch))
                retrain()
                if seen.refits and seen.refits[-1]["epoch"] == learner.epoch:
                    seen.refits[-1]["model_buffer_after"] = len(learner.model_buffer)
            learner.fit_model_buffer, learner.retrain_model = fit_model_buffer, retrain_model
            learner_module.run_epochs(learner)
        for instance, _ in pool.samplers.values():  # the real env the samples came from (evaluations build their own)
            if getattr(instance, "rollout", None) is not None:
                seen.real_env_gravity = float(instance.rollout.envs.envs[0].unwrapped.model.opt.gravity[2])
                seen.real_envs = instance.rollout.num_envs
    finally:
        for p in reversed(patches):
            p.stop()
        pool.close()
    seen.epochs = learner.epoch
    seen.real_buffer_capacity = learner.real_buffer.capacity
    seen.normalizer_count = (seen.normalizer_count[0], float(learner.agent.obs_normalizer.count))
    if learner.model is not None:
        after = _scalers(learner.model)
        seen.scalers_moved = any(not torch.equal(before[k], after[k]) for k in before)
        widths = [p.shape[-1] for n, p in learner.model.net.named_parameters() if n.endswith("weight")]
        seen.hidden, seen.ensemble = tuple(widths[:-1]), int(next(learner.model.net.parameters()).shape[0])
        seen.prior_substeps = learner.model.cfg.prior_mode == "substep"
    return seen


_runs = {"count": 0}


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

def _schedules(exp: Config):
    from algos.lift.finetune import LinearSchedule
    return (LinearSchedule.from_list(exp.horizon_schedule, "horizon_schedule"),
            LinearSchedule.from_list(exp.hupt_schedule, "hupt_schedule"))


def _in_epoch(items: list[dict], epoch: int) -> list[dict]:
    return [i for i in items if i["epoch"] == epoch]


def check_change(o: Observed, exp: Config) -> None:
    from experiments.lift.finetune_config import DEFAULT_CHANGES
    change = exp.change or DEFAULT_CHANGES[TASK]  # the driver's rule (finetune_envs), the run's env seen below
    assert change["name"] == "gravity"
    assert o.real_env_gravity == pytest.approx(-9.81 * change["scale"])


def check_epochs(o: Observed, exp: Config) -> None:
    assert o.epochs == exp.epochs and len(o.eval_episodes) == exp.epochs


def check_real_steps_per_epoch(o: Observed, exp: Config) -> None:
    assert sum(c["rows"] for c in _in_epoch(o.collects, 1)) == exp.real_steps_per_epoch


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
    horizon, _ = _schedules(exp)
    assert o.branches and all(b["rows"] == b["starts"] * horizon(b["epoch"]) for b in o.branches), \
        [(b["epoch"], b["rows"] / b["starts"]) for b in o.branches]


def check_hupt(o: Observed, exp: Config) -> None:
    _, hupt = _schedules(exp)
    for e in range(o.epochs):
        assert len(_in_epoch(o.branches, e)) == hupt(e)


def check_updates_per_rollout(o: Observed, exp: Config) -> None:
    assert o.updates and all(u["sac_steps"] == exp.updates_per_rollout for u in o.updates)


def check_real_ratio(o: Observed, exp: Config) -> None:
    assert o.updates and all(u["real_rows"] == round(exp.real_ratio * u["rows"]) for u in o.updates)


def check_flush(o: Observed, exp: Config) -> None:
    after = [r["model_buffer_after"] for r in o.refits if "model_buffer_after" in r]
    assert after and (all(n == 0 for n in after) if exp.model_buffer_flush else all(n > 0 for n in after))


def check_model_buffer_capacity(o: Observed, exp: Config) -> None:
    horizon, hupt = _schedules(exp)
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
    assert sum(u["sac_steps"] for u in _in_epoch(o.updates, 1)) == calls * exp.updates_per_rollout


def check_chunk(o: Observed, exp: Config) -> None:
    n = exp.num_real_envs
    assert _in_epoch(o.collects, 1)[0]["rows"] == -(-min(exp.baseline_chunk_steps, exp.real_steps_per_epoch) // n) * n


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
def test_sac_deterministic_acts_deterministically_without_a_model_at_lifts_sac_steps(runs, default_run):
    """sac_deterministic (the control separating the model from deterministic acting): every real request is
    deterministic, no model rollout runs, and each epoch takes exactly LIFT's SAC steps (HUPT(e) x
    updates_per_rollout), the same count the lift run takes."""
    exp = Config(**TINY)
    _, hupt = _schedules(exp)
    seen, lift = runs({}, "sac_deterministic"), default_run("lift")
    assert seen.collects and all(c["deterministic"] for c in seen.collects)
    assert not seen.branches and not seen.refits and seen.stage2 == {}
    for e in range(exp.epochs):
        steps = sum(u["sac_steps"] for u in _in_epoch(seen.updates, e))
        assert steps == hupt(e) * exp.updates_per_rollout == sum(u["sac_steps"] for u in _in_epoch(lift.updates, e))
    sac = runs({}, "sac_finetune")
    assert not all(c["deterministic"] for c in sac.collects)  # the check can fail: the baseline explores


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
