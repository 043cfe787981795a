"""The lean Humanoid-v5 (envs.control.fast_mujoco) reproduces gymnasium's Humanoid-v5 step for step: observations, rewards,
terminations, truncation at 1000 steps, seeded resets, info, physics state, stage-3 changes and VectorRollout."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from envs.control.fast_mujoco import FastHumanoid, lean_version
from envs.control.rollout import VectorRollout, random_policy
from envs.control.tasks import make_env

TOL = 1e-10
STATE_ONLY = {f"include_{part}_in_observation": False for part in ("cinert", "cvel", "qfrc_actuator", "cfrc_ext")}


def _compare(lean: gym.Env, reference: gym.Env, steps: int, seed: int, info_keys: tuple[str, ...] = ()) -> dict:
    """Step both envs with the same random [-1, 1] actions, resetting both (unseeded, so from their own RNGs)
    whenever an episode ends; assert equal transitions. Returns counts of terminations and truncations."""
    obs_a, info_a = lean.reset(seed=seed)
    obs_b, info_b = reference.reset(seed=seed)
    np.testing.assert_array_equal(obs_a, obs_b)  # the same reset noise draws
    actions = np.random.default_rng(seed).uniform(-1, 1, (steps,) + reference.action_space.shape).astype(np.float32)
    counts = {"terminated": 0, "truncated": 0}
    for t, action in enumerate(actions):
        obs_a, rew_a, term_a, trunc_a, info_a = lean.step(action)
        obs_b, rew_b, term_b, trunc_b, info_b = reference.step(action)
        assert obs_a.shape == obs_b.shape and obs_a.dtype == obs_b.dtype
        np.testing.assert_allclose(obs_a, obs_b, rtol=0, atol=TOL, err_msg=f"observation at step {t}")
        assert abs(rew_a - rew_b) <= TOL, f"reward at step {t}: {rew_a} vs {rew_b}"
        assert (term_a, trunc_a) == (term_b, trunc_b), f"terminated/truncated at step {t}"
        for key in info_keys:
            np.testing.assert_allclose(info_a[key], info_b[key], rtol=0, atol=TOL, err_msg=f"info[{key!r}] at {t}")
        counts["terminated"] += term_b
        counts["truncated"] += trunc_b
        if term_b or trunc_b:
            obs_a, _ = lean.reset()
            obs_b, _ = reference.reset()
            np.testing.assert_array_equal(obs_a, obs_b)
    return counts


def test_matches_gymnasium_humanoid_with_resets_after_termination():
    lean, reference = make_env("humanoid"), make_env("humanoid", lean=False)
    assert isinstance(lean.unwrapped, FastHumanoid) and not isinstance(reference.unwrapped, FastHumanoid)
    assert lean.action_space == reference.action_space and lean.observation_space == reference.observation_space
    assert lean.unwrapped.action_space == reference.unwrapped.action_space  # the env's own control range
    info_keys = ("x_position", "y_position", "distance_from_origin", "x_velocity", "y_velocity", "reward_survive",
                 "reward_forward", "reward_ctrl", "reward_contact")
    counts = _compare(lean, reference, steps=400, seed=3, info_keys=info_keys)
    assert counts["terminated"] >= 5  # random actions topple Humanoid within ~25 steps: resets were exercised


def test_truncates_at_the_time_limit():
    """Without termination an episode runs into TimeLimit's 1000 steps, and the next one starts from a reset."""
    kwargs = {"terminate_when_unhealthy": False, **STATE_ONLY}
    counts = _compare(make_env("humanoid", **kwargs), make_env("humanoid", lean=False, **kwargs), steps=1010, seed=1)
    assert counts == {"terminated": 0, "truncated": 1}


def test_state_only_task_physics_state_and_changes():
    """``humanoid_state`` (45-number obs), the physics state in info, and a stage-3 mass change on the torso."""
    change = {"mass": {"scale": 1.3}}
    lean = make_env("humanoid_state", change=change, physics_state=True)
    reference = make_env("humanoid_state", change=change, physics_state=True, lean=False)
    assert lean.observation_space.shape == (45,)
    assert lean.unwrapped.observation_structure == reference.unwrapped.observation_structure
    counts = _compare(lean, reference, steps=150, seed=7, info_keys=("qpos", "qvel", "ctrl"))
    assert counts["terminated"] >= 2


def test_vector_rollouts_equal():
    batches = []
    for lean in (True, False):
        rollout = VectorRollout("humanoid", 2, seed=5, physics_state=True, lean=lean)
        batch, stats = rollout.collect(random_policy(rollout.single_action_space, 0), 60)
        batches.append((batch, stats))
        rollout.close()
    (a, stats_a), (b, stats_b) = batches
    assert stats_a.lengths == stats_b.lengths and stats_a.terminations == stats_b.terminations > 0
    for key in b:
        np.testing.assert_allclose(a[key], b[key], rtol=0, atol=1e-5 if key != "reward" else 1e-4, err_msg=key)
        assert a[key].dtype == b[key].dtype


def test_step_before_reset_and_unsupported_kwargs():
    with pytest.raises(gym.error.ResetNeeded):
        FastHumanoid().step(np.zeros(17))
    assert lean_version("Humanoid-v5", {"render_mode": "rgb_array"}) is None  # falls back to gym.make
    assert lean_version("Walker2d-v5", {}) is None
    assert lean_version("Humanoid-v5", STATE_ONLY) is FastHumanoid
