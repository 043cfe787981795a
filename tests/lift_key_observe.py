"""How tests/test_lift_config_keys.py watches a tiny LIFT finetuning run from inside the learner's loop: the tiny start
it finetunes (``build_start``), the sizes (``TINY``), and ``observe``, which runs ``finetune_learner.run_epochs`` as
``run_one_rank`` does with every step the ``experiment.*`` keys act on recorded (``Observed``): the real env's
requests and evaluations at the pool, each branch's model rows, each SAC update's steps and rows, each model fit's
settings and steps. Nothing here reads the logged metric rows, which echo the config."""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import torch

from experiments.lift.finetune_config import Config

TASK = "inverted_pendulum"
SEED = 3

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


def build_start(run: Path) -> Path:
    """A lift_pretrain run directory in ``run``: agent.pt, policy.pt and data/replay-rank0 with the world-model
    columns."""
    from algos.lift.agent import SACAgent
    from algos.lift.replay import ReplayBuffer, transition_fields
    from algos.lift.sac import SACConfig, update
    from cluster.store import ParquetStore
    from envs.control.rollout import VectorRollout, random_policy
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


def schedules(exp: Config):
    from algos.lift.finetune import LinearSchedule
    return (LinearSchedule.from_list(exp.horizon_schedule, "horizon_schedule"),
            LinearSchedule.from_list(exp.hupt_schedule, "hupt_schedule"))


def in_epoch(items: list[dict], epoch: int) -> list[dict]:
    return [i for i in items if i["epoch"] == epoch]
