"""LIFT's kind of pretraining task on Walker2d: the policy observes a forward-velocity command v* drawn per episode from a
declared training range and the reward tracks it (``changes.TargetVelocity``), while friction and link masses are
redrawn every episode within LIFT's ranges (``domain_randomization``). Stage 3 then asks for a command outside the
range (LIFT's own change) or changes the rigid body beyond what was randomised.

Registered (``envs.control.task_table``): ``gymnasium.make("orrery/Walker2dCommandDR-v0")`` builds
``walker2d_command_env()``, i.e. ``make_env("walker2d", lift_kind_pretrain())``; the experiment config is
``experiment=lift_pretrain env=walker2d_command`` (``configs/env_preset/lift_pretrain_walker2d_command.yaml``).
"""
from __future__ import annotations

import gymnasium as gym

from envs.control.domain_randomization import lift_randomization

COMMAND_RANGE = (0.0, 1.5)  # m/s: the Walker2d start model's declared training range of forward-velocity commands
COMMAND_SIGMA = 0.5
REGISTERED_ID = "orrery/Walker2dCommandDR-v0"


def lift_kind_pretrain(command_range: tuple[float, float] = COMMAND_RANGE) -> dict:
    """The pretraining env's change spec: the command first (its observation, its reward), then the randomisation."""
    return {"target_velocity": {"command_range": list(command_range), "sigma": COMMAND_SIGMA},
            "randomize": lift_randomization()}


def walker2d_command_env(command_range: tuple[float, float] = COMMAND_RANGE, randomize: bool = True) -> gym.Env:
    """The LIFT-kind Walker2d pretraining env (the registered id's entry point)."""
    from envs.control.tasks import make_env
    spec = lift_kind_pretrain(command_range)
    if not randomize:
        spec.pop("randomize")
    return make_env("walker2d", spec)
