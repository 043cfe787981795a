"""Vectorised rollouts store only real transitions (the gymnasium >= 1.0 autoreset trap), and the pool's env
rollouts equal a direct gymnasium loop for the same seed."""
from __future__ import annotations

import gymnasium as gym
import numpy as np

from envs.control.rollout import VectorRollout, random_policy


def _fixed_actions(n_envs: int, steps: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, size=(steps, n_envs, dim)).astype(np.float32)


def test_no_fake_autoreset_transitions_and_true_final_obs():
    """InvertedPendulum falls within a few steps under big random actions, so many episodes end here."""
    n, steps = 3, 60
    actions = _fixed_actions(n, steps, 1, 0)
    it = iter(actions)
    rollout = VectorRollout("inverted_pendulum", n, seed=11, physics_state=True)
    batch, stats = rollout.collect(lambda obs: next(it), steps)
    assert len(batch["reward"]) == n * steps, "one stored transition per env step, none for resets"
    assert stats.terminations >= 5
    # replay each env alone with plain gymnasium and the same seed/actions: identical transitions
    for e in range(n):
        env = gym.wrappers.RescaleAction(gym.make("InvertedPendulum-v5"), -1.0, 1.0)
        obs, _ = env.reset(seed=11 + e)
        rows = slice(e, None, n)
        for t, (o, a, r, nxt, term) in enumerate(zip(batch["obs"][rows], batch["action"][rows], batch["reward"][rows],
                                                      batch["next_obs"][rows], batch["terminated"][rows])):
            np.testing.assert_allclose(o, obs, atol=1e-6)
            np.testing.assert_array_equal(a, actions[t, e])
            obs2, r2, term2, trunc2, _ = env.step(a)
            assert r == r2 and bool(term) == term2
            np.testing.assert_allclose(nxt, obs2, atol=1e-6)  # the true final observation, not the reset one
            obs = env.reset()[0] if (term2 or trunc2) else obs2
        # physics state of the terminal transition is the terminal state too
    # ctrl is the simulator's control: the policy's [-1, 1] action mapped onto InvertedPendulum's [-3, 3]
    np.testing.assert_allclose(batch["ctrl"][:, 0], 3.0 * batch["action"][:, 0], atol=1e-5)
    terminal = np.flatnonzero(batch["terminated"])
    assert np.allclose(batch["next_qpos"][terminal][:, 1], batch["next_obs"][terminal][:, 1], atol=1e-6)


def test_rollout_continues_episodes_between_calls():
    r = VectorRollout("pendulum", 2, seed=3)
    pol = random_policy(r.single_action_space, 0)
    a, _ = r.collect(pol, 5)
    b, _ = r.collect(pol, 5)
    np.testing.assert_allclose(b["obs"][:2], a["next_obs"][-2:])


def test_pool_rollouts_equal_a_direct_loop(pool_factory):
    pool = pool_factory(num_workers=2)
    cfg = {"task": "half_cheetah", "num_envs": 2}
    out = pool.map("env", [{"reset_seed": 5, "steps": 20}, {"reset_seed": 6, "steps": 20}], config=cfg)
    for seed, result in zip((5, 6), out):
        direct = VectorRollout("half_cheetah", 2, seed=seed)
        batch, _ = direct.collect(random_policy(direct.single_action_space, seed + 7919), 20)
        for key in ("obs", "action", "reward", "next_obs"):
            np.testing.assert_array_equal(result["transitions"][key], batch[key])
