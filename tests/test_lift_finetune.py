"""LIFT stages 2-3: schedules and rollout branching (units), the real env's deterministic-only interface, config
errors, and a smoke finetuning run on the real cluster (InvertedPendulum, actuator gear x0.4)."""
from __future__ import annotations

import uuid

import numpy as np
import pytest
import torch

from algos.lift.finetune import (ActionScale, LinearSchedule, action_rate, branch_rollouts, mixed_sampler,
                                 sample_start_states, steps_to_recover)

torch.set_num_threads(1)


def _shutdown_pool(name: str) -> None:
    from cluster.pool import SharedPool
    try:
        SharedPool.attach({"name": name}, create=False).shutdown()
    except ValueError:
        pass


# ----------------------------------------------------------------------------------------------------------- units

def test_schedules_follow_lifts_linear_ramps():
    horizon, hupt = LinearSchedule(0, 10, 1, 20), LinearSchedule(0, 4, 10, 1000)
    assert [horizon(e) for e in (0, 5, 10, 30)] == [1, 10, 20, 20]
    assert [hupt(e) for e in (0, 1, 4, 9)] == [10, 257, 1000, 1000]
    with pytest.raises(ValueError, match="horizon"):
        LinearSchedule.from_list([0, 10, 1], "horizon")


def test_model_rollouts_start_from_real_buffer_states():
    """Every branch starts at a state of the real buffer, and the first model transition's obs is that state's obs."""
    from algos.lift.world_model import PhysicsWorldModel, WorldModelConfig
    from envs.control.tasks import make_env
    from envs.control.mujoco_prior import MujocoPrior
    from envs.control.task_rewards import make_observation_fn, make_task_reward

    env = make_env("inverted_pendulum")
    model = PhysicsWorldModel(MujocoPrior.from_env(env), 1, WorldModelConfig(hidden_sizes=(16,)))
    obs_fn, reward_fn = make_observation_fn(env), make_task_reward(env)
    scale = ActionScale(torch.tensor([-3.0]), torch.tensor([3.0]))
    real_states = torch.randn(50, 4) * 0.05
    gen = torch.Generator().manual_seed(0)
    start, index = sample_start_states(real_states, 64, gen)
    assert torch.equal(start, real_states[index])
    assert (start[:, None, :] == real_states[None]).all(-1).any(-1).all(), "a start state not in the real buffer"
    batch, metrics = branch_rollouts(model, start, lambda obs: torch.tanh(obs[:, :1]), obs_fn, reward_fn, scale, 3)
    assert torch.allclose(batch["obs"][:64], obs_fn(start[:, :2], start[:, 2:]).float())
    assert metrics["model_transitions"] == len(batch["reward"]) >= 64
    assert set(batch) == {"obs", "action", "reward", "next_obs", "terminated", "truncated"}
    with pytest.raises(ValueError, match="empty"):
        sample_start_states(real_states[:0], 4)


def test_mixed_batches_hold_the_real_ratio_and_metrics_helpers():
    real = lambda n: {"reward": torch.ones(n), "obs": torch.ones(n, 2)}  # noqa: E731
    model = lambda n: {"reward": torch.zeros(n), "obs": torch.zeros(n, 2)}  # noqa: E731
    batch = mixed_sampler(real, model, 0.06, torch.Generator().manual_seed(0))(1000)
    assert batch["reward"].sum() == 60 and batch["obs"].shape == (1000, 2)
    assert batch["reward"][:500].sum() not in (0, 60), "rows must be shuffled (update cuts consecutive minibatches)"
    actions = np.array([[[0.0]], [[1.0]], [[1.0]], [[3.0]]])
    done = np.array([[False], [False], [True], [False]])
    assert action_rate(actions, done) == pytest.approx(0.5)  # (1 + 0) / 2; the pair across the episode end is skipped
    assert steps_to_recover(np.array([0, 100, 200]), np.array([400.0, 700.0, 900.0]), 1000.0, 400.0) == 200
    assert steps_to_recover(np.array([0, 100]), np.array([400.0, 500.0]), 1000.0, 400.0) is None


def test_real_env_interface_refuses_stochastic_actions():
    """The real env's sampler (deterministic_only) refuses a stochastic request; deterministic ones are counted."""
    from algos.lift.agent import SACAgent
    from algos.lift.sac import SACConfig
    from experiments.lift.sampler import EnvSampler
    sampler = EnvSampler({"task": "inverted_pendulum", "num_envs": 2, "seed": 0, "physics_state": True,
                          "deterministic_only": True, "change": {"name": "gear", "scale": 0.4}})
    sampler.load_weights(SACAgent(4, 1, SACConfig.preset("smoke")).policy_state(), 1)
    with pytest.raises(PermissionError):
        sampler.sample({"steps": 2, "deterministic": False})
    out = sampler.sample({"steps": 3, "deterministic": True, "reset_seed": 0})
    assert out["actions_sent"] == {"deterministic": 1, "stochastic": 0} and len(out["transitions"]["ctrl"]) == 6


def test_missing_pretrain_run_is_a_config_error(tmp_path):
    from experiments.config import ConfigError, load
    with pytest.raises(ConfigError, match="experiment.pretrain_run: missing"):
        load(["experiment=lift_finetune", "env=inverted_pendulum"])
    with pytest.raises(ConfigError, match="lacks policy.pt, agent.pt"):
        load(["experiment=lift_finetune", "env=inverted_pendulum", f"experiment.pretrain_run={tmp_path}"])
    with pytest.raises(ConfigError, match="env.task"):
        load(["experiment=lift_finetune", "env=pendulum", f"experiment.pretrain_run={tmp_path}"])


# ----------------------------------------------------------------------------------------------- cluster smoke run

@pytest.fixture(scope="module")
def pretrained_run(tmp_path_factory):
    """A small in-process SAC pretraining on InvertedPendulum in lift_pretrain's file format."""
    from benchmarks.lift_finetune import pretrain_in_process
    return pretrain_in_process(tmp_path_factory.mktemp("pretrain"), "inverted_pendulum", env_steps=3000, seed=0,
                               batch_size=256, updates_per_round=4)


def test_lift_finetuning_beats_the_pretrained_policy_in_the_changed_env(tmp_path, ray_cluster, pretrained_run):
    from cluster.metrics import read_metrics
    from experiments.run import main
    pool = f"lift-ft-{uuid.uuid4().hex[:6]}"
    try:
        summary = main(["experiment=lift_finetune", "env=inverted_pendulum", f"experiment.pretrain_run={pretrained_run}",
                        "experiment.method=lift", "experiment.change={name:gear,scale:0.4}", f"output_dir={tmp_path}",
                        "run_name=smoke", f"pool.name={pool}",
                        "experiment.epochs=2", "experiment.prefill_steps=200", "experiment.real_steps_per_epoch=300",
                        "experiment.wm_pretrain_steps=200", "experiment.wm_retrain_steps=100",
                        "experiment.hupt_schedule=[0,1,10,10]", "experiment.eval_episodes=4", "seed=0"])
    finally:
        _shutdown_pool(pool)
    assert set(summary) == {"task", "change", "pre_change_return", "zero_shot_return", "methods", "plot"}
    lift = summary["methods"]["lift"]
    assert lift["final_return"] > summary["zero_shot_return"], summary
    df = read_metrics(tmp_path / "lift_finetune" / "smoke")
    trained = df[df["epoch"] >= 0]
    assert (trained["stochastic_requests"] == 0).all(), "the real env received a stochastic request"
    assert (trained["model_transitions"] > 0).all() and trained["wm_error_1step"].notna().all()
    assert lift["real_steps"] == 200 + 2 * 300
    assert (tmp_path / "lift_finetune" / "smoke" / "plots" / "finetune_recovery.png").stat().st_size > 10_000
