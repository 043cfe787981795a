"""The rollout's direct path (a batch of actions rescaled at once, the lean envs stepped as one batch without wrappers
and info dicts) returns what stepping every env through its wrappers returns, over episodes that end and reset:
observations, actions, episode ends and physics state bit for bit; rewards and returns to rounding (the batch sums
mass centres and squared norms with numpy's batched kernels)."""
from __future__ import annotations

import numpy as np
import pytest

from envs.control.rollout import VectorRollout, random_policy


@pytest.mark.parametrize("task, physics_state, change", [
    ("humanoid", False, None),
    ("humanoid_state", True, None),
    ("humanoid", True, {"name": "mass", "scale": 1.4}),
])
def test_direct_path_equals_the_wrapped_path(task, physics_state, change):
    direct = VectorRollout(task, 3, seed=5, change=change, physics_state=physics_state)
    wrapped = VectorRollout(task, 3, seed=5, change=change, physics_state=physics_state)
    assert direct.direct is not None, "the lean humanoid should take the direct path"
    wrapped.direct = None
    space = direct.single_action_space
    a, b = random_policy(space, 1), random_policy(space, 1)
    for _ in range(3):  # the envs persist between calls, mid-episode
        batch_a, stats_a = direct.collect(a, 60)
        batch_b, stats_b = wrapped.collect(b, 60)
        assert batch_a.keys() == batch_b.keys()
        for key in batch_a:
            if key == "reward":
                np.testing.assert_allclose(batch_a[key], batch_b[key], rtol=1e-6, atol=1e-6, err_msg=key)  # float32
            else:
                np.testing.assert_array_equal(batch_a[key], batch_b[key], err_msg=key)
        np.testing.assert_allclose(stats_a.returns, stats_b.returns, rtol=1e-12)
        assert (stats_a.lengths, stats_a.terminations) == (stats_b.lengths, stats_b.terminations)
        assert len(stats_a.returns) > 0, "some episodes must end and reset"


def test_a_wrapper_that_changes_steps_takes_the_full_path():
    rollout = VectorRollout("humanoid", 2, seed=0, change={"name": "target_velocity"})
    assert rollout.direct is None
