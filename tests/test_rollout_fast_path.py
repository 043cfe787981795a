"""The rollout's direct path (a batch of actions rescaled at once, the lean env stepped without wrappers and info
dicts) returns exactly what stepping every env through its wrappers returns: observations, rewards, episode ends,
physics state, episode statistics, bit for bit, over episodes that end and reset."""
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
            np.testing.assert_array_equal(batch_a[key], batch_b[key], err_msg=key)
        assert stats_a == stats_b and len(stats_a.returns) > 0, "some episodes must end and reset"


def test_a_wrapper_that_changes_steps_takes_the_full_path():
    rollout = VectorRollout("humanoid", 2, seed=0, change={"name": "target_velocity"})
    assert rollout.direct is None
