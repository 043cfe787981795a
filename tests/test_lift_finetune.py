"""LIFT stages 2-3: schedules, rollout branching and DDP lockstep (units), the real env's deterministic-only
interface, per-rank checkpoints, safety figures, config errors, and a finetuning run on the real cluster
(InvertedPendulum, gravity x9: recovery margin). Two DDP ranks finetuning on one pool: tests/test_rehearsal.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from algos.lift.finetune import (ActionScale, LinearSchedule, action_rate, branch_rollouts, mixed_sampler,
                                 sample_start_states, steps_to_recover)

torch.set_num_threads(1)


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
    # a terminated rollout restarts from its start state (LIFT's AutoResetWrapper): every branch yields n x H rows
    assert metrics["model_transitions"] == len(batch["reward"]) == 64 * 3
    assert set(batch) == {"obs", "action", "reward", "next_obs", "terminated", "truncated", "critic_obs",
                          "next_critic_obs"}
    ends = batch["terminated"][:-64].bool()
    if ends.any():  # the row after a termination is that row's start state again
        start_obs = obs_fn(start[:, :2], start[:, 2:]).float().repeat(2, 1)
        torch.testing.assert_close(batch["critic_obs"][64:][ends], start_obs[ends])
    with pytest.raises(ValueError, match="empty"):
        sample_start_states(real_states[:0], 4)


def test_a_terminated_model_rollout_restarts_from_its_start_state_until_h_steps():
    """LIFT's model env auto-resets to the branch's start state: with every step terminating, each of the H steps
    starts at the start state, and the branch still yields n x H transitions, all terminal."""
    from algos.lift.world_model import PhysicsWorldModel, WorldModelConfig
    from envs.control.mujoco_prior import MujocoPrior
    from envs.control.tasks import make_env
    obs_fn, reward_fn, scale = _pendulum_rollout_functions()
    model = PhysicsWorldModel(MujocoPrior.from_env(make_env("inverted_pendulum")), 1,
                              WorldModelConfig(hidden_sizes=(8,)))

    def always_falls(*args):
        reward, _ = reward_fn(*args)
        return reward, torch.ones_like(reward, dtype=torch.bool)
    start = torch.randn(10, 4) * 0.05
    batch, metrics = branch_rollouts(model, start, lambda obs: torch.zeros(len(obs), 1), obs_fn, always_falls, scale,
                                     4)
    assert len(batch["reward"]) == 40 and metrics["model_terminations"] == 40
    torch.testing.assert_close(batch["critic_obs"], obs_fn(start[:, :2], start[:, 2:]).float().repeat(4, 1))


def test_mixed_batches_hold_the_real_ratio_and_metrics_helpers():
    real = lambda n: {"reward": torch.ones(n), "obs": torch.ones(n, 2)}  # noqa: E731
    model = lambda n: {"reward": torch.zeros(n), "obs": torch.zeros(n, 2)}  # noqa: E731
    batch = mixed_sampler(real, model, 0.06, torch.Generator().manual_seed(0))(1000)
    assert batch["reward"].sum() == 60 and batch["obs"].shape == (1000, 2)
    assert batch["reward"][:500].sum() not in (0, 60), "rows must be shuffled (update cuts consecutive minibatches)"
    noisy = lambda n: {"reward": torch.zeros(n), "obs": torch.full((n, 2), 5.0),  # noqa: E731
                       "critic_obs": torch.zeros(n, 2)}
    both = mixed_sampler(real, noisy, 0.5, torch.Generator().manual_seed(0))(100)
    real_rows = both["reward"] == 1  # real rows: the critic's view is their own obs; model rows keep their own
    assert (both["critic_obs"][real_rows] == 1).all() and (both["critic_obs"][~real_rows] == 0).all()
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


class _DivergingModel:
    """A world model whose every prediction leaves the finite numbers: its rollouts produce no transitions."""

    nq = 2

    def predict(self, state, ctrl, member="mean"):
        return torch.full_like(state, float("nan")), torch.zeros_like(state)


def _pendulum_rollout_functions():
    from envs.control.task_rewards import make_observation_fn, make_task_reward
    from envs.control.tasks import make_env
    env = make_env("inverted_pendulum")
    return make_observation_fn(env), make_task_reward(env), ActionScale(torch.tensor([-3.0]), torch.tensor([3.0]))


def test_every_branch_runs_its_update_even_when_the_model_produces_nothing():
    """DDP lockstep: each SAC update is a collective, so every rank must run exactly HUPT of them per epoch. A rank
    whose rollouts all diverge (empty model buffer) used to skip its updates and leave the other ranks hanging; now it
    trains on real data alone."""
    from algos.lift.finetune import Branching, branch_and_update
    from algos.lift.replay import ReplayBuffer, transition_fields
    obs_fn, reward_fn, scale = _pendulum_rollout_functions()
    fields = transition_fields(4, 1)
    real = ReplayBuffer(100, fields)
    real.add({"obs": np.ones((50, 4)), "next_obs": np.ones((50, 4)), "action": np.zeros((50, 1)),
              "reward": np.ones(50), "terminated": np.zeros(50), "truncated": np.zeros(50)})
    model_buffer = ReplayBuffer(100, fields)
    batches = []
    out = branch_and_update(_DivergingModel(), Branching(obs_fn, reward_fn, scale), torch.randn(20, 4) * 0.05, None,
                            lambda obs: torch.zeros(len(obs), 1), n_branches=5, horizon=2, rollout_batch=8,
                            model_buffer=model_buffer, real_sample=lambda n: real.sample(n),
                            update=lambda sampler: batches.append(sampler(32)) or {"critic_loss": 0.0},
                            real_ratio=0.06, generator=torch.Generator().manual_seed(0))
    assert len(batches) == 5, "a rank skipped updates: DDP ranks would fall out of lockstep"
    assert all(bool((b["reward"] == 1.0).all()) for b in batches), "without model data the batch is all real"
    assert out["model_transitions"] == 0 and len(model_buffer) == 0


def test_model_rollouts_carry_the_command_and_show_the_actor_model_noise():
    """Velocity command per start state reaches obs and reward; with obs_noise the actor sees the model's std as
    noise (LIFT's wm_noise_to_actor_noise) while the stored transitions (the critic's inputs and target), rewards and
    terminations stay those of the mean state."""
    from algos.lift.world_model import PhysicsWorldModel, WorldModelConfig
    from envs.control.mujoco_prior import MujocoPrior
    from experiments.lift.world_models import rollout_functions
    from envs.control.tasks import make_env
    change = {"name": "target_velocity", "command_range": [0.5, 0.5]}
    obs_fn, reward_fn, scale = rollout_functions("walker2d", change)
    env = make_env("walker2d")
    model = PhysicsWorldModel(MujocoPrior.from_env(env), 6, WorldModelConfig(hidden_sizes=(8,))).double()
    env.reset(seed=0)
    base = env.unwrapped.data
    start = torch.as_tensor(np.concatenate([base.qpos, base.qvel]))[None].repeat(16, 1)
    command = torch.linspace(0.0, 1.5, 16, dtype=torch.float64)
    seen = []

    def policy(obs):
        seen.append(obs)
        return torch.zeros(len(obs), 6)
    runs, inputs = {}, {}
    for noise in (0.0, 1.0):
        seen.clear()
        batch, _ = branch_rollouts(model, start, policy, obs_fn, reward_fn, scale, 2, command=command,
                                   obs_noise=noise, generator=torch.Generator().manual_seed(0))
        runs[noise], inputs[noise] = batch, list(seen)
        assert torch.allclose(seen[0][:, -1], command.float()), "the command is the policy's last input"
    torch.testing.assert_close(runs[0.0]["reward"], runs[1.0]["reward"])
    assert not torch.allclose(inputs[0.0][1], inputs[1.0][1]), "the actor's second input carries the model's noise"
    for key in ("critic_obs", "next_critic_obs"):  # what Q and the target Q read: the mean state, never the noise
        torch.testing.assert_close(runs[0.0][key], runs[1.0][key])
    # what the actor's losses and the target's next action read: the noisy view LIFT stores as 'state'
    torch.testing.assert_close(runs[1.0]["obs"][16:], inputs[1.0][1].float())
    assert not torch.allclose(runs[0.0]["next_obs"], runs[1.0]["next_obs"])
    torch.testing.assert_close(runs[0.0]["next_obs"], runs[0.0]["next_critic_obs"])  # no noise: one view
    torch.testing.assert_close(runs[0.0]["obs"][:16], runs[1.0]["obs"][:16])  # start states are real: no noise
    # the tracking reward of each row follows its own command
    assert runs[0.0]["reward"][:16].std() > 0


def test_a_random_policy_request_cannot_reach_a_deterministic_only_env():
    """Uniform random actions are exploration: the real env's interface refuses them like stochastic actions."""
    from experiments.lift.sampler import EnvSampler
    sampler = EnvSampler({"task": "inverted_pendulum", "num_envs": 2, "seed": 0, "physics_state": True,
                          "deterministic_only": True})
    with pytest.raises(PermissionError, match="random"):
        sampler.sample({"steps": 2, "deterministic": True, "policy": "random"})
    with pytest.raises(PermissionError):  # no weights yet: the default would be the random policy
        sampler.sample({"steps": 2, "deterministic": True})


def test_each_rank_checkpoints_only_its_own_file(tmp_path, monkeypatch):
    """Per-rank checkpoints: rank 1 writes rank1.pt into its own directory and reports it (Ray Train merges the
    ranks' directories); nothing is gathered into rank 0 through torch.distributed."""
    from algos.lift.agent import SACAgent
    from algos.lift.sac import SACConfig
    from cluster import ddp
    from experiments.lift import learner_common
    reported = []
    monkeypatch.setattr(ddp, "rank", lambda: 1)
    monkeypatch.setattr(ddp, "world_size", lambda: 2)
    monkeypatch.setattr(ddp, "report", lambda metrics, checkpoint_dir=None: reported.append(checkpoint_dir))
    agent = SACAgent(4, 1, SACConfig.preset("smoke"))
    learner_common.save_checkpoint(tmp_path, {"counters": {"rank": 1}}, agent, {"eval_return": 1.0})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank1.pt"] and reported == [tmp_path]
    assert torch.load(tmp_path / "rank1.pt", weights_only=True)["counters"] == {"rank": 1}


def test_safety_figures_of_recorded_walker_states():
    from envs.control.safety import JointSafety
    from envs.control.tasks import make_env
    env = make_env("walker2d")
    env.reset(seed=0)
    safety = JointSafety.from_env(env)
    qpos = np.repeat(env.unwrapped.data.qpos[None], 3, 0)
    qvel = np.zeros((3, 9))
    qpos[1, 4] = 0.05  # the right knee 0.05 rad past its stop at 0
    qpos[2, 2] = -0.7  # torso pitched forward
    qvel[2, 6] = -12.0  # left thigh swinging
    figures = safety.measure(qpos, qvel)
    assert figures == pytest.approx({"joint_excursion": 0.05, "joint_speed": 12.0, "torso_tilt": 0.7}, abs=1e-6)


def test_finetune_env_must_observe_what_the_policy_was_pretrained_on(tmp_path):
    """A velocity command in one stage and not the other is a config error naming the key."""
    from tests.lift_pretrained import pretrain_in_process
    from experiments.config import ConfigError, load
    run = pretrain_in_process(tmp_path / "pre", "walker2d", env_steps=600, seed=0, batch_size=64,
                              updates_per_round=1, num_envs=2)
    common = ["experiment=lift_finetune", "env=walker2d", f"experiment.pretrain_run={run}"]
    with pytest.raises(ConfigError, match="experiment.change: the env observes 18 numbers, the pretrained policy 17"):
        load([*common, "experiment.change={target_velocity:{command_range:[1.0,1.0]}}"])
    load([*common, "experiment.change={name:mass,scale:1.5}"])


# ----------------------------------------------------------------------------------------------- cluster smoke run

@pytest.fixture(scope="module")
def pretrained_run(tmp_path_factory):
    """An in-process SAC pretraining on InvertedPendulum in lift_pretrain's file format (~16k env steps, batch 256:
    ~25 s on a quiet core): a policy at 1000 that gravity x9 brings down to a few dozen."""
    from tests.lift_pretrained import pretrain_in_process
    return pretrain_in_process(tmp_path_factory.mktemp("pretrain"), "inverted_pendulum", env_steps=16000, seed=1,
                               batch_size=256, updates_per_round=8)


def test_lift_finetuning_recovers_the_return_the_change_took(tmp_path, pool_name, pretrained_run):
    """LIFT under gravity x9 wins back 80 % of the return the change took away within 1600 real steps, every one of
    them deterministic (calibrated on 3 pretrainings x 2 seeds at batch 256: recovered at 800 steps in 5 of 6, the
    sixth not within 1600; at batch 1024 it was 200-800 steps in 4 of 5; the run stops at its first recovered
    evaluation, so it costs what it needs)."""
    from cluster.metrics import read_metrics
    from experiments.run import main
    pool = pool_name
    summary = main(["experiment=lift_finetune", "env=inverted_pendulum", f"experiment.pretrain_run={pretrained_run}",
                    "experiment.method=lift", "experiment.change={name:gravity,scale:9.0}",
                    f"output_dir={tmp_path}", "run_name=smoke", f"pool.name={pool}",
                    "experiment.epochs=8", "experiment.stop_at_recovery=true", "experiment.prefill_steps=0",
                    "experiment.real_steps_per_epoch=200", "experiment.wm_retrain_first=false",
                    "experiment.hupt_schedule=[0,2,20,100]", "experiment.horizon_schedule=[0,4,1,5]",
                    "experiment.wm_pretrain_steps=500", "experiment.wm_retrain_steps=300",
                    "experiment.load_alpha=true", "experiment.sac.tau=0.005", "experiment.eval_episodes=4",
                    "seed=0"])
    assert set(summary) == {"task", "change", "reference_change", "pre_change_return", "zero_shot_return", "methods",
                            "plot"}
    lift, pre, zero = summary["methods"]["lift"], summary["pre_change_return"], summary["zero_shot_return"]
    assert pre - zero > 0.5 * pre, f"the change must take most of the return away: {pre} -> {zero}"
    assert lift["real_steps_to_recover"] is not None and lift["real_steps_to_recover"] <= 1600, summary
    assert lift["best_return"] >= zero + 0.8 * (pre - zero), summary
    df = read_metrics(tmp_path / "lift_finetune" / "smoke")
    trained = df[df["epoch"] >= 0]
    assert (trained["stochastic_requests"] == 0).all(), "the real env received a stochastic request"
    assert (trained["model_transitions"] > 0).all() and trained["wm_heldout_error_1step"].notna().all()
    assert lift["real_steps"] == lift["real_steps_to_recover"], "the run stops at its first recovered evaluation"
    assert (tmp_path / "lift_finetune" / "smoke" / "plots" / "finetune_recovery.png").stat().st_size > 10_000
